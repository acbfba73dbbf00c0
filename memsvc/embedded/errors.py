"""The one error raised when an embedded server cannot be located, started or stopped."""


class EmbeddedServerError(RuntimeError):
    """An embedded PostgreSQL or Valkey server failed; the message carries the log tail."""
