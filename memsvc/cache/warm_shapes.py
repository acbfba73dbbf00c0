"""Which packets to rebuild ahead of the call: a user's recently requested hint-less shapes.

Each hint-less Prefetch (the call-setup packet) records its shape in a per-user sorted set
scored by time; entries older than ``ttl_s`` are dropped, and at most ``max_shapes`` of the
newest are kept, so a user who changes persona or agent often cannot grow it. A lock per
(user, content version) lets one serving process rebuild them. Every operation is bounded by
the Redis timeout and best effort: a failure is reported to the caller (the warmer counts
it), never retried here.
"""

from __future__ import annotations

import time

from memsvc.cache.client import CacheClient, Redis
from memsvc.cache.keys import warm_lock_key, warm_shapes_key

# Hint-less shapes kept per user (persona x agent x budget combinations asked for lately).
MAX_SHAPES = 8

# record(): add the shape, drop those older than the TTL, keep the newest max_shapes (ranks
# ascend by score) and extend the set's life, together. A script rather than a MULTI pipeline
# (cache/client.py says why).
_RECORD = """
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
"""


class WarmShapes:
    def __init__(
        self, client: CacheClient, *, timeout_s: float, ttl_s: int, max_shapes: int
    ) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._ttl_s = ttl_s
        self._max_shapes = max_shapes

    async def record(self, tenant_id: str, user_id: str, shape: str) -> None:
        """The user asked for this shape now. Raises RedisError/OSError/TimeoutError."""
        key = warm_shapes_key(tenant_id, user_id)
        now = time.time()

        async def store(redis: Redis) -> None:
            since, keep = now - self._ttl_s, -self._max_shapes - 1
            await redis.eval(_RECORD, 1, key, now, shape, since, keep, self._ttl_s)

        await self._client.run(store, timeout_s=self._timeout_s)

    async def recent(self, tenant_id: str, user_id: str) -> list[str]:
        """The user's shapes asked for within ``ttl_s``, newest first."""
        key = warm_shapes_key(tenant_id, user_id)
        since = time.time() - self._ttl_s
        raw = await self._client.run(
            lambda redis: redis.zrevrangebyscore(key, "+inf", since), timeout_s=self._timeout_s
        )
        return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]

    async def forget(self, tenant_id: str, user_id: str) -> None:
        """Nothing to rebuild for this user (erased, or nothing stored)."""
        key = warm_shapes_key(tenant_id, user_id)
        await self._client.run(lambda redis: redis.unlink(key), timeout_s=self._timeout_s)

    async def claim(self, tenant_id: str, user_id: str, version: int, *, hold_s: float) -> bool:
        """True for the one caller (across processes) that rebuilds at ``version``."""
        key = warm_lock_key(tenant_id, user_id, version)
        hold_ms = max(1, int(hold_s * 1000))
        won = await self._client.run(
            lambda redis: redis.set(key, b"1", nx=True, px=hold_ms), timeout_s=self._timeout_s
        )
        return bool(won)
