"""Packets ready before the call: after a write, the user's hint-less packet is rebuilt in
the background, so the next call setup is a cache hit (prefetch/warmer.py).

Each test runs a server of its own with warming on (the shared server has it off) and a
short delay, so a rebuild lands within the test's bounded wait.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY

from memsvc.cache.keys import warm_shapes_key
from memsvc.ingest.worker import OutboxWorker
from memsvc.server.app import MemsvcServer
from memsvc.server.runtime import worker_settings
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import msg
from tests.read_helpers import StartServer, pscope, stub_for
from tests.read_helpers import start_server as start_server  # fixture

HIT, MISS = pb.CACHE_STATUS_HIT, pb.CACHE_STATUS_MISS
DELAY_MS = 50
WAIT_S = 15.0


def warm_count(result: str) -> float:
    value = REGISTRY.get_sample_value("memsvc_prefetch_warm_total", {"result": result})
    return value or 0.0


async def until(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` until true; fail after WAIT_S."""
    step_s = 0.02
    for _ in range(int(WAIT_S / step_s)):
        if condition():
            return
        await asyncio.sleep(step_s)
    raise AssertionError("not settled in time")


class Warm:
    """A server with warming on, and the caller's stub on it."""

    def __init__(self, server: MemsvcServer, stub: Any) -> None:
        self.server = server
        self.stub = stub

    async def prefetch(self, user: str = "alice", **fields: Any) -> pb.PrefetchResponse:
        fields.setdefault("scope", pscope(user))
        fields.setdefault("session_id", f"s-{uuid.uuid4().hex[:6]}")
        reply: pb.PrefetchResponse = await self.stub.Prefetch(
            pb.PrefetchRequest(**fields), timeout=10
        )
        return reply

    async def remember(self, content: str, user: str = "alice") -> pb.Memory:
        reply = await self.stub.Remember(pb.RememberRequest(scope=pscope(user), content=content))
        return reply.memory  # type: ignore[no-any-return]

    async def settled(self, built_before: float, *, at_least: int = 1) -> None:
        """Wait (bounded) until ``at_least`` rebuilds happened since ``built_before`` and the
        warmer has nothing left to do."""
        warmer = self.server.runtime.warmer
        assert warmer is not None
        await until(lambda: warm_count("built") >= built_before + at_least and not warmer.pending)

    async def idle(self) -> None:
        """Wait until the warmer is done with everything queued (notifications included)."""
        warmer = self.server.runtime.warmer
        assert warmer is not None
        await asyncio.sleep(DELAY_MS / 1000 * 3)
        await until(lambda: not warmer.pending)


@pytest.fixture
async def warm(start_server: StartServer, caller: Caller) -> Warm:
    srv, channel = await start_server(prefetch_warm=True, prefetch_warm_delay_ms=DELAY_MS)
    return Warm(srv, stub_for(channel, caller))


def body(reply: pb.PrefetchResponse) -> str:
    """The packet without its header line (which names the session)."""
    return reply.text.split("\n\n", 1)[1] if "\n\n" in reply.text else reply.text


async def test_a_remember_warms_the_next_prefetch(warm: Warm) -> None:
    await warm.remember("I live in Lisbon")
    first = await warm.prefetch()
    assert first.cache == MISS
    await warm.idle()
    built = warm_count("built")
    await warm.remember("My sister is called Ana")
    await warm.settled(built)
    nxt = await warm.prefetch()
    assert nxt.cache == HIT
    assert "Ana" in nxt.text and "Lisbon" in nxt.text


async def test_worker_extraction_warms_the_packet(warm: Warm, caller: Caller) -> None:
    await warm.remember("I am a nurse")
    assert (await warm.prefetch()).cache == MISS
    await warm.idle()
    built = warm_count("built")
    await warm.stub.Ingest(
        pb.IngestRequest(
            scope=pscope(),
            session_id="s1",
            messages=[msg("alice", "I live in Lisbon")],
            idempotency_key=uuid.uuid4().hex,
        )
    )
    assert warm.server.settings.pg_dsn is not None
    runtime = warm.server.runtime
    worker = OutboxWorker(
        runtime.pool, runtime.pipeline, worker_settings(warm.server.settings),
        listener=runtime.listener,
    )  # fmt: skip
    assert await worker.drain() >= 1
    await warm.settled(built)
    nxt = await warm.prefetch()
    assert nxt.cache == HIT
    assert "Lisbon" in nxt.text


async def test_forget_warms_a_packet_without_the_fact(warm: Warm) -> None:
    gone = await warm.remember("I live in Lisbon")
    await warm.remember("I am a nurse")
    assert (await warm.prefetch()).cache == MISS
    await warm.idle()
    built = warm_count("built")
    await warm.stub.Forget(pb.ForgetRequest(scope=pscope(), memory_ids=[gone.memory_id]))
    await warm.settled(built)
    nxt = await warm.prefetch()
    assert nxt.cache == HIT
    assert "nurse" in nxt.text and "Lisbon" not in nxt.text


async def test_a_core_block_update_warms_the_packet(warm: Warm) -> None:
    await warm.remember("I am a nurse")
    assert (await warm.prefetch()).cache == MISS
    await warm.idle()
    built = warm_count("built")
    await warm.stub.UpdateCoreBlock(
        pb.UpdateCoreBlockRequest(
            scope=pscope(), block=pb.CORE_BLOCK_KIND_HUMAN,
            mode=pb.CORE_BLOCK_MODE_REPLACE, text="Prefers short answers.",
        )
    )  # fmt: skip
    await warm.settled(built)
    nxt = await warm.prefetch()
    assert nxt.cache == HIT
    assert "Prefers short answers." in nxt.text


async def test_a_burst_of_writes_rebuilds_a_few_times_only(warm: Warm) -> None:
    await warm.remember("I am a nurse")
    assert (await warm.prefetch()).cache == MISS
    await warm.idle()
    built = warm_count("built")
    for i in range(20):
        await warm.remember(f"My favourite number is {i}")
    await warm.settled(built)
    await warm.idle()
    assert warm_count("built") - built <= 3
    nxt = await warm.prefetch()
    assert nxt.cache == HIT
    assert "My favourite number is 19" in nxt.text


async def test_a_scope_never_prefetched_is_not_warmed(warm: Warm, redis_client: Any) -> None:
    await warm.remember("I am a nurse", user="bob")
    await warm.idle()
    built = warm_count("built")
    await warm.remember("I live in Lisbon", user="bob")
    await warm.idle()
    assert warm_count("built") == built
    assert (await warm.prefetch(user="bob")).cache == MISS


async def test_only_the_scopes_prefetched_are_warmed(warm: Warm, caller: Caller) -> None:
    """Another agent's packet of the same user was asked for; this one was not."""
    await warm.remember("I am a nurse")
    assert (await warm.prefetch(scope=pscope(agent="other"))).cache == MISS
    await warm.idle()
    built = warm_count("built")
    await warm.remember("I live in Lisbon")
    await warm.settled(built)
    assert (await warm.prefetch(scope=pscope(agent="other"))).cache == HIT
    assert (await warm.prefetch()).cache == MISS


async def test_the_warmed_packet_equals_a_built_one(
    warm: Warm, redis_client: Any, caller: Caller
) -> None:
    await warm.remember("I live in Lisbon")
    await warm.prefetch()
    await warm.idle()
    built = warm_count("built")
    await warm.remember("My sister is called Ana")
    await warm.settled(built)
    warmed = await warm.prefetch(session_id="call-2")
    assert warmed.cache == HIT
    # Drop the cached packets (not the shapes): the same request now builds.
    await warm.server.runtime.invalidator.drop_user(caller.tenant_id, "alice")
    rebuilt = await warm.prefetch(session_id="call-2")
    assert rebuilt.cache == MISS
    assert rebuilt.text == warmed.text
    assert body(rebuilt) and body(rebuilt) == body(warmed)
    assert await redis_client.exists(warm_shapes_key(caller.tenant_id, "alice"))


async def test_warming_off_leaves_the_next_prefetch_a_miss(
    start_server: StartServer, caller: Caller
) -> None:
    srv, channel = await start_server(prefetch_warm=False, prefetch_warm_delay_ms=DELAY_MS)
    off = Warm(srv, stub_for(channel, caller))
    assert srv.runtime.warmer is None
    await off.remember("I live in Lisbon")
    assert (await off.prefetch()).cache == MISS
    await off.remember("My sister is called Ana")
    await asyncio.sleep(DELAY_MS / 1000 * 5)
    assert (await off.prefetch()).cache == MISS


async def test_two_servers_rebuild_once(
    warm: Warm, start_server: StartServer, caller: Caller
) -> None:
    """Both hear the change; the Redis lock per (user, version) lets one of them build."""
    srv, channel = await start_server(prefetch_warm=True, prefetch_warm_delay_ms=DELAY_MS)
    other = Warm(srv, stub_for(channel, caller))
    await warm.remember("I am a nurse")
    assert (await warm.prefetch()).cache == MISS
    await warm.idle()
    await other.idle()
    built, skipped = warm_count("built"), warm_count("skipped")
    await warm.remember("I live in Lisbon")
    await warm.settled(built)
    await other.idle()
    assert warm_count("built") - built == 1
    assert warm_count("skipped") - skipped == 1
    assert (await other.prefetch()).cache == HIT


async def test_busy_reads_make_warming_wait_then_skip(warm: Warm) -> None:
    warmer = warm.server.runtime.warmer
    assert warmer is not None
    await warm.remember("I am a nurse")
    assert (await warm.prefetch()).cache == MISS
    await warm.idle()
    built, skipped = warm_count("built"), warm_count("skipped")
    warmer.busy = lambda: True
    await warm.remember("I live in Lisbon")
    await warm.idle()
    assert warm_count("built") == built
    assert warm_count("skipped") == skipped + 1
    assert (await warm.prefetch()).cache == MISS
