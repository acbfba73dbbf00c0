"""SQL of the change stream: the memory_changes log (written by triggers, see migration 0011),
read by position, pruned by age, and the settings a writing transaction gives its deletes.

Positions are numbered at commit, in commit order per user (the migration explains why), so
``position > P ORDER BY position`` never misses a change committed after a reader saw P.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import asyncpg

from memsvc.storage import citus, versions
from memsvc.storage.connection import Connection
from memsvc.storage.model import Scope

# The NOTIFY channel; the payload is tenant_id + "\x1f" + user_id.
CHANNEL = "memsvc_changes"
SEPARATOR = "\x1f"

# What a deleting transaction's deletes are recorded as ('' : forgotten).
DeleteKind = Literal["expired", "none", ""]


@dataclass(frozen=True)
class Change:
    """One committed change (or, with kind 'heartbeat', the stream's current position)."""

    position: int
    kind: str
    scope: Scope
    version: int
    changed_at: datetime | None
    memory_id: uuid.UUID | None = None
    superseded_by_id: uuid.UUID | None = None
    block: str | None = None


@dataclass(frozen=True)
class Batch:
    """Changes after a position, and the user's pruned horizon (0: nothing pruned)."""

    changes: list[Change]
    pruned_through: int


_KINDS = frozenset({"expired", "none", ""})


async def _set_kind(conn: Connection, kind: str) -> None:
    # SET LOCAL (a statement, so the kind is written in, from a closed set), not set_config():
    # on Citus the triggers that read it run on the workers, and Citus forwards a transaction's
    # SET LOCAL to them (citus.propagate_set_commands, set by storage.citus).
    if kind not in _KINDS:
        raise ValueError(f"unknown delete kind {kind!r}")
    await conn.execute(f"SET LOCAL memsvc.change_kind = '{kind}'")


@asynccontextmanager
async def deletes_recorded_as(conn: Connection, kind: DeleteKind) -> AsyncIterator[None]:
    """Inside a transaction: memory rows deleted within the block are recorded as ``kind``
    ('expired': retention; 'none': not at all, for erasure, which records one row itself)."""
    await _set_kind(conn, kind)
    yield
    await _set_kind(conn, "")


async def record_erasure(conn: Connection, tenant_id: str, user_id: str) -> None:
    """The user's change log goes with them; one 'erased' change says so. Call inside the
    erasing transaction, after the data is deleted."""
    await conn.execute(
        "DELETE FROM memory_changes WHERE tenant_id = $1 AND user_id = $2", tenant_id, user_id
    )
    await conn.execute(
        "DELETE FROM memory_change_horizons WHERE tenant_id = $1 AND user_id = $2",
        tenant_id,
        user_id,
    )
    await conn.execute(
        "INSERT INTO memory_changes (tenant_id, user_id, kind) VALUES ($1, $2, 'erased')",
        tenant_id,
        user_id,
    )


class Waker:
    """Wakes the listeners of the users a writing transaction changed, on Citus only.

    On a single PostgreSQL the commit trigger notifies (migration 0011). On Citus that
    NOTIFY is gone from the shards (storage.citus_triggers: a worker's part of a 2PC
    transaction cannot notify), so the writer notifies from its coordinator connection, in
    the writing transaction: delivered at its commit, never for a rollback, as the trigger's
    was (outbox.wake does the same for the outbox). Every transaction that changes a user's
    memories or core blocks bumps their version (storage.versions) or erases them: it ends
    with ``bump`` (the version and the wake together), or ``user``/``users`` beside an
    erasure or a multi-user bump. Whether the database is Citus is found out
    at the first call (one query per Waker; each writing service holds its own)."""

    def __init__(self) -> None:
        self._on_citus: bool | None = None

    async def users(self, conn: Connection, users: Iterable[tuple[str, str]]) -> None:
        """Inside the writing transaction: notify each (tenant, user) once, at its commit."""
        payloads = sorted({f"{tenant}{SEPARATOR}{user}" for tenant, user in users})
        if not payloads:
            return
        if self._on_citus is None:
            self._on_citus = await citus.has_citus(conn)
        if self._on_citus:
            # No table: the coordinator runs it itself, in its own (never prepared) part of
            # the transaction.
            await conn.execute(
                "SELECT pg_notify($1, payload) FROM unnest($2::text[]) AS payload",
                CHANNEL,
                payloads,
            )

    async def user(self, conn: Connection, tenant_id: str, user_id: str) -> None:
        await self.users(conn, [(tenant_id, user_id)])

    async def bump(self, conn: Connection, tenant_id: str, user_id: str) -> int:
        """Inside the writing transaction: the user's new version (storage.versions) and their
        listeners woken at its commit; how a write of one user's memories or core blocks ends."""
        version = await versions.bump_version(conn, tenant_id, user_id)
        await self.user(conn, tenant_id, user_id)
        return version


async def head(conn: Connection, tenant_id: str, user_id: str) -> int:
    """The user's last committed position (their pruned horizon when none is left; 0: none)."""
    position: int = await conn.fetchval(
        "SELECT greatest("
        " (SELECT max(position) FROM memory_changes WHERE tenant_id = $1 AND user_id = $2),"
        " (SELECT pruned_through FROM memory_change_horizons"
        "  WHERE tenant_id = $1 AND user_id = $2), 0)",
        tenant_id,
        user_id,
    )
    return position


def _change(r: asyncpg.Record) -> Change:
    return Change(
        position=r["position"],
        kind=r["kind"],
        scope=Scope(r["tenant_id"], r["user_id"], r["persona_id"], r["agent_id"]),
        version=r["version"] or 0,
        changed_at=r["changed_at"],
        memory_id=r["memory_id"],
        superseded_by_id=r["superseded_by_id"],
        block=r["block"],
    )


async def after(conn: Connection, tenant_id: str, user_id: str, position: int, limit: int) -> Batch:
    """Up to ``limit`` of the user's committed changes after ``position`` (every scope: the
    caller filters, so its position moves past other scopes' changes too), in position order,
    with the user's pruned horizon, in one statement."""
    rows = await conn.fetch(
        "SELECT h.pruned_through, c.* FROM (SELECT 1) AS one"
        " LEFT JOIN memory_change_horizons h ON h.tenant_id = $1 AND h.user_id = $2"
        " LEFT JOIN LATERAL (SELECT tenant_id, user_id, persona_id, agent_id, position, kind,"
        "  memory_id, superseded_by_id, block, version, changed_at FROM memory_changes"
        "  WHERE tenant_id = $1 AND user_id = $2 AND position > $3"
        "  ORDER BY position LIMIT $4) AS c ON true",
        tenant_id,
        user_id,
        position,
        limit,
    )
    pruned: int = (rows[0]["pruned_through"] or 0) if rows else 0
    return Batch([_change(r) for r in rows if r["position"] is not None], pruned)


async def current_version(conn: Connection, tenant_id: str, user_id: str) -> int:
    version: int | None = await conn.fetchval(
        "SELECT version FROM scope_versions WHERE tenant_id = $1 AND user_id = $2",
        tenant_id,
        user_id,
    )
    return version or 0


async def prune(
    conn: Connection, older_than_s: float, limit: int, *, user: tuple[str, str] | None = None
) -> int:
    """Delete up to ``limit`` committed changes older than ``older_than_s``, oldest first,
    raising each user's pruned horizon to the highest position removed (one statement).
    Returns rows deleted. ``user`` (tenant, user): only theirs (Citus takes one user at a
    time; see users_to_prune), in two single-shard statements of one transaction: a CTE that
    deletes and writes the horizon from what it deleted is run through the coordinator."""
    if user is not None:
        async with conn.transaction():
            gone = await conn.fetch(_PRUNE_OF_USER, older_than_s, limit, *user)
            if gone:
                await conn.execute(_RAISE_HORIZON, *user, max(r["position"] for r in gone))
        return len(gone)
    deleted: int = await conn.fetchval(_PRUNE, older_than_s, limit)
    return deleted


async def users_to_prune(
    conn: Connection, older_than_s: float, limit: int
) -> list[tuple[str, str]]:
    """Up to ``limit`` users with committed changes older than ``older_than_s``, oldest
    first. Reads only, without locks: on Citus a statement over every shard."""
    rows = await conn.fetch(
        "SELECT tenant_id, user_id FROM memory_changes"
        " WHERE changed_at < now() - make_interval(secs => $1) AND position IS NOT NULL"
        " GROUP BY tenant_id, user_id ORDER BY min(changed_at) LIMIT $2",
        older_than_s,
        limit,
    )
    return [(r["tenant_id"], r["user_id"]) for r in rows]


_PRUNE = """
        WITH gone AS (
            DELETE FROM memory_changes c
            USING (SELECT tenant_id, user_id, change_id FROM memory_changes
                   WHERE changed_at < now() - make_interval(secs => $1)
                     AND position IS NOT NULL
                   ORDER BY changed_at
                   LIMIT $2
                   FOR UPDATE SKIP LOCKED) AS d
            WHERE c.tenant_id = d.tenant_id AND c.user_id = d.user_id
              AND c.change_id = d.change_id
            RETURNING c.tenant_id, c.user_id, c.position),
        horizons AS (
            INSERT INTO memory_change_horizons AS h (tenant_id, user_id, pruned_through)
            SELECT tenant_id, user_id, max(position) FROM gone GROUP BY tenant_id, user_id
            ORDER BY tenant_id, user_id
            ON CONFLICT (tenant_id, user_id) DO UPDATE
                SET pruned_through = greatest(h.pruned_through, EXCLUDED.pruned_through))
        SELECT count(*) FROM gone
        """
_PRUNE_OF_USER = """
        DELETE FROM memory_changes c
        USING (SELECT change_id FROM memory_changes
               WHERE changed_at < now() - make_interval(secs => $1)
                 AND position IS NOT NULL AND tenant_id = $3 AND user_id = $4
               ORDER BY changed_at
               LIMIT $2
               FOR UPDATE SKIP LOCKED) AS d
        WHERE c.tenant_id = $3 AND c.user_id = $4 AND c.change_id = d.change_id
        RETURNING c.position
        """
_RAISE_HORIZON = (
    "INSERT INTO memory_change_horizons AS h (tenant_id, user_id, pruned_through)"
    " VALUES ($1, $2, $3) ON CONFLICT (tenant_id, user_id) DO UPDATE"
    " SET pruned_through = greatest(h.pruned_through, EXCLUDED.pruned_through)"
)
