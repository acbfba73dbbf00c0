"""Per-user content versions: bumped inside every writing transaction, read by the packet cache."""

from __future__ import annotations

from memsvc.storage.connection import Connection


async def bump_version(conn: Connection, tenant_id: str, user_id: str) -> int:
    """Give the user a new version, never used before (global sequence); call inside the write."""
    version: int = await conn.fetchval(
        "INSERT INTO scope_versions (tenant_id, user_id, version)"
        " VALUES ($1, $2, nextval('scope_version_seq'))"
        " ON CONFLICT (tenant_id, user_id) DO UPDATE SET version = EXCLUDED.version"
        " RETURNING version",
        tenant_id,
        user_id,
    )
    return version


async def current_version(conn: Connection, tenant_id: str, user_id: str) -> int:
    """The user's current version; 0 for a user with nothing stored."""
    version: int | None = await conn.fetchval(
        "SELECT version FROM scope_versions WHERE tenant_id = $1 AND user_id = $2",
        tenant_id,
        user_id,
    )
    return version or 0
