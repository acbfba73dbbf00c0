"""Run the embedded PostgreSQL and Valkey together under one data folder, stopped in reverse."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from memsvc.embedded.postgres import EmbeddedPostgres
from memsvc.embedded.process import Deadline
from memsvc.embedded.valkey import EmbeddedValkey


class EmbeddedStack:
    """PostgreSQL then Valkey, both under `data_dir`; a context manager yielding (dsn, url).

    Nothing is registered globally (no atexit, no signal handlers): whoever enters the
    context, or calls start(), must exit it or call stop().
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        postgres_port: int | None = None,
        valkey_port: int | None = None,
        host: str = "127.0.0.1",
        durable: bool = True,
    ) -> None:
        data_dir = Path(data_dir)
        self._postgres = EmbeddedPostgres(data_dir, port=postgres_port, host=host, durable=durable)
        self._valkey = EmbeddedValkey(data_dir, port=valkey_port, host=host, persist=durable)

    @property
    def postgres(self) -> EmbeddedPostgres:
        """The PostgreSQL server."""
        return self._postgres

    @property
    def valkey(self) -> EmbeddedValkey:
        """The Valkey server."""
        return self._valkey

    def start(self, timeout_s: float = 60.0) -> tuple[str, str]:
        """Start both within one budget; return (postgres DSN, redis URL)."""
        deadline = Deadline(timeout_s)
        dsn = self._postgres.start(deadline.remaining())
        try:
            url = self._valkey.start(deadline.remaining())
        except BaseException:
            self._postgres.stop()
            raise
        return dsn, url

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop Valkey, then PostgreSQL, even if stopping Valkey fails."""
        try:
            self._valkey.stop(timeout_s)
        finally:
            self._postgres.stop(timeout_s)

    def __enter__(self) -> tuple[str, str]:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
