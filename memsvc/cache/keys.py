"""Cache key building: pure functions, one Redis Cluster hash tag per user."""

from __future__ import annotations

import hashlib

PREFIX = "memsvc"


def user_tag(tenant_id: str, user_id: str) -> str:
    """A hash tag that puts every key of one user in one cluster slot.

    Hashed, so ids containing braces or colons cannot break the tag or collide.
    """
    digest = hashlib.blake2b(f"{tenant_id}\x00{user_id}".encode(), digest_size=12).hexdigest()
    return "{" + digest + "}"


def hash_tag(key: str) -> str:
    """The hash tag a key is stored under: the text between its first "{" and the next "}"
    (Redis Cluster's rule), or the whole key when it has none."""
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start + 1 : end] if start >= 0 and end > start + 1 else key


def user_index_key(tenant_id: str, user_id: str) -> str:
    """A set listing every cached key of the user, so invalidation never scans the keyspace."""
    return f"{PREFIX}:{user_tag(tenant_id, user_id)}:index"


def packet_key(tenant_id: str, user_id: str, shape: str) -> str:
    """Key of one cached Prefetch packet: user tag and request shape digest.

    The content version is not in the key but in the packet: a reader fetches the packet
    while it reads the user's current version from PostgreSQL, and serves it only when the
    two agree (prefetch/service.py). One key per shape, overwritten by each rebuild.
    """
    shape_digest = hashlib.blake2b(shape.encode(), digest_size=12).hexdigest()
    return f"{PREFIX}:{user_tag(tenant_id, user_id)}:pkt:{shape_digest}"


def warm_shapes_key(tenant_id: str, user_id: str) -> str:
    """A sorted set of the hint-less Prefetch shapes the user asked for lately (score: when),
    which the packet warmer rebuilds after a change. Not in the user's index: dropping the
    user's packets must not forget which ones to rebuild."""
    return f"{PREFIX}:{user_tag(tenant_id, user_id)}:warm"


def warm_lock_key(tenant_id: str, user_id: str, version: int) -> str:
    """Taken (SET NX PX) by the one process that rebuilds the user's packets at ``version``."""
    return f"{PREFIX}:{user_tag(tenant_id, user_id)}:warm:{version}"
