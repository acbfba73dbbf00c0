"""Dropping a user's cached packets after a change or an erasure (best effort, bounded)."""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from memsvc.cache.client import CacheClient, Redis
from memsvc.cache.keys import user_index_key

log = logging.getLogger(__name__)


class PacketInvalidator:
    """Deletes cached keys of a user.

    Correctness never depends on it: every packet key carries the user's content version,
    bumped in the writing transaction, so an old packet can no longer be looked up. Deleting
    frees memory at once and makes erasure reach the cache too.
    """

    def __init__(self, client: CacheClient, *, timeout_s: float) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self.failures = 0

    async def drop_user(self, tenant_id: str, user_id: str) -> int:
        """Delete every cached key of the user; returns the count, 0 when Redis is unreachable."""
        index = user_index_key(tenant_id, user_id)

        async def drop(redis: Redis) -> int:
            # Every member carries the index's hash tag (PacketCache.put checks it), so the
            # UNLINK touches one slot: one command on a cluster too.
            keys: set[bytes | str] = await redis.smembers(index)
            deleted: int = await redis.unlink(index, *keys)
            return deleted

        try:
            return await self._client.run(drop, timeout_s=self._timeout_s)
        except (RedisError, OSError, TimeoutError) as exc:
            self.failures += 1
            log.warning("cache invalidation skipped: %s", type(exc).__name__)
            return 0
