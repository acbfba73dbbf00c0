"""Versioned SQL migrations, applied in order under an advisory lock (safe with many starters)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import resources

from memsvc.errors import MemsvcError
from memsvc.storage import citus
from memsvc.storage.connection import Connection

log = logging.getLogger(__name__)

# Any constant works; it only has to be the same for every memsvc process.
_ADVISORY_LOCK_KEY = 0x6D656D737663


class MigrationError(MemsvcError):
    """The database schema cannot be brought to the version this memsvc needs."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations(embedding_dim: int) -> list[Migration]:
    """Every migrations/NNNN_name.sql file, in version order, with its parameters filled in."""
    found: list[Migration] = []
    for entry in resources.files("memsvc.storage").joinpath("migrations").iterdir():
        if not entry.name.endswith(".sql"):
            continue
        version = int(entry.name.split("_", 1)[0])
        # str.replace, not str.format: the SQL is full of '{}' array literals.
        sql = entry.read_text(encoding="utf-8").replace("{embedding_dim}", str(embedding_dim))
        found.append(Migration(version, entry.name, sql))
    return sorted(found, key=lambda m: m.version)


async def migrate(conn: Connection, *, embedding_dim: int) -> list[str]:
    """Apply the missing migrations; return the names applied. Idempotent.

    On a Citus coordinator (the citus extension exists) the tables are then distributed by
    user, also idempotently (storage.citus); on a single PostgreSQL nothing more happens.
    """
    applied_now: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _ADVISORY_LOCK_KEY)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        on_citus = await citus.has_citus(conn)
        if on_citus:
            # A later migration's CREATE TRIGGER on a distributed table needs it.
            await conn.execute("SET citus.enable_unsafe_triggers = on")
        try:
            for migration in load_migrations(embedding_dim):
                if migration.version in done:
                    continue
                async with conn.transaction():
                    await conn.execute(migration.sql)
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                        migration.version,
                        migration.name,
                    )
                log.info("applied migration %s", migration.name)
                applied_now.append(migration.name)
        finally:
            if on_citus:
                await conn.execute("RESET citus.enable_unsafe_triggers")
        if on_citus:
            await citus.distribute(conn)
        stored = await conn.fetchval("SELECT value FROM memsvc_meta WHERE key = 'embedding_dim'")
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _ADVISORY_LOCK_KEY)
    if stored is not None and int(stored) != embedding_dim:
        raise MigrationError(
            f"the database stores {stored}-dimensional embeddings but the configured embedder "
            f"produces {embedding_dim}; use a matching embedder or a fresh database"
        )
    return applied_now
