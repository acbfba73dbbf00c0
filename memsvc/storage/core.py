"""SQL of the core block: read one scope's pinned and core-role facts, demote some in place."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from memsvc.storage.conditions import CURRENT, EXACT_SCOPE
from memsvc.storage.connection import Connection
from memsvc.storage.memories import COLUMNS, record_from_row
from memsvc.storage.model import MemoryRecord, Scope

_EXACT = EXACT_SCOPE
DEMOTED_ROLE = "context"


async def block(conn: Connection, scope: Scope, core_role: str) -> list[MemoryRecord]:
    """The scope's own core block: current facts that are pinned or of the core role (the
    definition of Prefetch's core section, for the rows this exact scope owns)."""
    rows = await conn.fetch(
        f"SELECT {COLUMNS} FROM memories WHERE {_EXACT} AND {CURRENT}"
        " AND (pinned OR role = $5) ORDER BY recorded_at, memory_id",
        *scope.key,
        core_role,
    )
    return [record_from_row(r) for r in rows]


async def demote(
    conn: Connection,
    scope: Scope,
    memory_ids: Sequence[uuid.UUID],
    *,
    into: uuid.UUID | None = None,
) -> list[MemoryRecord]:
    """Make core memories ordinary facts (role context, unpinned), keeping their id, content
    and history; what they were is kept in demoted_role / demoted_pinned. Returns the rows
    as they are now, in the order of ``memory_ids``."""
    if not memory_ids:
        return []
    rows = await conn.fetch(
        f"UPDATE memories SET demoted_role = role, demoted_pinned = pinned,"
        f" role = '{DEMOTED_ROLE}', pinned = false, demoted_at = now(), demoted_into = $6"
        f" WHERE {_EXACT} AND memory_id = ANY($5::uuid[]) AND invalid_at IS NULL"
        f" RETURNING {COLUMNS}",
        *scope.key,
        list(memory_ids),
        into,
    )
    demoted = {r.memory_id: r for r in map(record_from_row, rows)}
    return [demoted[i] for i in memory_ids if i in demoted]
