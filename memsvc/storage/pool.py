"""The asyncpg pool: pgvector codec on every connection, bounded timeouts everywhere."""

from __future__ import annotations

import asyncpg
from pgvector.asyncpg import register_vector

from memsvc.config import Settings
from memsvc.storage.migrate import migrate


async def _init_connection(conn: asyncpg.Connection) -> None:
    await register_vector(conn)


async def connect_and_migrate(settings: Settings) -> asyncpg.Pool:
    """Apply migrations over one connection, then open the pool the service uses."""
    assert settings.pg_dsn is not None, "pg_dsn must be resolved before connecting"
    conn = await asyncpg.connect(settings.pg_dsn, timeout=10)
    try:
        await migrate(conn, embedding_dim=settings.embedding_dim)
    finally:
        await conn.close()
    pool: asyncpg.Pool = await asyncpg.create_pool(
        settings.pg_dsn,
        min_size=settings.pg_pool_min,
        max_size=settings.pg_pool_max,
        command_timeout=settings.pg_command_timeout_ms / 1000,
        init=_init_connection,
        timeout=10,
    )
    return pool
