"""On Citus: distribute every per-user table by user_id, colocated; tenant-wide ones replicated.

Every read and write of memsvc names one user, so with all per-user tables hash-distributed by
``user_id`` in one colocation group, one user's memories, messages, episodes, topics, outbox
jobs, versions and change log live on one shard group: a statement that filters on the user
is a single-shard router query, and joins and foreign keys between these tables stay on that
shard group. Tables keyed by tenant only (API keys, tenant settings) are small and read on
every call: reference tables, replicated to every node, so joins with them stay local too.

This runs after the SQL migrations, only when the database has the ``citus`` extension (see
migrate.migrate); a single PostgreSQL never sees any of it. Each step is idempotent, so a
start cut off half-way finishes on the next one. Which table is which is a plan in code, and
``unclassified`` names any table a later migration adds without saying where it goes.
"""

from __future__ import annotations

import logging

from memsvc.errors import MemsvcError
from memsvc.storage.citus_triggers import ROW_TRIGGERS_SQL
from memsvc.storage.connection import Connection

log = logging.getLogger(__name__)

DISTRIBUTION_COLUMN = "user_id"


class CitusPlanError(MemsvcError):
    """A table of memsvc's schema is in no list of the distribution plan."""


# Hash-distributed by user_id, all colocated with the first. Parents come before the tables
# whose foreign keys point at them (episode_memories -> episodes, memories; ...): Citus only
# accepts a foreign key to a table that is already distributed.
DISTRIBUTED: tuple[str, ...] = (
    "memories",
    "messages",
    "episodes",
    "topics",
    "episode_memories",
    "topic_episodes",
    "ingest_outbox",
    "extraction_runs",
    "quota_counters",
    "scope_versions",
    "memory_references",
    "core_block_revisions",
    "memory_edits",
    "memory_changes",
    "memory_change_horizons",
)
# Keyed by tenant only and read on every call (authentication, governance settings).
REFERENCE: tuple[str, ...] = ("api_keys", "tenant_settings")
# Read by migrate() alone, always on the coordinator it connects to.
COORDINATOR_ONLY: tuple[str, ...] = ("schema_migrations", "memsvc_meta")

# For the sessions opened after it (the pool is opened after the migrations).
_PROPAGATE_SET_LOCAL = """
DO $$
BEGIN
    EXECUTE format('ALTER DATABASE %I SET citus.propagate_set_commands = local',
                   current_database());
END $$;
"""


async def has_citus(conn: Connection) -> bool:
    """Whether the database has the citus extension (then migrate() distributes the tables)."""
    found: bool = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"
    )
    return found


async def unclassified(conn: Connection) -> list[str]:
    """memsvc's tables in no list above: a migration added a table and the plan misses it."""
    known = set(DISTRIBUTED) | set(REFERENCE) | set(COORDINATOR_ONLY)
    rows = await conn.fetch(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')"
        # Citus' shell tables of shards on the coordinator itself, if it holds any.
        " AND c.relname !~ '_[0-9]+$' ORDER BY 1"
    )
    return [r["relname"] for r in rows if r["relname"] not in known]


async def _citus_tables(conn: Connection) -> dict[str, str]:
    """Table name -> Citus' kind ('distributed', 'reference') of the tables already done."""
    rows = await conn.fetch(
        "SELECT table_name::text AS name, citus_table_type AS kind FROM citus_tables"
    )
    return {r["name"]: r["kind"] for r in rows}


async def distribute(conn: Connection) -> list[str]:
    """Make the per-user tables distributed and the tenant-wide ones reference tables;
    return the tables changed now (none when already done). Call under migrate's lock."""
    missing = await unclassified(conn)
    if missing:
        # A table left local would still work through the coordinator, but joins with it
        # and foreign keys to it would fail at run time: refuse now, loudly.
        raise CitusPlanError(
            f"tables not in memsvc.storage.citus's plan: {', '.join(missing)};"
            " add each to DISTRIBUTED, REFERENCE or COORDINATOR_ONLY"
        )
    # memsvc's sessions forward their SET LOCAL to the workers in the transaction: the
    # change-log triggers there read the delete kind (storage.changes.deletes_recorded_as).
    await conn.execute(_PROPAGATE_SET_LOCAL)
    done = await _citus_tables(conn)
    changed: list[str] = []
    # The change log and reference cleanup are written by triggers; Citus copies them to the
    # shards only when told to (storage.citus_triggers says how they differ there).
    await conn.execute("SET citus.enable_unsafe_triggers = on")
    try:
        if any(table not in done for table in DISTRIBUTED):
            # Before distributing: create_distributed_table copies the triggers to the shards.
            await conn.execute(ROW_TRIGGERS_SQL)
        for table in DISTRIBUTED:
            if table in done:
                continue
            anchor = DISTRIBUTED[0]
            await conn.execute(
                "SELECT create_distributed_table($1::regclass, $2, colocate_with => $3)",
                table,
                DISTRIBUTION_COLUMN,
                "none" if table == anchor else anchor,
            )
            changed.append(table)
        for table in REFERENCE:
            if table not in done:
                await conn.execute("SELECT create_reference_table($1::regclass)", table)
                changed.append(table)
        # Rows that existed before (a single PostgreSQL turned into a coordinator) were copied
        # into the shards; their local copies are dead weight. Children first (foreign keys).
        for table in reversed(changed):
            await conn.execute("SELECT truncate_local_data_after_distributing_table($1)", table)
    finally:
        await conn.execute("RESET citus.enable_unsafe_triggers")
    for table in changed:
        log.info(
            "citus: %s is now a %s table",
            table,
            "reference" if table in REFERENCE else "distributed",
        )
    return changed
