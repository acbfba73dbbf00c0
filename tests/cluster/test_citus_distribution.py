"""Migrations on a Citus coordinator: every per-user table distributed by user_id in one
colocation group, the tenant-wide ones reference tables, and a second run changes nothing."""

from __future__ import annotations

import asyncpg
import pytest

from memsvc.config import Settings
from memsvc.server.app import MemsvcServer
from memsvc.storage import citus
from memsvc.storage.citus_triggers import ROW_TRIGGERS
from memsvc.storage.migrate import load_migrations, migrate


@pytest.fixture
async def conn(settings: Settings, server: MemsvcServer) -> asyncpg.Connection:  # type: ignore[misc]
    # `server`: started, so its migrations have run on the coordinator.
    connection = await asyncpg.connect(settings.pg_dsn)
    try:
        yield connection
    finally:
        await connection.close()


async def test_all_migrations_applied(conn: asyncpg.Connection) -> None:
    versions = [r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")]
    assert sorted(versions) == [m.version for m in load_migrations(384)]
    assert await citus.has_citus(conn)


async def test_every_table_is_where_the_plan_puts_it(conn: asyncpg.Connection) -> None:
    rows = await conn.fetch(
        "SELECT table_name::text AS name, citus_table_type AS kind, distribution_column AS col,"
        " colocation_id FROM citus_tables"
    )
    found = {r["name"]: r for r in rows}
    assert {n for n, r in found.items() if r["kind"] == "distributed"} == set(citus.DISTRIBUTED)
    assert {n for n, r in found.items() if r["kind"] == "reference"} == set(citus.REFERENCE)
    assert {found[n]["col"] for n in citus.DISTRIBUTED} == {"user_id"}
    # One colocation group: one user's rows of every table are on one shard group.
    assert len({found[n]["colocation_id"] for n in citus.DISTRIBUTED}) == 1
    assert await citus.unclassified(conn) == []
    assert not set(found) & set(citus.COORDINATOR_ONLY)


async def test_one_users_rows_share_a_shard_group(conn: asyncpg.Connection) -> None:
    """The same user maps to colocated shards on the same node in every distributed table."""
    rows = await conn.fetch(
        "SELECT t AS name, s.nodeport FROM unnest($1::text[]) AS t,"
        " LATERAL (SELECT nodeport FROM citus_shards"
        "   WHERE table_name = t::regclass"
        "     AND shardid = get_shard_id_for_distribution_column(t::regclass, 'alice')) AS s",
        list(citus.DISTRIBUTED),
    )
    assert len(rows) == len(citus.DISTRIBUTED)
    assert len({r["nodeport"] for r in rows}) == 1


async def test_shards_carry_the_row_triggers(conn: asyncpg.Connection) -> None:
    """The change log's row triggers exist on the shards (Citus copied them when
    distributing), and no trigger that notifies is left there."""
    for table, triggers in ROW_TRIGGERS.items():
        rows = await conn.fetch(
            "SELECT success, result FROM run_command_on_shards($1::regclass,"
            # A shard's trigger is named after the table's with the shard id appended.
            " $$SELECT string_agg(regexp_replace(tgname::text, '_[0-9]+$', ''), ','"
            "   ORDER BY tgname) FROM pg_trigger"
            "   WHERE tgrelid = '%s'::regclass AND NOT tgisinternal$$)",
            table,
        )
        assert rows and all(r["success"] for r in rows), rows
        assert {r["result"] or "" for r in rows} == {",".join(sorted(triggers))}, table


async def test_migrating_again_changes_nothing(conn: asyncpg.Connection) -> None:
    assert await migrate(conn, embedding_dim=384) == []
    assert await citus.distribute(conn) == []


async def test_idempotency_keys_are_unique_per_user(conn: asyncpg.Connection) -> None:
    """Citus needs user_id in every unique constraint: the outbox key is unique per user."""
    columns = await conn.fetchval(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = 'ingest_outbox'::regclass AND contype = 'u'"
    )
    assert columns == "UNIQUE (tenant_id, user_id, idempotency_key)"


async def test_a_table_missing_from_the_plan_stops_the_migration(
    conn: asyncpg.Connection,
) -> None:
    """A migration that adds a table must say where it goes: left local, its joins with the
    distributed tables would fail only at run time."""
    await conn.execute("CREATE TABLE memsvc_unplanned (tenant_id text, user_id text)")
    try:
        with pytest.raises(citus.CitusPlanError, match="memsvc_unplanned"):
            await citus.distribute(conn)
    finally:
        await conn.execute("DROP TABLE memsvc_unplanned")


async def test_sessions_forward_their_set_local_to_the_workers(conn: asyncpg.Connection) -> None:
    """The delete kind the change-log triggers read on the workers is a SET LOCAL of the
    coordinator's session: memsvc's database makes Citus forward those."""
    assert await conn.fetchval("SHOW citus.propagate_set_commands") == "local"
