"""Prefetch packets in Redis: bounded get/put, a per-user key index, and a bypass when down.

Correctness never depends on this cache. Keys carry the user's content version, which every
writing transaction bumps before it is acknowledged, so after a change the old packet is
simply never looked up again; the per-user index set lets PacketInvalidator delete it at
once anyway (and erasure reach the cache). Every operation is bounded by redis_timeout; a
failure makes the cache answer "unavailable" for ``retry_after_s``, so an outage costs each
call nothing instead of a timeout each. On a cluster that pause is per master (the one the
client maps the key's slot to): with one master down, the users of the others keep their
cache (all of them, where the cluster serves partial coverage; until it marks the master
failed, where it does not).
"""

from __future__ import annotations

import enum
import logging
import time

from redis.exceptions import RedisError

from memsvc.cache.client import CacheClient, LoopStalled, Redis
from memsvc.cache.keys import hash_tag

log = logging.getLogger(__name__)


# put(): the packet, its entry in the user's index, and the index's lifetime (it outlives each
# packet it lists by at most one TTL), applied together. A script rather than a MULTI pipeline
# (client.py says why): one command, as atomic. KEYS: packet, index; ARGV: bytes, PX ms, index
# TTL s. (The benchmark's floor stores with it too.)
STORE_SCRIPT = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[2], KEYS[1])
redis.call('EXPIRE', KEYS[2], ARGV[3])
"""


class CacheStatus(enum.StrEnum):
    HIT = "hit"
    MISS = "miss"
    BYPASSED = "bypassed"
    SKIPPED = "skipped"


class CacheUnavailable(Exception):
    """Redis did not answer in time, failed, or is in its retry-after pause."""


class CacheDeadline(CacheUnavailable):
    """The caller's budget, shorter than the Redis timeout, ran out before Redis answered."""


class PacketCache:
    def __init__(
        self,
        client: CacheClient,
        *,
        timeout_s: float,
        ttl_s: int,
        retry_after_s: float,
    ) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._ttl_s = ttl_s
        self._retry_after_s = retry_after_s
        # Per shard (cluster node; "" for one server): a master down pauses its users only.
        self._down_until: dict[str, float] = {}
        self.failures = 0

    def _check_up(self, shard: str) -> None:
        if time.monotonic() < self._down_until.get(shard, 0.0):
            raise CacheUnavailable("cache paused after a recent failure")

    def _timed_out(self, exc: TimeoutError, budget_s: float, shard: str) -> CacheUnavailable:
        # A call whose deadline was nearly spent, or whose operation this process's own loop
        # kept waiting, says nothing about Redis: pausing the cache for every other call (and
        # calling it down) would be wrong.
        if budget_s < self._timeout_s:
            return CacheDeadline("the call's deadline ran out before Redis answered")
        if isinstance(exc, LoopStalled):
            return CacheUnavailable(str(exc))  # this call only: Redis is not paused
        return self._failed(exc, shard)

    def _failed(self, exc: BaseException, shard: str) -> CacheUnavailable:
        self.failures += 1
        self._down_until[shard] = time.monotonic() + self._retry_after_s
        log.warning("packet cache unavailable (%s); bypassing it", type(exc).__name__)
        return CacheUnavailable(type(exc).__name__)

    async def get(self, key: str, *, budget_s: float) -> bytes | None:
        """The cached bytes, None on a miss; CacheUnavailable when Redis cannot answer."""
        shard = self._client.shard_of(key)
        self._check_up(shard)
        try:
            value: bytes | str | None = await self._client.run(
                lambda redis: redis.get(key), timeout_s=min(self._timeout_s, budget_s)
            )
            return value.encode() if isinstance(value, str) else value
        except TimeoutError as exc:
            raise self._timed_out(exc, budget_s, shard) from exc
        except (RedisError, OSError) as exc:
            raise self._failed(exc, shard) from exc

    async def put(
        self,
        key: str,
        index_key: str,
        value: bytes,
        *,
        budget_s: float,
        max_ttl_ms: int | None = None,
    ) -> None:
        """Store with the TTL (or ``max_ttl_ms`` when shorter: the packet holds something that
        expires sooner) and list the key in the user's index, at once (one script: same hash
        tag, so one slot on a cluster too); CacheUnavailable when Redis cannot answer."""
        if hash_tag(key) != hash_tag(index_key):
            # A cluster refuses a script across slots; a single server would hide the bug.
            raise ValueError("a packet and its index must carry the same user tag")
        shard = self._client.shard_of(key)
        self._check_up(shard)
        ttl_ms = self._ttl_s * 1000
        if max_ttl_ms is not None:
            if max_ttl_ms <= 0:
                return
            ttl_ms = min(ttl_ms, max_ttl_ms)

        async def store(redis: Redis) -> None:
            await redis.eval(STORE_SCRIPT, 2, key, index_key, value, ttl_ms, self._ttl_s)

        try:
            await self._client.run(store, timeout_s=min(self._timeout_s, budget_s))
        except TimeoutError as exc:
            raise self._timed_out(exc, budget_s, shard) from exc
        except (RedisError, OSError) as exc:
            raise self._failed(exc, shard) from exc
