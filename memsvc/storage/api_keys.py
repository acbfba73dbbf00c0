"""API keys: created once, stored as SHA-256 digests, mapped to a tenant."""

from __future__ import annotations

import hashlib
import secrets

from memsvc.storage.connection import Connection

KEY_PREFIX = "msk_"


def hash_key(key: str) -> bytes:
    """The stored form of a key. Keys carry 256 random bits, so a fast hash is enough."""
    return hashlib.sha256(key.encode("utf-8")).digest()


async def create_key(conn: Connection, tenant_id: str, label: str = "") -> str:
    """Create a key for the tenant; the clear key is returned once and never stored."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    await conn.execute(
        "INSERT INTO api_keys (key_hash, tenant_id, label) VALUES ($1, $2, $3)",
        hash_key(key),
        tenant_id,
        label,
    )
    return key


async def tenant_for_key(conn: Connection, key: str) -> str | None:
    """The tenant of an active key, or None."""
    tenant: str | None = await conn.fetchval(
        "SELECT tenant_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL",
        hash_key(key),
    )
    return tenant


async def revoke_key(conn: Connection, key: str) -> bool:
    """Revoke a key; True when it existed and was active."""
    status: str = await conn.execute(
        "UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1 AND revoked_at IS NULL",
        hash_key(key),
    )
    return status.endswith(" 1")
