"""SQL of last_referenced_at: one batched upsert into memory_references (migration 0008) for
everything reads returned lately, and the expression reads select it with."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from memsvc.storage.connection import Connection


async def mark_referenced(
    conn: Connection,
    rows: Sequence[tuple[str, str, uuid.UUID, datetime]],
    *,
    timeout_s: float | None = None,
) -> int:
    """Set last_referenced_at for (tenant, user, memory_id, read at) in one statement; never
    moves the time back. Returns the rows written. Concurrent writers must pass rows sorted
    by (tenant, user, memory_id), so they lock rows in one order and never deadlock."""
    if not rows:
        return 0
    tenants, users, ids, times = (list(column) for column in zip(*rows, strict=True))
    async with conn.transaction():
        # A hint, not a record: losing the last second of them in a crash is fine, waiting
        # for a WAL flush every second is not.
        await conn.execute("SET LOCAL synchronous_commit = off")
        status: str = await conn.execute(
            "INSERT INTO memory_references AS t (tenant_id, user_id, memory_id, last_referenced_at)"
            " SELECT r.tenant_id, r.user_id, r.memory_id, r.at"
            " FROM unnest($1::text[], $2::text[], $3::uuid[], $4::timestamptz[])"
            "   AS r(tenant_id, user_id, memory_id, at)"
            # Only memories that still exist (one deleted since it was read is skipped). A
            # LATERAL probe per id: a plain join may be planned as a scan of all memories.
            " CROSS JOIN LATERAL (SELECT 1 FROM memories m WHERE m.tenant_id = r.tenant_id"
            "   AND m.user_id = r.user_id AND m.memory_id = r.memory_id LIMIT 1) AS live"
            " ON CONFLICT (tenant_id, user_id, memory_id) DO UPDATE"
            " SET last_referenced_at = EXCLUDED.last_referenced_at"
            " WHERE t.last_referenced_at < EXCLUDED.last_referenced_at",
            tenants,
            users,
            ids,
            times,
            timeout=timeout_s,
        )
    return int(status.rsplit(" ", 1)[-1])


async def mark_referenced_by_user(
    conn: Connection,
    rows: Sequence[tuple[str, str, uuid.UUID, datetime]],
    *,
    timeout_s: float | None = None,
) -> int:
    """mark_referenced one user at a time: on Citus, where the one-statement form joins
    memories of many users (a subquery Citus cannot push down), each user's statement names
    the user and runs on that user's shard alone. Same sorting rule, one transaction."""
    if not rows:
        return 0
    by_user: dict[tuple[str, str], list[tuple[uuid.UUID, datetime]]] = {}
    for tenant_id, user_id, memory_id, at in rows:
        by_user.setdefault((tenant_id, user_id), []).append((memory_id, at))
    written = 0
    async with conn.transaction():
        await conn.execute("SET LOCAL synchronous_commit = off")
        for (tenant_id, user_id), items in by_user.items():
            ids, times = (list(column) for column in zip(*items, strict=True))
            status: str = await conn.execute(
                "INSERT INTO memory_references AS t"
                " (tenant_id, user_id, memory_id, last_referenced_at)"
                " SELECT m.tenant_id, m.user_id, m.memory_id, r.at"
                " FROM unnest($3::uuid[], $4::timestamptz[]) AS r(memory_id, at)"
                " JOIN memories m ON m.tenant_id = $1 AND m.user_id = $2"
                "   AND m.memory_id = r.memory_id"
                " ON CONFLICT (tenant_id, user_id, memory_id) DO UPDATE"
                " SET last_referenced_at = EXCLUDED.last_referenced_at"
                " WHERE t.last_referenced_at < EXCLUDED.last_referenced_at",
                tenant_id,
                user_id,
                ids,
                times,
                timeout=timeout_s,
            )
            written += int(status.rsplit(" ", 1)[-1])
    return written


def last_referenced_sql(table: str, *, user_id: str | None = None) -> str:
    """The scalar subquery giving last_referenced_at of the ``table`` row (a name or alias of
    memories) in a SELECT or RETURNING list: one primary-key probe per row returned.

    ``user_id``: the statement's parameter holding the one user all its rows belong to
    ("$2"). On Citus the probe must name the user by that parameter: correlated only to the
    row, it is planned over every shard of memory_references (and a FOR UPDATE fails)."""
    user = user_id or f"{table}.user_id"
    return (
        "(SELECT mr.last_referenced_at FROM memory_references mr"
        f" WHERE mr.tenant_id = {table}.tenant_id AND mr.user_id = {user}"
        f" AND mr.memory_id = {table}.memory_id)"
    )
