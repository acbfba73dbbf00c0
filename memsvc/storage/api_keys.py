"""API keys: created once, stored as SHA-256 digests, mapped to a tenant; listed and revoked
by id or label. Every creation and revocation notifies ``KEYS_CHANNEL`` at commit, so each
serving process updates its key directory (server/auth.py) at once."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from memsvc.storage.connection import Connection

KEY_PREFIX = "msk_"
# token_urlsafe(32): 43 characters of [A-Za-z0-9_-].
KEY_LENGTH = len(KEY_PREFIX) + 43
ID_PREFIX = "key_"
# The NOTIFY channel; payload "+<digest hex>\x1f<tenant>" (created) or "-<digest hex>" (revoked).
KEYS_CHANNEL = "memsvc_keys"
SEPARATOR = "\x1f"
_URLSAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def hash_key(key: str) -> bytes:
    """The stored form of a key. Keys carry 256 random bits, so a fast hash is enough."""
    return hashlib.sha256(key.encode("utf-8")).digest()


def key_id_of(digest: bytes) -> str:
    """A key's public id: from its digest (64 bits of it), so it says nothing about the key."""
    return ID_PREFIX + digest.hex()[:16]


def well_formed(key: str) -> bool:
    """Shaped like a key create_key makes: anything else is refused without a lookup."""
    return len(key) == KEY_LENGTH and key.startswith(KEY_PREFIX) and _URLSAFE.issuperset(key[4:])


@dataclass(frozen=True)
class KeyInfo:
    """What `memsvc keys list` shows of a key (never the key or its digest)."""

    key_id: str
    label: str
    tenant_id: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


async def _notify(conn: Connection, payload: str) -> None:
    await conn.execute("SELECT pg_notify($1, $2)", KEYS_CHANNEL, payload)


async def create_key(conn: Connection, tenant_id: str, label: str = "") -> str:
    """Create a key for the tenant; the clear key is returned once and never stored."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    digest = hash_key(key)
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO api_keys (key_hash, key_id, tenant_id, label) VALUES ($1, $2, $3, $4)",
            digest,
            key_id_of(digest),
            tenant_id,
            label,
        )
        await _notify(conn, f"+{digest.hex()}{SEPARATOR}{tenant_id}")
    return key


async def tenant_for_digest(conn: Connection, digest: bytes) -> str | None:
    """The tenant of an active key, or None."""
    tenant: str | None = await conn.fetchval(
        "SELECT tenant_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL", digest
    )
    return tenant


async def tenant_for_key(conn: Connection, key: str) -> str | None:
    """The tenant of an active key, or None."""
    return await tenant_for_digest(conn, hash_key(key))


async def active_keys(conn: Connection) -> dict[bytes, str]:
    """Every active key's digest and tenant: a serving process's key directory."""
    rows = await conn.fetch("SELECT key_hash, tenant_id FROM api_keys WHERE revoked_at IS NULL")
    return {bytes(r["key_hash"]): r["tenant_id"] for r in rows}


async def stamp_used(conn: Connection, digests: Iterable[bytes]) -> None:
    """Record that these keys were used now."""
    await conn.execute(
        "UPDATE api_keys SET last_used_at = now() WHERE key_hash = ANY($1::bytea[])",
        list(digests),
    )


async def list_keys(
    conn: Connection, *, tenant_id: str | None = None, include_revoked: bool = False
) -> list[KeyInfo]:
    """Keys, oldest first (a tenant's only, when given; revoked ones only when asked)."""
    rows = await conn.fetch(
        "SELECT key_id, label, tenant_id, created_at, last_used_at, revoked_at FROM api_keys"
        " WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2 OR revoked_at IS NULL)"
        " ORDER BY created_at, key_id",
        tenant_id,
        include_revoked,
    )
    return [KeyInfo(**dict(r)) for r in rows]


async def _revoke_where(conn: Connection, condition: str, *args: object) -> list[str]:
    async with conn.transaction():
        rows = await conn.fetch(
            "UPDATE api_keys SET revoked_at = now()"
            f" WHERE revoked_at IS NULL AND {condition} RETURNING key_hash, key_id",
            *args,
        )
        for row in rows:
            await _notify(conn, f"-{bytes(row['key_hash']).hex()}")
    return sorted(r["key_id"] for r in rows)


async def revoke_key(conn: Connection, key: str) -> bool:
    """Revoke a key given in clear; True when it existed and was active."""
    return bool(await _revoke_where(conn, "key_hash = $1", hash_key(key)))


async def revoke_by_id(conn: Connection, key_id: str) -> bool:
    """Revoke the key with this id; True when it existed and was active."""
    return bool(await _revoke_where(conn, "key_id = $1", key_id))


async def revoke_by_label(
    conn: Connection, label: str, *, tenant_id: str | None = None
) -> list[str]:
    """Revoke every active key with this label (of one tenant, when given); their ids."""
    return await _revoke_where(
        conn, "label = $1 AND ($2::text IS NULL OR tenant_id = $2)", label, tenant_id
    )
