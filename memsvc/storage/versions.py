"""Per-user content versions: bumped inside every writing transaction, read by the packet cache.

A user's next version is greatest(their version + 1, now in microseconds), per user. They
came from one global sequence, so the gaps between a tenant's versions (Prefetch's
``version``, WatchMemories' ``version``) counted every other tenant's writes. The clock
term keeps a version from being reused after the user is erased and written again (the row
is gone, the clock moved on), which is what the global sequence was for; the clock is the
server's, passed in, so the statement is the same on Citus.
"""

from __future__ import annotations

import time

from memsvc.storage.connection import Connection

# The statement's tail: an existing user's version only ever grows.
_NEXT = (
    " ON CONFLICT (tenant_id, user_id)"
    " DO UPDATE SET version = greatest(scope_versions.version + 1, EXCLUDED.version)"
)


def clock_version() -> int:
    """A version from the clock alone: microseconds since the epoch."""
    return time.time_ns() // 1000


async def bump_version(conn: Connection, tenant_id: str, user_id: str) -> int:
    """Give the user a new version, higher than any they had; call inside the write."""
    version: int = await conn.fetchval(
        "INSERT INTO scope_versions (tenant_id, user_id, version) VALUES ($1, $2, $3)"
        + _NEXT
        + " RETURNING version",
        tenant_id,
        user_id,
        clock_version(),
    )
    return version


async def bump_versions(conn: Connection, users: list[tuple[str, str]]) -> None:
    """A new version for each (tenant, user) of ``users`` (sorted, distinct: two writers
    bumping overlapping users lock their rows in the same order), in one statement."""
    if not users:
        return
    await conn.execute(
        "INSERT INTO scope_versions (tenant_id, user_id, version)"
        " SELECT t, u, $3 FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS x(t, u, i)"
        " ORDER BY i" + _NEXT,
        [t for t, _ in users],
        [u for _, u in users],
        clock_version(),
    )


async def current_version(conn: Connection, tenant_id: str, user_id: str) -> int:
    """The user's current version; 0 for a user with nothing stored."""
    version: int | None = await conn.fetchval(
        "SELECT version FROM scope_versions WHERE tenant_id = $1 AND user_id = $2",
        tenant_id,
        user_id,
    )
    return version or 0
