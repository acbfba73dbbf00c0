"""Prefetch when Redis is down or slow: built from PostgreSQL within the deadline, answered
with cache: BYPASSED (or SKIPPED when the call's own deadline, not Redis, cut the cache
short), never an error. Each test runs its own valkey and memsvc, so the session's shared ones
are not disturbed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from memsvc.embedded import EmbeddedValkey
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.embedded_faults import crash
from tests.read_helpers import StartServer, pscope, stub_for
from tests.read_helpers import start_server as start_server  # fixture
from tests.test_explicit_memory import remember

HIT, MISS, BYPASSED = pb.CACHE_STATUS_HIT, pb.CACHE_STATUS_MISS, pb.CACHE_STATUS_BYPASSED
SKIPPED = pb.CACHE_STATUS_SKIPPED


@pytest.fixture
def valkey(tmp_path: Path) -> Iterator[EmbeddedValkey]:
    server = EmbeddedValkey(tmp_path / "own-valkey", persist=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def built_once(
    start_server: StartServer, caller: Caller, request: pb.PrefetchRequest, **settings: Any
) -> tuple[Any, Any]:
    """A memsvc with ``settings``, the caller's stub, and ``request``'s packet built once."""
    srv, channel = await start_server(**settings)
    own = stub_for(channel, caller)
    await remember(caller, "Prefers window seats")
    assert (await own.Prefetch(request, timeout=2)).cache == MISS
    return srv, own


@asynccontextmanager
async def redis_paused(valkey: EmbeddedValkey, ms: int) -> AsyncIterator[None]:
    """Every client of ``valkey`` held for ``ms`` (CLIENT PAUSE): a Redis that answers late.
    Leaving waits until the pause ends (UNPAUSE is itself held)."""
    admin = aioredis.Redis.from_url(valkey.url)
    try:
        await admin.execute_command("CLIENT", "PAUSE", ms, "ALL")
        yield
        await admin.execute_command("CLIENT", "UNPAUSE")
    finally:
        await admin.aclose()


async def test_redis_killed_mid_test(
    caller: Caller, valkey: EmbeddedValkey, start_server: StartServer
) -> None:
    _srv, channel = await start_server(redis_url=valkey.url, cache_retry_after_ms=200)
    own = stub_for(channel, caller)
    request = pb.PrefetchRequest(scope=pscope(), session_id="s")
    await remember(caller, "Prefers window seats")

    first = await own.Prefetch(request, timeout=2)
    assert first.cache == MISS and "window seats" in first.text
    assert (await own.Prefetch(request, timeout=2)).cache == HIT

    crash(valkey)
    down = await own.Prefetch(request, timeout=1)
    assert down.cache == BYPASSED and not down.degraded and down.text == first.text
    # Writes still work (their invalidation is best effort) and show up at once.
    await remember(caller, "Flies economy")
    fresh = await own.Prefetch(request, timeout=1)
    assert fresh.cache == BYPASSED and "Flies economy" in fresh.text

    await asyncio.to_thread(valkey.start)  # same port, empty
    deadline = time.monotonic() + 10
    while (reply := await own.Prefetch(request, timeout=1)).cache == BYPASSED:
        assert time.monotonic() < deadline, "the cache never came back"
        await asyncio.sleep(0.1)  # the cache pauses 200 ms after a failure
    assert reply.cache in (MISS, HIT)
    assert (await own.Prefetch(request, timeout=1)).cache == HIT


async def test_slow_redis_is_bypassed_within_the_deadline(
    caller: Caller, valkey: EmbeddedValkey, start_server: StartServer
) -> None:
    request = pb.PrefetchRequest(scope=pscope(), hint="travel")
    _srv, own = await built_once(
        start_server, caller, request, redis_url=valkey.url, redis_timeout_ms=50
    )
    async with redis_paused(valkey, 3000):
        started = time.monotonic()
        slow = await own.Prefetch(request, timeout=0.5)
        assert time.monotonic() - started < 0.5 + 1.0  # generous: a shared 2-core box
        assert slow.cache == BYPASSED and "window seats" in slow.text


async def test_a_deadline_shorter_than_the_redis_timeout_is_skipped_not_bypassed(
    caller: Caller, valkey: EmbeddedValkey, start_server: StartServer
) -> None:
    # Redis may take 5 s, and a failure would pause the cache for a minute: a call whose own
    # 0.5 s deadline runs out first says nothing about Redis.
    request = pb.PrefetchRequest(scope=pscope(), session_id="s")
    _srv, own = await built_once(
        start_server,
        caller,
        request,
        redis_url=valkey.url,
        redis_timeout_ms=5000,
        cache_retry_after_ms=60_000,
    )
    assert (await own.Prefetch(request, timeout=2)).cache == HIT
    async with redis_paused(valkey, 1500):
        assert (await own.Prefetch(request, timeout=0.5)).cache == SKIPPED
    # Redis was never down, so the cache was not paused: the next call is a hit at once.
    assert (await own.Prefetch(request, timeout=2)).cache == HIT


async def test_a_timeout_the_serving_loop_caused_pauses_nothing(
    caller: Caller, valkey: EmbeddedValkey, start_server: StartServer
) -> None:
    # The loop busy elsewhere for 80 ms (a burst of packet builds on a saturated machine) keeps
    # a cache operation from being sent within its 50 ms: that call says BYPASSED, and Redis,
    # fine all along, is not paused for the others. Redis itself silent that long still is.
    request = pb.PrefetchRequest(scope=pscope(), session_id="s")
    srv, own = await built_once(
        start_server,
        caller,
        request,
        redis_url=valkey.url,
        redis_timeout_ms=50,
        cache_retry_after_ms=60_000,
    )
    redis = srv.runtime.redis
    real_run = redis.run

    async def run_behind_a_stall(op: Any, *, timeout_s: float) -> Any:
        asyncio.get_running_loop().call_soon(time.sleep, 0.08)  # runs before op's first step
        return await real_run(op, timeout_s=timeout_s)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(redis, "run", run_behind_a_stall)
        stalled = await own.Prefetch(request, timeout=2)
    assert stalled.cache == BYPASSED and "window seats" in stalled.text
    assert (await own.Prefetch(request, timeout=2)).cache == HIT

    async with redis_paused(valkey, 300):
        assert (await own.Prefetch(request, timeout=2)).cache == BYPASSED
    assert (await own.Prefetch(request, timeout=2)).cache == BYPASSED  # paused for a minute
