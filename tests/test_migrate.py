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


async def test_message_speakers_migration_rebuilds_what_was_indexed(
    settings: Settings, server
) -> None:  # type: ignore[no-untyped-def]
    """0013 on a database with messages: the context index loses the dates and gains the
    speakers' names; vectors of name-like senders become stale (the reconciler re-embeds)."""
    admin = await asyncpg.connect(settings.pg_dsn)
    name = "memsvc_migrate_0013"
    await admin.execute(f"DROP DATABASE IF EXISTS {name}")
    await admin.execute(f"CREATE DATABASE {name}")
    dsn = settings.pg_dsn.rsplit("/", 1)[0] + f"/{name}"
    conn = await asyncpg.connect(dsn)
    try:
        migrations = load_migrations(384)
        for m in migrations:
            if m.version < 13:
                await conn.execute(m.sql)
        await conn.execute(
            "INSERT INTO messages (tenant_id, user_id, persona_id, agent_id, session_id,"
            " message_id, ingest_id, sender_id, role, text, sent_at, embedding,"
            " embedding_model, embedding_state, context_tsv)"
            " SELECT 't', 'u', '', '', 's', m.id, gen_random_uuid(), m.sender, 'user', m.text,"
            " timestamptz '2023-05-08 13:56:00+00' + m.n * interval '1 second',"
            " array_fill(0.1, ARRAY[384])::vector, 'model', 'ok',"
            " to_tsvector('english', m.text || ' 8 May 2023')"
            " FROM (VALUES (1, 'a', 'Caroline', 'I went to the support group'),"
            "              (2, 'b', 'u_81f3', 'That sounds great'),"
            "              (3, 'c', 'Caroline', 'It was powerful')) AS m(n, id, sender, text)"
        )
        await conn.execute(next(m.sql for m in migrations if m.version == 13))
        rows = {
            r["message_id"]: r
            for r in await conn.fetch(
                "SELECT message_id, sender_name, embedding_state, context_tsv::text AS ctx"
                " FROM messages"
            )
        }
    finally:
        await conn.close()
        await admin.execute(f"DROP DATABASE IF EXISTS {name}")
        await admin.close()
    assert {k: r["embedding_state"] for k, r in rows.items()} == {
        "a": "stale",
        "b": "ok",
        "c": "stale",
    }
    assert all(r["sender_name"] == "" for r in rows.values())
    for r in rows.values():
        assert "'may'" not in r["ctx"] and "'2023'" not in r["ctx"], r["ctx"]
    # b's own words weigh A, its neighbours' (Caroline's units) B; b has no name of its own.
    assert "'sound':2A" in rows["b"]["ctx"] and "'carolin':" in rows["b"]["ctx"]
    assert "'support':" in rows["c"]["ctx"] and "'group':" in rows["c"]["ctx"]
    assert "A" in rows["a"]["ctx"].split("'carolin':")[1].split(" ")[0]
