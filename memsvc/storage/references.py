"""SQL of last_referenced_at: one batched UPDATE for everything reads returned lately."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import asyncpg


async def mark_referenced(
    conn: asyncpg.Connection,
    rows: Sequence[tuple[str, str, uuid.UUID, datetime]],
    *,
    timeout_s: float | None = None,
) -> int:
    """Set last_referenced_at for (tenant, user, memory_id, read at) in one statement, joined
    on the primary key; never moves the time back. Returns the rows updated."""
    if not rows:
        return 0
    tenants, users, ids, times = (list(column) for column in zip(*rows, strict=True))
    status: str = await conn.execute(
        "UPDATE memories AS m SET last_referenced_at = r.at"
        " FROM unnest($1::text[], $2::text[], $3::uuid[], $4::timestamptz[])"
        "   AS r(tenant_id, user_id, memory_id, at)"
        " WHERE m.tenant_id = r.tenant_id AND m.user_id = r.user_id"
        "   AND m.memory_id = r.memory_id"
        "   AND (m.last_referenced_at IS NULL OR m.last_referenced_at < r.at)",
        tenants,
        users,
        ids,
        times,
        timeout=timeout_s,
    )
    return int(status.rsplit(" ", 1)[-1])
