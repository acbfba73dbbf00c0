"""Prefetch packets in Redis: bounded get/put, a per-user key index, and a bypass when down.

Correctness never depends on this cache. Keys carry the user's content version, which every
writing transaction bumps before it is acknowledged, so after a change the old packet is
simply never looked up again; the per-user index set lets PacketInvalidator delete it at
once anyway (and erasure reach the cache). Every operation is bounded by redis_timeout; a
failure makes the cache answer "unavailable" for ``retry_after_s``, so an outage costs each
call nothing instead of a timeout each.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)


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
        client: aioredis.Redis,
        *,
        timeout_s: float,
        ttl_s: int,
        retry_after_s: float,
    ) -> None:
        self._client = client
        self._timeout_s = timeout_s
        self._ttl_s = ttl_s
        self._retry_after_s = retry_after_s
        self._down_until = 0.0
        self.failures = 0

    def _check_up(self) -> None:
        if time.monotonic() < self._down_until:
            raise CacheUnavailable("cache paused after a recent failure")

    def _timed_out(self, exc: TimeoutError, budget_s: float) -> CacheUnavailable:
        # A call whose deadline was nearly spent says nothing about Redis: pausing the cache
        # for every other call (and calling it down) would be wrong.
        if budget_s < self._timeout_s:
            return CacheDeadline("the call's deadline ran out before Redis answered")
        return self._failed(exc)

    def _failed(self, exc: BaseException) -> CacheUnavailable:
        self.failures += 1
        self._down_until = time.monotonic() + self._retry_after_s
        log.warning("packet cache unavailable (%s); bypassing it", type(exc).__name__)
        return CacheUnavailable(type(exc).__name__)

    async def get(self, key: str, *, budget_s: float) -> bytes | None:
        """The cached bytes, None on a miss; CacheUnavailable when Redis cannot answer."""
        self._check_up()
        try:
            async with asyncio.timeout(min(self._timeout_s, budget_s)):
                value: bytes | str | None = await self._client.get(key)
                return value.encode() if isinstance(value, str) else value
        except TimeoutError as exc:
            raise self._timed_out(exc, budget_s) from exc
        except (RedisError, OSError) as exc:
            raise self._failed(exc) from exc

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
        expires sooner) and list the key in the user's index (same hash tag, so one MULTI
        works on a cluster too); CacheUnavailable when Redis cannot answer."""
        self._check_up()
        ttl_ms = self._ttl_s * 1000
        if max_ttl_ms is not None:
            if max_ttl_ms <= 0:
                return
            ttl_ms = min(ttl_ms, max_ttl_ms)
        try:
            async with asyncio.timeout(min(self._timeout_s, budget_s)):
                pipe = self._client.pipeline(transaction=True)
                pipe.set(key, value, px=ttl_ms)
                pipe.sadd(index_key, key)
                # The index outlives each packet it lists by at most one TTL.
                pipe.expire(index_key, self._ttl_s)
                await pipe.execute()
        except TimeoutError as exc:
            raise self._timed_out(exc, budget_s) from exc
        except (RedisError, OSError) as exc:
            raise self._failed(exc) from exc
