"""Per-tenant shares of every shared pool (issue 31, item 3): export and import slots, watch
streams, read slots and database connections. A tenant holding its whole share is refused
(naming its share); another tenant is served as if the first were idle. And a stalled reader
of a stream is cut off, told why, and lets go of what the stream held."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import grpc
import numpy as np
import numpy.typing as npt
import pytest

from memsvc.concurrency.deadline import Budget
from memsvc.concurrency.shares import TenantSlots, TenantWaits
from memsvc.config import Settings
from memsvc.embedding import Embedder
from memsvc.errors import ResourceExhausted
from memsvc.observability import call_context
from memsvc.server.app import MemsvcServer
from memsvc.storage import pool as pool_module
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.read_helpers import StartServer, WrappedEmbedder, pscope, stub_for
from tests.read_helpers import start_server as start_server  # fixture
from tests.test_export import export_sessions
from tests.test_export import seed_messages as seed_batch

C = grpc.StatusCode
EXPORT = pb.ExportMemoriesRequest(scope=pscope())
NewCaller = Callable[[], Awaitable[Caller]]


async def seed_messages(pool: asyncpg.Pool, scope: Scope, n: int) -> None:
    """``n`` messages in statements of 2,000 (one of 20,000 can outlast the statement
    timeout on a busy machine): enough that an export held open keeps streaming."""
    for i in range(0, n, 2_000):
        await seed_batch(pool, scope, min(2_000, n - i), session=f"big{i}")


# -- the shares themselves ------------------------------------------------------------------


def test_slots_refuse_a_tenant_past_its_share_and_not_the_others() -> None:
    slots = TenantSlots("things", total=3, per_tenant=2, retry_after_s=1.0)
    slots.take("a")
    slots.take("a")
    with pytest.raises(ResourceExhausted) as info:
        slots.take("a")
    assert "its share" in str(info.value) and info.value.retry_after_s == 1.0
    slots.take("b")  # the third slot: b was never behind a
    with pytest.raises(ResourceExhausted) as info:
        slots.take("c")
    assert "3 things are already running" in str(info.value)
    slots.give_back("a")
    with slots.hold("c"):
        assert slots.held("c") == 1 and slots.in_use == 3
    assert slots.in_use == 2 and slots.held("c") == 0


def test_a_share_follows_a_pool_that_shrinks_under_load() -> None:
    cap = [8]
    slots = TenantSlots(
        "reads", total=32, per_tenant=16, retry_after_s=1.0, share_now=lambda: cap[0] // 2
    )
    slots.take("z")  # another tenant reads: the shrinking share applies
    for _ in range(4):
        slots.take("a")
    with pytest.raises(ResourceExhausted) as info:
        slots.take("a")
    assert "holds 4 reads" in str(info.value)
    cap[0] = 4  # the machine got busier: a's share is now 2, b still gets its own
    slots.take("b")
    slots.take("b")
    with pytest.raises(ResourceExhausted):
        slots.take("b")
    cap[0] = 1
    assert slots.held("c") == 0
    slots.take("c")  # never less than one


def test_a_tenant_alone_is_held_by_the_pool_not_by_a_shrunk_share() -> None:
    slots = TenantSlots("reads", total=32, per_tenant=16, retry_after_s=1.0, share_now=lambda: 1)
    for _ in range(5):
        slots.take("a")  # nobody else holds a slot: the pool's own cap decides
    slots.take("b")  # b is alone in its share, and a's many do not stop it
    with pytest.raises(ResourceExhausted):
        slots.take("b")  # now a holds slots: b's shrunk share (1) applies


def test_no_own_cap_when_the_share_is_zero() -> None:
    slots = TenantSlots("things", total=2, per_tenant=0, retry_after_s=1.0)
    slots.take("a")
    slots.take("a")
    with pytest.raises(ResourceExhausted):
        slots.take("b")


async def test_waits_queue_a_tenant_behind_its_own_calls_only() -> None:
    waits = TenantWaits(1)
    async with waits.hold("a", 1.0):
        with pytest.raises(TimeoutError):
            async with waits.hold("a", 0.05):
                pytest.fail("a holds its only share")
        async with waits.hold("b", 0.05):
            assert waits.held("a") == waits.held("b") == 1
    assert waits.held("a") == 0
    async with waits.hold("a", 0.05):
        pass


# -- export and import slots ----------------------------------------------------------------


async def test_a_tenant_holding_its_exports_does_not_refuse_another_tenants(
    server: MemsvcServer, pool: asyncpg.Pool, new_caller: NewCaller
) -> None:
    """On a server with one slot per process for everyone, two exports held by A refused
    every other tenant's."""
    a, b = await new_caller(), await new_caller()
    for who in (a, b):
        await seed_messages(pool, Scope(who.tenant_id, "alice"), 20_000)
    share = server.settings.export_max_in_flight_per_tenant
    assert 1 <= share < server.settings.export_max_in_flight
    held: list[Any] = []
    try:
        for _ in range(share):
            call: Any = a.stub.ExportMemories(EXPORT, timeout=60)
            assert (await call.read()).type == "message"  # streaming, holding its slot
            held.append(call)
        # A's next one is refused, naming its share...
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in a.stub.ExportMemories(EXPORT, timeout=60):
                pytest.fail("A holds its share")
        assert info.value.code() == C.RESOURCE_EXHAUSTED
        assert "its share" in (info.value.details() or "")
        # ...and B, while A still holds it, exports everything.
        held.append(a.stub.ExportMemories(EXPORT, timeout=60))
        records = [r async for r in b.stub.ExportMemories(EXPORT, timeout=60)]
        assert records[-1].type == "summary" and len(records) == 20_001
    finally:
        for call in held:
            call.cancel()


async def test_a_tenant_holding_its_import_does_not_refuse_another_tenants(
    start_server: StartServer, new_caller: NewCaller
) -> None:
    _, ch = await start_server(import_max_in_flight=2, import_max_in_flight_per_tenant=1)
    a, b = await new_caller(), await new_caller()
    stub_a, stub_b = stub_for(ch, a), stub_for(ch, b)
    gate, asked = asyncio.Event(), asyncio.Event()

    async def held_lines() -> AsyncIterator[pb.ImportMemoriesRequest]:
        yield pb.ImportMemoriesRequest(scope=pscope())
        asked.set()  # the server reads past the first line: it holds the slot
        await gate.wait()  # A's import stays open, its lines still coming

    holding = stub_a.ImportMemories(held_lines(), timeout=60)
    try:
        await asyncio.wait_for(asked.wait(), timeout=30)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub_a.ImportMemories(iter([pb.ImportMemoriesRequest(scope=pscope())]))
        assert info.value.code() == C.RESOURCE_EXHAUSTED
        assert "its share" in (info.value.details() or "")
        # B imports while A holds its share (and one of the two slots).
        reply = await stub_b.ImportMemories(iter([pb.ImportMemoriesRequest(scope=pscope())]))
        assert isinstance(reply, pb.ImportMemoriesResponse)
    finally:
        gate.set()
        holding.cancel()


# -- watch streams --------------------------------------------------------------------------


async def test_a_tenant_holding_its_watch_streams_does_not_refuse_another_tenants(
    start_server: StartServer, new_caller: NewCaller
) -> None:
    _, ch = await start_server(watch_max_streams=3, watch_max_streams_per_tenant=2)
    a, b = await new_caller(), await new_caller()
    held: list[Any] = []
    try:
        for _ in range(2):
            call: Any = stub_for(ch, a).WatchMemories(
                pb.WatchMemoriesRequest(scope=pscope()), timeout=60
            )
            assert (await call.read()).kind == pb.CHANGE_KIND_HEARTBEAT
            held.append(call)
        refused: Any = stub_for(ch, a).WatchMemories(
            pb.WatchMemoriesRequest(scope=pscope()), timeout=60
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await refused.read()
        assert info.value.code() == C.RESOURCE_EXHAUSTED
        call = stub_for(ch, b).WatchMemories(pb.WatchMemoriesRequest(scope=pscope()), timeout=60)
        held.append(call)
        assert (await call.read()).kind == pb.CHANGE_KIND_HEARTBEAT
    finally:
        for call in held:
            call.cancel()


async def test_a_watch_stream_ends_at_its_longest_and_says_so(
    start_server: StartServer, caller: Caller
) -> None:
    _, ch = await start_server(watch_max_stream_s=0.5, watch_heartbeat_s=0.2)
    call: Any = stub_for(ch, caller).WatchMemories(
        pb.WatchMemoriesRequest(scope=pscope()), timeout=30
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        while True:
            msg = await call.read()
            assert msg is not grpc.aio.EOF
    assert info.value.code() == C.UNAVAILABLE
    assert "at most 0.5 s" in (info.value.details() or "")


# -- read slots -----------------------------------------------------------------------------


class HeldQueries(WrappedEmbedder):
    """The real embedder, except that a text containing ``HOLD`` waits for the test to let it
    go: a read stays in flight as long as the test needs, without any timing."""

    def __init__(self, inner: Embedder) -> None:
        super().__init__(inner)
        self.entered = 0
        self.release = asyncio.Event()

    async def embed(
        self, texts: Sequence[str], *, timeout_s: float | None = None
    ) -> npt.NDArray[np.float32]:
        if any("HOLD" in text for text in texts):
            self.entered += 1
            await self.release.wait()
        return await super().embed(texts, timeout_s=timeout_s)


@pytest.fixture
async def held_server(
    settings: Settings, embedder: Embedder
) -> AsyncIterator[tuple[grpc.aio.Channel, HeldQueries]]:
    held = HeldQueries(embedder)
    srv = MemsvcServer(
        settings.with_overrides(
            reads_max_in_flight=2,
            reads_max_in_flight_per_tenant=1,
            embed_timeout_ms=60_000,
            recall_default_deadline_ms=60_000,
        ),
        embedder=held,
        with_worker=False,
    )
    await srv.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}")
    try:
        yield channel, held
    finally:
        held.release.set()
        await channel.close()
        await srv.stop(grace_s=1.0)


async def test_a_tenant_holding_its_read_slots_does_not_refuse_another_tenants_recall(
    held_server: tuple[grpc.aio.Channel, HeldQueries], new_caller: NewCaller
) -> None:
    """With the read slots one pool for all, A's held Recalls took every slot and B's were
    refused."""
    ch, held = held_server
    a, b = await new_caller(), await new_caller()
    stub_a, stub_b = stub_for(ch, a), stub_for(ch, b)
    recall_b = pb.RecallRequest(scope=pscope(), query="hello")
    await stub_b.Recall(recall_b, timeout=30)  # its query's vector cached: no model wait later
    # A's read, held at the model (the model's queue is one at a time: one held is enough).
    first = asyncio.ensure_future(
        stub_a.Recall(pb.RecallRequest(scope=pscope(), query="HOLD"), timeout=60)
    )
    try:
        for _ in range(600):
            if held.entered == 1:
                break
            await asyncio.sleep(0.05)
        assert held.entered == 1  # in flight
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub_a.Recall(pb.RecallRequest(scope=pscope(), query="one more"), timeout=30)
        assert info.value.code() == C.RESOURCE_EXHAUSTED
        assert "its share" in (info.value.details() or "")
        reply = await stub_b.Recall(recall_b, timeout=30)
        assert not reply.degraded
    finally:
        held.release.set()
    assert isinstance(await first, pb.RecallResponse)


# -- database connections -------------------------------------------------------------------


async def test_a_tenant_at_its_connection_share_waits_for_its_own_and_others_do_not(
    settings: Settings, embedder: Embedder
) -> None:
    srv = MemsvcServer(
        settings.with_overrides(pg_pool_min=1, pg_pool_max=4, pg_pool_max_per_tenant=2),
        embedder=embedder,
        with_worker=False,
    )
    await srv.start()
    try:
        pool = srv.runtime.pool
        budget = Budget(30)

        async def hold_two(tenant: str, release: asyncio.Event) -> None:
            call_context.tenant.set(tenant)
            async with (
                pool_module.acquire(pool, budget, timeout_s=5),
                pool_module.acquire(pool, budget, timeout_s=5),
            ):
                await release.wait()

        async def one(tenant: str, timeout_s: float) -> int:
            call_context.tenant.set(tenant)
            async with pool_module.acquire(pool, budget, timeout_s=timeout_s) as conn:
                value: int = await conn.fetchval("SELECT 1")
                return value

        release = asyncio.Event()
        holder = asyncio.ensure_future(hold_two("a", release))
        for _ in range(200):
            if pool.get_size() - pool.get_idle_size() >= 2:
                break
            await asyncio.sleep(0.02)
        with pytest.raises(ResourceExhausted) as info:
            await asyncio.ensure_future(one("a", 0.2))
        assert "its share" in str(info.value)
        # B gets a connection at once while A holds its two (and waits, above, for its own).
        assert await asyncio.ensure_future(one("b", 5)) == 1
        # A's next call waits for A's own connection, and gets it when one comes back.
        waiting = asyncio.ensure_future(one("a", 10))
        release.set()
        await holder
        assert await waiting == 1
    finally:
        await srv.stop(grace_s=1.0)


# -- stalled readers ------------------------------------------------------------------------


async def test_a_stalled_export_reader_is_cut_off_told_why_and_lets_go(
    start_server: StartServer, caller: Caller, pool: asyncpg.Pool
) -> None:
    srv, ch = await start_server(stream_stall_s=0.5)
    await seed_messages(pool, Scope(caller.tenant_id, "alice"), 20_000)
    call: Any = stub_for(ch, caller).ExportMemories(EXPORT, timeout=60)
    assert (await call.read()).type == "message"
    # The reader stops reading: flow control holds the server's writes, then the stall cap
    # ends the stream, and its slot and snapshot go.
    for _ in range(400):
        if srv.runtime.export.in_flight == 0 and await export_sessions(pool) == 0:
            break
        await asyncio.sleep(0.05)
    assert srv.runtime.export.in_flight == 0
    with pytest.raises(grpc.aio.AioRpcError) as info:
        while True:
            record = await call.read()
            assert record is not grpc.aio.EOF, "the stream ended without saying why"
    assert info.value.code() == C.DEADLINE_EXCEEDED
    assert "accepted no message for 0.5 s" in (info.value.details() or "")


async def test_an_export_deadline_is_capped(
    start_server: StartServer, caller: Caller, pool: asyncpg.Pool
) -> None:
    srv, ch = await start_server(export_max_deadline_s=1, stream_stall_s=0)
    await seed_messages(pool, Scope(caller.tenant_id, "alice"), 20_000)
    call: Any = stub_for(ch, caller).ExportMemories(EXPORT, timeout=3600)
    assert (await call.read()).type == "message"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        while True:
            await asyncio.sleep(0.01)  # a slow reader, with an hour's deadline
            record = await call.read()
            assert record is not grpc.aio.EOF
    assert info.value.code() == C.DEADLINE_EXCEEDED
    for _ in range(200):
        if srv.runtime.export.in_flight == 0:
            break
        await asyncio.sleep(0.05)
    assert srv.runtime.export.in_flight == 0
