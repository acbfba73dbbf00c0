"""Erasure of everything stored about one user of one tenant, in every table."""

from __future__ import annotations

import asyncpg

# Children before parents is not needed (foreign keys cascade), but listing every table
# keyed by user makes "nothing left anywhere" a property a test can check table by table.
USER_TABLES = (
    "episode_memories",
    "topic_episodes",
    "memories",
    "episodes",
    "topics",
    "messages",
    "ingest_outbox",
    "quota_counters",
    "scope_versions",
)


async def erase_user(conn: asyncpg.Connection, tenant_id: str, user_id: str) -> int:
    """Delete every row about the user; returns how many memory rows went. Call in a transaction."""
    deleted_memories = 0
    for table in USER_TABLES:
        status: str = await conn.execute(
            f"DELETE FROM {table} WHERE tenant_id = $1 AND user_id = $2", tenant_id, user_id
        )
        if table == "memories":
            deleted_memories = int(status.split()[-1])
    return deleted_memories
