"""SQL of RememberBatch: many memories inserted (or reinforced) in one statement.

The statement is insert_or_reinforce's, over unnest()ed columns: each row either becomes a
new memory or reinforces the identical active one of its exact scope, with the same rules
(storage.memories.insert_or_reinforce). One statement cannot touch the same row twice, so
the caller passes rows whose (user, persona, agent, content hash) keys are distinct and
sends a repeated key in a later call (it then reinforces the row the first one wrote).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import orjson

from memsvc.storage import retention
from memsvc.storage.conditions import not_expired
from memsvc.storage.connection import Connection
from memsvc.storage.memories import HOT_COLUMNS, ON_DUPLICATE_REINFORCE, record_from_row
from memsvc.storage.model import MemoryRecord, NewMemory, Scope

Key = tuple[str, str, str, bytes]


@dataclass(frozen=True)
class BatchRow:
    """One memory of a batch: where, what, its content hash and its vector (None: missing)."""

    scope: Scope
    memory: NewMemory
    content_hash: bytes
    embedding: np.ndarray | None

    @property
    def key(self) -> Key:
        return (self.scope.user_id, self.scope.persona_id, self.scope.agent_id, self.content_hash)


_INSERT = f"""
    INSERT INTO memories (
        tenant_id, user_id, persona_id, agent_id, shared_all_agents, shared_all_personas,
        memory_id, lineage_id, content, content_hash, subject, predicate, object,
        category, role, confidence, pinned, valid_from, supersedes_id,
        source_message_ids, session_id, origin, correction_reason,
        embedding, embedding_model, embedding_state, ingest_id,
        retention_policy, expires_at)
    SELECT $1, r.user_id, r.persona_id, r.agent_id, r.all_agents, r.all_personas,
           r.memory_id, r.memory_id, r.content, r.content_hash, r.subject, r.predicate,
           r.object, r.category, r.role, r.confidence, r.pinned, coalesce(r.valid_from, now()),
           NULL, ARRAY(SELECT jsonb_array_elements_text(r.sources::jsonb)), r.session_id,
           r.origin, '',
           CASE WHEN r.vec >= 0 THEN ($20::real[])[r.vec * $21 + 1 : (r.vec + 1) * $21]::vector
           END,
           CASE WHEN r.vec >= 0 THEN $22 ELSE '' END,
           CASE WHEN r.vec >= 0 THEN 'ok' ELSE 'missing' END,
           NULL, r.retention_policy,
           coalesce(r.expires_at, now() + r.expires_in_s * interval '1 second')
    FROM unnest($2::text[], $3::text[], $4::text[], $5::bool[], $6::bool[], $7::uuid[],
                $8::text[], $9::bytea[], $10::text[], $11::text[], $12::text[], $13::text[],
                $14::text[], $15::real[], $16::bool[], $17::timestamptz[], $18::text[],
                $19::text[], $23::text[], $24::int[], $25::text[], $26::timestamptz[],
                $27::float8[])
         AS r(user_id, persona_id, agent_id, all_agents, all_personas, memory_id, content,
              content_hash, subject, predicate, object, category, role, confidence, pinned,
              valid_from, sources, session_id, origin, vec, retention_policy, expires_at,
              expires_in_s)
    {ON_DUPLICATE_REINFORCE}
    RETURNING {HOT_COLUMNS}, content_hash, (xmax <> 0) AS reinforced
"""


def _arguments(
    tenant_id: str, rows: Sequence[BatchRow], embedding_model: str, dimension: int
) -> list[object]:
    vectors = [r.embedding for r in rows if r.embedding is not None]
    flat = np.concatenate(vectors).astype(np.float32) if vectors else np.zeros(0, np.float32)
    positions: list[int] = []
    next_position = 0
    for r in rows:
        positions.append(-1 if r.embedding is None else next_position)
        next_position += r.embedding is not None
    memories = [r.memory for r in rows]
    return [
        tenant_id,
        [r.scope.user_id for r in rows],
        [r.scope.persona_id for r in rows],
        [r.scope.agent_id for r in rows],
        [m.sharing.all_agents for m in memories],
        [m.sharing.all_personas for m in memories],
        [uuid.uuid4() for _ in rows],
        [m.content for m in memories],
        [r.content_hash for r in rows],
        [m.subject for m in memories],
        [m.predicate for m in memories],
        [m.object for m in memories],
        [m.category for m in memories],
        [m.role for m in memories],
        [m.confidence for m in memories],
        [m.pinned for m in memories],
        [m.valid_from for m in memories],
        [orjson.dumps(list(m.source_message_ids)).decode() for m in memories],
        [m.session_id for m in memories],
        flat.tolist(),
        dimension,
        embedding_model,
        [m.origin for m in memories],
        positions,
        [m.retention_policy for m in memories],
        [m.expires_at for m in memories],
        [m.expires_in_s for m in memories],
    ]


async def insert_or_reinforce_many(
    conn: Connection,
    tenant_id: str,
    rows: Sequence[BatchRow],
    *,
    embedding_model: str,
    dimension: int,
) -> list[tuple[MemoryRecord, bool]]:
    """Insert or reinforce every row (keys distinct), in one statement; the result of each,
    in order: the row and True when an identical active memory was reinforced. A row whose
    identical memory expired (not yet purged) replaces it, as insert_or_reinforce does."""
    if not rows:
        return []
    keys = [r.key for r in rows]
    if len(set(keys)) != len(keys):
        raise ValueError("insert_or_reinforce_many: two rows with the same scope and content")
    found: dict[Key, tuple[MemoryRecord, bool]] = {}
    pending = list(rows)
    for attempt in range(2):
        fetched = await conn.fetch(
            _INSERT, *_arguments(tenant_id, pending, embedding_model, dimension)
        )
        for row in fetched:
            key = (row["user_id"], row["persona_id"], row["agent_id"], bytes(row["content_hash"]))
            found[key] = (record_from_row(row), bool(row["reinforced"]))
        pending = [r for r in pending if r.key not in found]
        if not pending or attempt:
            break
        # Identical active memories that expired: they go, these start fresh.
        for r in pending:
            await retention.drop_expired_duplicate(conn, r.scope, r.content_hash)
    if pending:
        raise RuntimeError("insert_or_reinforce_many: a row was neither inserted nor reinforced")
    out = await _with_last_referenced(conn, tenant_id, [found[k] for k in keys])
    for (record, reinforced), r in zip(out, rows, strict=True):
        if reinforced and r.memory.origin == "explicit":
            await retention.align_lineage(conn, tenant_id, record.scope.user_id, record.lineage_id)
    return out


async def _with_last_referenced(
    conn: Connection, tenant_id: str, results: list[tuple[MemoryRecord, bool]]
) -> list[tuple[MemoryRecord, bool]]:
    """The reinforced rows with their last_referenced_at, read after the INSERT: not a
    subquery in its RETURNING, which Citus runs on the shards as a nested distributed query
    and refuses. A new memory has never been referenced."""
    reinforced = [record for record, again in results if again]
    if not reinforced:
        return results
    rows = await conn.fetch(
        "SELECT r.user_id, r.memory_id, r.last_referenced_at FROM memory_references r"
        " JOIN unnest($2::text[], $3::uuid[]) AS k(u, m)"
        " ON r.tenant_id = $1 AND r.user_id = k.u AND r.memory_id = k.m",
        tenant_id,
        [m.scope.user_id for m in reinforced],
        [m.memory_id for m in reinforced],
    )
    seen = {(r["user_id"], r["memory_id"]): r["last_referenced_at"] for r in rows}
    return [
        (
            dataclasses.replace(
                record, last_referenced_at=seen.get((record.scope.user_id, record.memory_id))
            )
            if again
            else record,
            again,
        )
        for record, again in results
    ]


async def find_active_duplicates(conn: Connection, tenant_id: str, keys: Sequence[Key]) -> set[Key]:
    """Which of the keys already have an active, unexpired memory (their content needs no
    embedding: the write reinforces it)."""
    if not keys:
        return set()
    rows = await conn.fetch(
        "SELECT m.user_id, m.persona_id, m.agent_id, m.content_hash FROM memories m"
        " JOIN unnest($2::text[], $3::text[], $4::text[], $5::bytea[]) AS k(u, p, a, h)"
        " ON m.tenant_id = $1 AND m.user_id = k.u AND m.persona_id = k.p AND m.agent_id = k.a"
        " AND m.content_hash = k.h"
        f" WHERE m.invalid_at IS NULL AND {not_expired('m')}",
        tenant_id,
        [k[0] for k in keys],
        [k[1] for k in keys],
        [k[2] for k in keys],
        [k[3] for k in keys],
    )
    return {(r["user_id"], r["persona_id"], r["agent_id"], bytes(r["content_hash"])) for r in rows}
