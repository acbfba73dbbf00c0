"""SQL of UpdateMemory: change one memory version in place and keep the edit as its history.

An edit row belongs to the version it changed (memory_edits references memories with ON
DELETE CASCADE): whatever deletes the version (Forget, erasure, expiry, a session's end)
deletes its edits with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

import asyncpg
import orjson

from memsvc.storage.connection import Connection
from memsvc.storage.memories import COLUMNS, record_from_row
from memsvc.storage.model import MemoryEdit, MemoryRecord, Sharing

_EDIT_COLUMNS = "edit_id, memory_id, edited_at, fields, before, after, reason"


def _edit_from_row(row: asyncpg.Record) -> MemoryEdit:
    return MemoryEdit(
        edit_id=row["edit_id"],
        memory_id=row["memory_id"],
        edited_at=row["edited_at"],
        fields=tuple(row["fields"]),
        before=dict(orjson.loads(row["before"])),
        after=dict(orjson.loads(row["after"])),
        reason=row["reason"],
    )


async def update_in_place(
    conn: Connection,
    memory: MemoryRecord,
    *,
    pinned: bool,
    category: str,
    role: str,
    sharing: Sharing,
    retention_policy: str,
    confidence: float,
    rearm_expiry: bool,
    expires_in_s: float | None,
    confirmed: bool,
    into_core: bool,
) -> MemoryRecord:
    """Give one version these values (its id, content and validity stay) and stamp
    updated_at. ``rearm_expiry``: expires_at becomes now + ``expires_in_s`` (None: never);
    ``confirmed``: the decay clock restarts (last_reinforced_at = now); ``into_core``: it
    joined the core block, so it is no longer a demoted memory."""
    row = await conn.fetchrow(
        f"""
        UPDATE memories SET
            pinned = $4, category = $5, role = $6,
            shared_all_agents = $7, shared_all_personas = $8,
            retention_policy = $9,
            expires_at = CASE WHEN $10 THEN now() + $11::float8 * interval '1 second'
                              ELSE expires_at END,
            confidence = $12,
            last_reinforced_at = CASE WHEN $13 THEN now() ELSE last_reinforced_at END,
            demoted_at = CASE WHEN $14 THEN NULL ELSE demoted_at END,
            updated_at = now()
        WHERE tenant_id = $1 AND user_id = $2 AND memory_id = $3
        RETURNING {COLUMNS}
        """,
        memory.scope.tenant_id,
        memory.scope.user_id,
        memory.memory_id,
        pinned,
        category,
        role,
        sharing.all_agents,
        sharing.all_personas,
        retention_policy,
        rearm_expiry,
        expires_in_s,
        confidence,
        confirmed,
        into_core,
    )
    assert row is not None, "the caller holds the row lock"
    return record_from_row(row)


async def insert_edit(
    conn: Connection,
    memory: MemoryRecord,
    *,
    fields: Sequence[str],
    before: Mapping[str, str],
    after: Mapping[str, str],
    reason: str,
) -> MemoryEdit:
    """Record one edit of the version (at the transaction's now(), as its updated_at)."""
    row = await conn.fetchrow(
        "INSERT INTO memory_edits"
        " (tenant_id, user_id, edit_id, memory_id, fields, before, after, reason)"
        " VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8)"
        f" RETURNING {_EDIT_COLUMNS}",
        memory.scope.tenant_id,
        memory.scope.user_id,
        uuid.uuid4(),
        memory.memory_id,
        list(fields),
        orjson.dumps(dict(before)).decode(),
        orjson.dumps(dict(after)).decode(),
        reason,
    )
    assert row is not None
    return _edit_from_row(row)


async def edits_of(
    conn: Connection, tenant_id: str, user_id: str, memory_ids: Sequence[uuid.UUID]
) -> list[MemoryEdit]:
    """The edits of these versions, oldest first."""
    rows = await conn.fetch(
        f"SELECT {_EDIT_COLUMNS} FROM memory_edits"
        " WHERE tenant_id = $1 AND user_id = $2 AND memory_id = ANY($3::uuid[])"
        " ORDER BY edited_at, edit_id",
        tenant_id,
        user_id,
        list(memory_ids),
    )
    return [_edit_from_row(r) for r in rows]


# The edits of the row `m` as one JSON array, oldest first (ExportMemories' memory records).
# The user is the statement's $2 (export's statements are all of one user), not m.user_id:
# on Citus a subquery correlated only to the row is planned over every shard.
EDITS_JSON_SQL = """coalesce((
    SELECT jsonb_agg(jsonb_build_object(
               'edit_id', x.edit_id, 'edited_at', x.edited_at, 'fields', to_jsonb(x.fields),
               'before', x.before, 'after', x.after, 'reason', x.reason)
           ORDER BY x.edited_at, x.edit_id)
    FROM memory_edits x
    WHERE x.tenant_id = m.tenant_id AND x.user_id = $2 AND x.memory_id = m.memory_id
), '[]'::jsonb)"""
