"""Run real PostgreSQL (pgvector, pg_trgm) and Valkey servers from the embedded wheels."""

from memsvc.embedded.errors import EmbeddedServerError
from memsvc.embedded.postgres import EmbeddedPostgres
from memsvc.embedded.stack import EmbeddedStack
from memsvc.embedded.valkey import EmbeddedValkey

__all__ = [
    "EmbeddedPostgres",
    "EmbeddedServerError",
    "EmbeddedStack",
    "EmbeddedValkey",
]
