"""Dropping a user's cached packets after a change or an erasure (best effort, bounded)."""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from memsvc.cache.keys import user_index_key

log = logging.getLogger(__name__)


class PacketInvalidator:
    """Deletes cached keys of a user.

    Correctness never depends on it: every packet key carries the user's content version,
    bumped in the writing transaction, so an old packet can no longer be looked up. Deleting
    frees memory at once and makes erasure reach the cache too.
    """

    def __init__(self, client: aioredis.Redis, *, timeout_s: float) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self.failures = 0

    async def drop_user(self, tenant_id: str, user_id: str) -> int:
        """Delete every cached key of the user; returns the count, 0 when Redis is unreachable."""
        index = user_index_key(tenant_id, user_id)
        try:
            async with asyncio.timeout(self._timeout_s):
                keys: set[bytes | str] = await self._client.smembers(index)
                deleted: int = await self._client.unlink(index, *keys)
                return deleted
        except (RedisError, OSError, TimeoutError) as exc:
            self.failures += 1
            log.warning("cache invalidation skipped: %s", type(exc).__name__)
            return 0
