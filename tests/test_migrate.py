"""Migrations: idempotent, concurrent-safe, and refuse a mismatched embedding dimension."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from memsvc.config import Settings
from memsvc.storage.migrate import MigrationError, load_migrations, migrate


async def test_migrations_are_idempotent_and_concurrent_safe(settings: Settings, server) -> None:  # type: ignore[no-untyped-def]
    conns = [await asyncpg.connect(settings.pg_dsn) for _ in range(3)]
    try:
        results = await asyncio.gather(*(migrate(c, embedding_dim=384) for c in conns))
        assert results == [[], [], []]
        versions = await conns[0].fetch("SELECT version FROM schema_migrations ORDER BY version")
        assert [r["version"] for r in versions] == [m.version for m in load_migrations(384)]
    finally:
        for c in conns:
            await c.close()


async def test_dimension_mismatch_is_refused(settings: Settings, server) -> None:  # type: ignore[no-untyped-def]
    conn = await asyncpg.connect(settings.pg_dsn)
    try:
        with pytest.raises(MigrationError, match="384-dimensional"):
            await migrate(conn, embedding_dim=1536)
    finally:
        await conn.close()


def test_dimension_is_templated() -> None:
    sql = load_migrations(768)[0].sql
    assert "vector(768)" in sql and "{embedding_dim}" not in sql
