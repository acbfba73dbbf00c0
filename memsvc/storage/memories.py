"""SQL for the memories table. Every statement filters on tenant and user first."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg
import numpy as np

from memsvc.storage import retention
from memsvc.storage.conditions import EXACT_SCOPE, NOT_EXPIRED, VISIBLE, not_expired
from memsvc.storage.connection import Connection
from memsvc.storage.model import ListQuery, MemoryRecord, NewMemory, Page, Scope, Sharing
from memsvc.storage.projections import projection
from memsvc.storage.references import last_referenced_sql

_COLUMNS_WITH = """
    tenant_id, user_id, persona_id, agent_id, shared_all_agents, shared_all_personas,
    memory_id, lineage_id, content, subject, predicate, object, category, role, confidence,
    reinforced_count, pinned, valid_from, invalid_at, recorded_at, supersedes_id,
    superseded_by_id, source_message_ids, session_id, origin, correction_reason, status,
    last_reinforced_at, {referenced} AS last_referenced_at, demoted_at,
    demoted_role, retention_policy, expires_at, updated_at
"""
# For statements whose rows are all of the user in $2 (every one of this module, and those
# of edits and core).
_COLUMNS = _COLUMNS_WITH.format(referenced=last_referenced_sql("memories", user_id="$2"))
# The hot reads (Recall, Prefetch) leave last_referenced_at out: they are the reads that set
# it, and probing memory_references while its flush writes cost them tail latency.
HOT_COLUMNS = _COLUMNS_WITH.format(referenced="NULL::timestamptz")


# The same columns for other read modules (Recall, Prefetch) composing their own SQL.
COLUMNS = _COLUMNS


def record_from_row(row: asyncpg.Record) -> MemoryRecord:
    """Turn a row selected with _COLUMNS into a MemoryRecord."""
    return MemoryRecord(
        scope=Scope.from_row(row),
        memory_id=row["memory_id"],
        lineage_id=row["lineage_id"],
        content=row["content"],
        subject=row["subject"],
        predicate=row["predicate"],
        object=row["object"],
        category=row["category"],
        role=row["role"],
        confidence=float(row["confidence"]),
        reinforced_count=row["reinforced_count"],
        pinned=row["pinned"],
        valid_from=row["valid_from"],
        invalid_at=row["invalid_at"],
        recorded_at=row["recorded_at"],
        supersedes_id=row["supersedes_id"],
        superseded_by_id=row["superseded_by_id"],
        source_message_ids=tuple(row["source_message_ids"]),
        session_id=row["session_id"],
        origin=row["origin"],
        correction_reason=row["correction_reason"],
        status=row["status"],
        sharing=Sharing(row["shared_all_agents"], row["shared_all_personas"]),
        last_reinforced_at=row["last_reinforced_at"],
        last_referenced_at=row["last_referenced_at"],
        demoted_at=row["demoted_at"],
        demoted_role=row["demoted_role"] or "",
        retention_policy=row["retention_policy"],
        expires_at=row["expires_at"],
        updated_at=row["updated_at"],
    )


async def find_active_duplicate(
    conn: Connection, scope: Scope, content_hash: bytes
) -> uuid.UUID | None:
    """The active, unexpired memory with exactly this content in exactly this scope, if any."""
    value: uuid.UUID | None = await conn.fetchval(
        "SELECT memory_id FROM memories WHERE tenant_id = $1 AND user_id = $2"
        " AND persona_id = $3 AND agent_id = $4 AND content_hash = $5 AND invalid_at IS NULL"
        f" AND {NOT_EXPIRED}",
        *scope.key,
        content_hash,
    )
    return value


# The ON CONFLICT assignment every reinforcing insert makes (after its session_id one):
# the other sessions (or '' outside any) the memory was stated in, ForgetSession's
# provenance (storage.sessions).
# Functions, not subqueries (migration 0014): Citus refuses subqueries in an INSERT.
ALSO_STATED_IN_ON_REINFORCE = """also_stated_in = memsvc_sorted_distinct_except(
                memories.also_stated_in || ARRAY[memories.session_id, EXCLUDED.session_id],
                CASE WHEN EXCLUDED.origin = 'explicit'
                    AND EXCLUDED.retention_policy = 'session'
                    THEN EXCLUDED.session_id ELSE memories.session_id END)"""


# What writing an identical active memory does (one unique index per scope and content hash):
# it reinforces the one there. Shared by Remember (insert_or_reinforce) and RememberBatch
# (memory_batches), so the two can never disagree on what a repeat changes.
#
# The time is EXCLUDED.recorded_at (the column default, now()), not now() itself: Citus
# accepts only immutable functions in DO UPDATE; the value is the same, the transaction's start.
ON_DUPLICATE_REINFORCE = f"""
ON CONFLICT (tenant_id, user_id, persona_id, agent_id, content_hash)
    WHERE invalid_at IS NULL
DO UPDATE SET
    reinforced_count = memories.reinforced_count + 1,
    last_reinforced_at = EXCLUDED.recorded_at,
    confidence = greatest(memories.confidence, EXCLUDED.confidence),
    pinned = memories.pinned OR EXCLUDED.pinned,
    -- Pinned again: back in the core block, no longer a demoted one.
    demoted_at = CASE WHEN EXCLUDED.pinned THEN NULL ELSE memories.demoted_at END,
    shared_all_agents = memories.shared_all_agents OR EXCLUDED.shared_all_agents,
    shared_all_personas = memories.shared_all_personas OR EXCLUDED.shared_all_personas,
    source_message_ids = memsvc_sorted_union(
        memories.source_message_ids, EXCLUDED.source_message_ids),
    retention_policy = CASE WHEN EXCLUDED.origin = 'explicit'
        THEN EXCLUDED.retention_policy ELSE memories.retention_policy END,
    expires_at = CASE WHEN EXCLUDED.origin = 'explicit'
        THEN EXCLUDED.expires_at ELSE memories.expires_at END,
    session_id = CASE WHEN EXCLUDED.origin = 'explicit'
        AND EXCLUDED.retention_policy = 'session'
        THEN EXCLUDED.session_id ELSE memories.session_id END,
    {ALSO_STATED_IN_ON_REINFORCE}
WHERE {not_expired("memories", at="EXCLUDED.recorded_at")}
"""


async def insert_or_reinforce(
    conn: Connection,
    scope: Scope,
    memory: NewMemory,
    *,
    content_hash: bytes,
    embedding: np.ndarray | None,
    embedding_model: str,
    memory_id: uuid.UUID | None = None,
    lineage_id: uuid.UUID | None = None,
    supersedes_id: uuid.UUID | None = None,
    correction_reason: str = "",
    ingest_id: uuid.UUID | None = None,
) -> tuple[MemoryRecord, bool]:
    """Insert a memory, or reinforce the identical active one (race-free via the unique index).

    An explicit write (Remember) also sets the retention it asks for on the memory it
    reinforces; extraction reinforcing a memory never changes its retention. An identical
    memory that has expired is not revived: it is deleted and this one starts fresh.
    Returns the row and True when an existing memory was reinforced.
    """
    memory_id = memory_id or uuid.uuid4()
    statement = f"""
        INSERT INTO memories (
            tenant_id, user_id, persona_id, agent_id, shared_all_agents, shared_all_personas,
            memory_id, lineage_id, content, content_hash, subject, predicate, object,
            category, role, confidence, pinned, valid_from, supersedes_id,
            source_message_ids, session_id, origin, correction_reason,
            embedding, embedding_model, embedding_state, ingest_id,
            retention_policy, expires_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                coalesce($18, now()), $19, $20, $21, $22, $23, $24, $25, $26, $27,
                $28, coalesce($29::timestamptz, now() + $30::float8 * interval '1 second'))
        {ON_DUPLICATE_REINFORCE}
        RETURNING {HOT_COLUMNS}, (xmax <> 0) AS reinforced
        """
    args = (
        *scope.key,
        memory.sharing.all_agents,
        memory.sharing.all_personas,
        memory_id,
        lineage_id or memory_id,
        memory.content,
        content_hash,
        memory.subject,
        memory.predicate,
        memory.object,
        memory.category,
        memory.role,
        memory.confidence,
        memory.pinned,
        memory.valid_from,
        supersedes_id,
        list(memory.source_message_ids),
        memory.session_id,
        memory.origin,
        correction_reason,
        *projection(embedding, embedding_model),
        ingest_id,
        memory.retention_policy,
        memory.expires_at,
        memory.expires_in_s,
    )
    row = await conn.fetchrow(statement, *args)
    if row is None:
        # The identical active memory expired (not yet purged): it goes, this one is new.
        await retention.drop_expired_duplicate(conn, scope, content_hash)
        row = await conn.fetchrow(statement, *args)
    assert row is not None
    if row["reinforced"] and memory.origin == "explicit":
        # Every version of a memory shares its retention (its chain expires as one).
        await retention.align_lineage(conn, row["tenant_id"], row["user_id"], row["lineage_id"])
    record = record_from_row(row)
    if row["reinforced"]:
        # Not a subquery in RETURNING: Citus refuses subqueries in an INSERT. A new memory has
        # never been referenced; only a reinforced one needs the probe.
        record = dataclasses.replace(
            record, last_referenced_at=await _last_referenced(conn, scope, record.memory_id)
        )
    return record, bool(row["reinforced"])


async def _last_referenced(conn: Connection, scope: Scope, memory_id: uuid.UUID) -> datetime | None:
    value: datetime | None = await conn.fetchval(
        "SELECT last_referenced_at FROM memory_references"
        " WHERE tenant_id = $1 AND user_id = $2 AND memory_id = $3",
        scope.tenant_id,
        scope.user_id,
        memory_id,
    )
    return value


async def get_visible(conn: Connection, scope: Scope, memory_id: uuid.UUID) -> MemoryRecord | None:
    """One unexpired memory visible from the scope (any status): for reads."""
    return await _get(conn, VISIBLE, scope, memory_id, for_update=False)


async def get_owned(
    conn: Connection, scope: Scope, memory_id: uuid.UUID, *, for_update: bool = False
) -> MemoryRecord | None:
    """One unexpired memory written in exactly the scope (any status), optionally row-locked:
    for changes, since sharing grants reads, never changes by others."""
    return await _get(conn, EXACT_SCOPE, scope, memory_id, for_update=for_update)


async def _get(
    conn: Connection, where: str, scope: Scope, memory_id: uuid.UUID, *, for_update: bool
) -> MemoryRecord | None:
    lock = " FOR UPDATE" if for_update else ""
    row = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM memories WHERE {where} AND memory_id = $5 AND {NOT_EXPIRED}{lock}",
        *scope.key,
        memory_id,
    )
    return record_from_row(row) if row is not None else None


async def mark_superseded(
    conn: Connection,
    old: MemoryRecord,
    new_id: uuid.UUID,
    *,
    invalid_at: datetime | None = None,
) -> None:
    """Close the validity of an old version: it stays for history but stops matching reads.

    `invalid_at`: when it stopped being true (the time the user said so); now by default. It
    is never before the old version's own `valid_from`."""
    # now() outside any COALESCE: Citus refuses non-immutable functions inside one in an
    # UPDATE (it cannot evaluate them on the coordinator first).
    ended = "now()" if invalid_at is None else "$5"
    await conn.execute(
        f"UPDATE memories SET invalid_at = greatest(valid_from, {ended}),"
        " status = 'superseded', superseded_by_id = $4"
        " WHERE tenant_id = $1 AND user_id = $2 AND memory_id = $3",
        old.scope.tenant_id,
        old.scope.user_id,
        old.memory_id,
        new_id,
        *(() if invalid_at is None else (invalid_at,)),
    )


async def lineage(conn: Connection, scope: Scope, lineage_id: uuid.UUID) -> list[MemoryRecord]:
    """Every unexpired version of one memory, oldest first."""
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM memories WHERE {VISIBLE} AND lineage_id = $5"
        f" AND {NOT_EXPIRED} ORDER BY recorded_at, memory_id",
        *scope.key,
        lineage_id,
    )
    return [record_from_row(r) for r in rows]


async def list_page(conn: Connection, scope: Scope, query: ListQuery) -> Page:
    """One page of the scope's memories, newest first, with a keyset cursor."""
    clauses = [VISIBLE, NOT_EXPIRED]
    args: list[Any] = list(scope.key)

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args)}"

    if not query.include_superseded:
        clauses.append("invalid_at IS NULL")
    if query.categories:
        clauses.append(f"category = ANY({arg(list(query.categories))}::text[])")
    if query.roles:
        clauses.append(f"role = ANY({arg(list(query.roles))}::text[])")
    if query.pinned_only:
        clauses.append("pinned")
    if query.session_id:
        clauses.append(f"session_id = {arg(query.session_id)}")
    if query.after is not None:
        recorded_at, memory_id = query.after
        clauses.append(f"(recorded_at, memory_id) < ({arg(recorded_at)}, {arg(memory_id)})")
    limit = arg(query.page_size + 1)
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM memories WHERE {' AND '.join(clauses)}"
        f" ORDER BY recorded_at DESC, memory_id DESC LIMIT {limit}",
        *args,
    )
    records = [record_from_row(r) for r in rows[: query.page_size]]
    next_after = None
    if len(rows) > query.page_size and records:
        next_after = (records[-1].recorded_at, records[-1].memory_id)
    return Page(records, next_after)


async def owned_lineages(
    conn: Connection, scope: Scope, memory_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, uuid.UUID]:
    """memory_id -> lineage_id for the ids written in exactly the scope (others are absent,
    shared ones included: sharing grants reads, never deletion by others)."""
    rows = await conn.fetch(
        f"SELECT memory_id, lineage_id FROM memories WHERE {EXACT_SCOPE}"
        " AND memory_id = ANY($5::uuid[])",
        *scope.key,
        list(memory_ids),
    )
    return {r["memory_id"]: r["lineage_id"] for r in rows}
