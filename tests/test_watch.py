"""WatchMemories: every kind of change, in commit order, resumable, against the real server.

A server of its own runs with short heartbeats and a small per-tenant cap, so idle streams
and refusals show within the test's time.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from memsvc.client import MemoryClient
from memsvc.config import Settings
from memsvc.embedding import Embedder
from memsvc.server.app import MemsvcServer
from memsvc.storage import notifications
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller, started_server
from tests.ingest_helpers import ingest, msg
from tests.read_helpers import prefetch, pscope, stub_for

HEARTBEAT_S = 0.4
PER_TENANT = 3
CREATED, SUPERSEDED, UPDATED = (
    pb.CHANGE_KIND_CREATED,
    pb.CHANGE_KIND_SUPERSEDED,
    pb.CHANGE_KIND_UPDATED,
)
FORGOTTEN, EXPIRED, ERASED, HEARTBEAT = (
    pb.CHANGE_KIND_FORGOTTEN,
    pb.CHANGE_KIND_EXPIRED,
    pb.CHANGE_KIND_ERASED,
    pb.CHANGE_KIND_HEARTBEAT,
)


@pytest.fixture(scope="module")
async def watch_server(settings: Settings, embedder: Embedder) -> AsyncIterator[MemsvcServer]:
    async with started_server(
        settings,
        embedder,
        watch_heartbeat_s=HEARTBEAT_S,
        watch_poll_s=0.5,
        watch_max_streams_per_tenant=PER_TENANT,
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
async def watch_channel(watch_server: MemsvcServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{watch_server.port}") as ch:
        yield ch


@pytest.fixture
def stub(caller: Caller, watch_channel: grpc.aio.Channel) -> Any:
    return stub_for(watch_channel, caller)


class Watch:
    """One open stream; ``next`` reads a message within a timeout."""

    def __init__(self, stub: Any, **fields: Any) -> None:
        fields.setdefault("scope", pscope())
        self.call = stub.WatchMemories(pb.WatchMemoriesRequest(**fields), timeout=60.0)

    async def next(self, within_s: float = 5.0) -> pb.MemoryChange:
        async with asyncio.timeout(within_s):
            msg = await self.call.read()
        assert msg is not grpc.aio.EOF, "the stream ended"
        assert isinstance(msg, pb.MemoryChange)
        return msg

    async def opened(self) -> int:
        """The opening heartbeat's position."""
        first = await self.next()
        assert first.kind == HEARTBEAT
        return first.position

    async def changes(self, n: int, within_s: float = 5.0) -> list[pb.MemoryChange]:
        """The next n changes, heartbeats skipped."""
        got: list[pb.MemoryChange] = []
        while len(got) < n:
            msg = await self.next(within_s)
            if msg.kind != HEARTBEAT:
                got.append(msg)
        return got

    async def quiet(self) -> pb.MemoryChange:
        """The next message is a heartbeat: nothing else came."""
        msg = await self.next(within_s=HEARTBEAT_S * 5)
        assert msg.kind == HEARTBEAT, msg
        return msg

    def close(self) -> None:
        self.call.cancel()


async def remember(stub: Any, content: str, **fields: Any) -> pb.Memory:
    fields.setdefault("scope", pscope())
    reply = await stub.Remember(pb.RememberRequest(content=content, **fields))
    assert isinstance(reply, pb.RememberResponse)
    return reply.memory


async def status_of(watch: Watch) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await watch.next()
    code = err.value.code()
    assert isinstance(code, grpc.StatusCode)
    return code


# -- each kind of change --------------------------------------------------------------------


async def test_remember_is_created_with_the_version_prefetch_then_reports(
    stub: Any, caller: Caller
) -> None:
    watch = Watch(stub)
    start = await watch.opened()
    memory = await remember(stub, "I live in Lisbon")
    (change,) = await watch.changes(1)
    assert change.kind == CREATED and change.memory_id == memory.memory_id
    assert change.position > start
    assert change.scope == pscope() and change.changed_at.seconds > 0
    packet = await prefetch(caller)  # the shared server: the same database
    assert change.version == packet.version > 0
    watch.close()


async def test_correct_is_created_and_superseded(stub: Any) -> None:
    old = await remember(stub, "My favourite colour is green")
    watch = Watch(stub)
    await watch.opened()
    new = await stub.Correct(
        pb.CorrectRequest(scope=pscope(), memory_id=old.memory_id, new_content="It is blue")
    )
    got = await watch.changes(2)
    by_kind = {c.kind: c for c in got}
    assert by_kind[CREATED].memory_id == new.memory_id
    assert by_kind[SUPERSEDED].memory_id == old.memory_id
    assert by_kind[SUPERSEDED].superseded_by_id == new.memory_id
    # One transaction: one version for both.
    assert got[0].version == got[1].version
    await watch.quiet()
    watch.close()


async def test_reinforcement_is_updated_and_forget_is_forgotten(stub: Any) -> None:
    memory = await remember(stub, "I play the cello")
    watch = Watch(stub)
    await watch.opened()
    again = await stub.Remember(pb.RememberRequest(scope=pscope(), content="I play the cello"))
    assert again.reinforced
    (updated,) = await watch.changes(1)
    assert updated.kind == UPDATED and updated.memory_id == memory.memory_id
    await stub.Forget(pb.ForgetRequest(scope=pscope(), memory_ids=[memory.memory_id]))
    (forgotten,) = await watch.changes(1)
    assert forgotten.kind == FORGOTTEN and forgotten.memory_id == memory.memory_id
    assert forgotten.position > updated.position and forgotten.version > updated.version
    watch.close()


async def test_ttl_expiry_is_expired_with_the_new_version(
    stub: Any, caller: Caller, pool: asyncpg.Pool, watch_server: MemsvcServer
) -> None:
    memory = await remember(
        stub, "I am in Rome this week", retention_policy=pb.RETENTION_POLICY_TTL,
        ttl=Duration(seconds=3600),
    )  # fmt: skip
    watch = Watch(stub)
    await watch.opened()
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE memories SET expires_at = now() - interval '1 second' WHERE tenant_id = $1",
            caller.tenant_id,
        )
    (moved,) = await watch.changes(1)  # the test's own UPDATE of expires_at
    assert moved.kind == UPDATED
    report = await watch_server.runtime.expiry.run_once()
    assert report.memories >= 1
    (expired,) = await watch.changes(1)
    assert expired.kind == EXPIRED and expired.memory_id == memory.memory_id
    packet = await prefetch(caller)
    assert expired.version == packet.version
    watch.close()


async def test_erase_user_leaves_one_erased_change_seen_by_every_scope(
    stub: Any, caller: Caller, pool: asyncpg.Pool
) -> None:
    await remember(stub, "I live in Oslo")
    await remember(stub, "I like sushi", scope=pscope(persona="p1"))
    whole = Watch(stub, whole_user=True, after_position=0)
    persona = Watch(stub, scope=pscope(persona="p1"))
    await whole.changes(2)
    await persona.opened()
    await stub.Forget(pb.ForgetRequest(scope=pscope(), erase_user=True))
    for watch in (whole, persona):
        (erased,) = await watch.changes(1)
        assert erased.kind == ERASED and erased.memory_id == ""
        assert erased.scope == pscope()
        watch.close()
    async with pool.acquire() as conn:
        kinds = await conn.fetch(
            "SELECT kind FROM memory_changes WHERE tenant_id = $1 AND user_id = 'alice'",
            caller.tenant_id,
        )
    assert [r["kind"] for r in kinds] == ["erased"]


async def test_extraction_and_session_end_are_created_and_expired(
    stub: Any, caller: Caller, drain: Callable[[], Awaitable[int]]
) -> None:
    watch = Watch(stub)
    await watch.opened()
    await ingest(caller, [msg("alice", "I live in Oslo.")], session="call-7")
    await drain()
    (created,) = await watch.changes(1)
    assert created.kind == CREATED
    noted = await remember(
        stub, "Call me back at noon", retention_policy=pb.RETENTION_POLICY_SESSION,
        session_id="call-7",
    )  # fmt: skip
    assert (await watch.changes(1))[0].memory_id == noted.memory_id
    await ingest(caller, [], session="call-7", end_of_session=True)
    await drain()
    ended = await watch.changes(1)
    assert [(c.kind, c.memory_id) for c in ended] == [(EXPIRED, noted.memory_id)]
    watch.close()


# -- scopes, positions, resuming ------------------------------------------------------------


async def test_exact_scope_sees_only_its_own_changes_whole_user_sees_all(stub: Any) -> None:
    exact = Watch(stub, scope=pscope(agent="bot-1"))
    whole = Watch(stub, whole_user=True)
    await exact.opened()
    await whole.opened()
    own = await remember(stub, "I drive a red car", scope=pscope(agent="bot-1"))
    other = await remember(stub, "I drive a blue car")
    persona = await remember(stub, "I drive a green car", scope=pscope(persona="p9"))
    await remember(stub, "I drive a van", scope=pscope(user="bob"))  # another user: unseen
    assert [c.memory_id for c in await whole.changes(3)] == [
        own.memory_id,
        other.memory_id,
        persona.memory_id,
    ]
    assert [c.memory_id for c in await exact.changes(1)] == [own.memory_id]
    quiet = await exact.quiet()
    # The heartbeat's position moved past the changes of the other scopes.
    assert quiet.position > 0
    exact.close()
    whole.close()


async def test_resume_gets_exactly_the_later_changes_and_zero_replays(stub: Any) -> None:
    ids = [(await remember(stub, f"I own {n} cats")).memory_id for n in range(2, 6)]
    replay = Watch(stub, after_position=0)
    got = await replay.changes(4)
    assert [c.memory_id for c in got] == ids
    assert [c.position for c in got] == sorted(c.position for c in got)
    await replay.quiet()
    replay.close()
    resumed = Watch(stub, after_position=got[1].position)
    assert [c.memory_id for c in await resumed.changes(2)] == ids[2:]
    await resumed.quiet()
    resumed.close()
    # Unset: from now on, nothing older.
    now = Watch(stub)
    assert await now.opened() == got[-1].position
    await now.quiet()
    now.close()


async def test_resuming_below_the_pruned_horizon_is_out_of_range(
    stub: Any, caller: Caller, pool: asyncpg.Pool, watch_server: MemsvcServer
) -> None:
    await remember(stub, "I was born in Porto")
    await remember(stub, "I studied in Coimbra")
    replay = Watch(stub, after_position=0)
    got = await replay.changes(2)
    replay.close()
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE memory_changes SET changed_at = now() - interval '8 days'"
            " WHERE tenant_id = $1 AND position = $2",
            caller.tenant_id,
            got[0].position,
        )
    # The expiry task prunes with MEMSVC_CHANGES_RETENTION_S (7 days by default).
    report = await watch_server.runtime.expiry.run_once()
    assert report.changes >= 1
    late = Watch(stub, after_position=got[0].position - 1)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await late.next()
    assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "after_position" in (err.value.details() or "")
    # At the horizon, and 0 (the oldest retained), still work.
    at = Watch(stub, after_position=got[0].position)
    assert [c.position for c in await at.changes(1)] == [got[1].position]
    at.close()
    oldest = Watch(stub, after_position=0)
    assert [c.position for c in await oldest.changes(1)] == [got[1].position]
    oldest.close()


async def test_an_idle_stream_sends_heartbeats_with_its_position(stub: Any) -> None:
    await remember(stub, "I like tea")
    watch = Watch(stub, after_position=0)
    (created,) = await watch.changes(1)
    beats = [await watch.quiet(), await watch.quiet()]
    assert [b.position for b in beats] == [created.position] * 2
    assert all(b.version == created.version for b in beats)
    watch.close()


async def test_positions_and_versions_count_no_other_tenants_writes(
    stub: Any,
    caller: Caller,
    new_caller: Callable[[], Awaitable[Caller]],
    watch_channel: grpc.aio.Channel,
    pool: asyncpg.Pool,
) -> None:
    """Issue 31: positions (and versions) came from one global counter, so the gap between
    two of tenant A's positions counted tenant B's writes. Now each is the user's own: the
    commit time in microseconds (or the user's last + 1), which A can read anyway."""
    other = stub_for(watch_channel, await new_caller())
    started_us = time.time_ns() // 1000
    first = await remember(stub, "I keep bees")
    for n in range(5):
        await remember(other, f"I own {n} boats")  # tenant B, the same user id
    second = await remember(stub, "I keep goats")
    replay = Watch(stub, after_position=0)
    got = await replay.changes(2)
    replay.close()
    assert [c.memory_id for c in got] == [first.memory_id, second.memory_id]
    assert all(c.position > started_us and c.version > started_us for c in got)
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT position, changed_at FROM memory_changes WHERE tenant_id = $1"
            " ORDER BY position",
            caller.tenant_id,
        )
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert [r["position"] for r in rows] == [
        (r["changed_at"] - epoch) // timedelta(microseconds=1) for r in rows
    ]


async def test_resuming_beyond_the_current_position_is_out_of_range(stub: Any) -> None:
    """Issue 31: after_position 10^15 was accepted, and the stream then never sent a change."""
    fresh = Watch(stub, after_position=5, scope=pscope(user="nobody-yet"))
    assert await status_of(fresh) == grpc.StatusCode.OUT_OF_RANGE
    await remember(stub, "I like figs")
    replay = Watch(stub, after_position=0)
    (created,) = await replay.changes(1)
    replay.close()
    beyond = 10**18 + 12345
    late = Watch(stub, after_position=beyond)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await late.next()
    assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
    details = err.value.details() or ""
    assert "after_position" in details and str(beyond) not in details
    # At the current position: accepted, and the next change arrives.
    at = Watch(stub, after_position=created.position)
    assert (await at.next()).kind == HEARTBEAT
    later = await remember(stub, "I like dates")
    assert [c.memory_id for c in await at.changes(1)] == [later.memory_id]
    at.close()


# -- commit order ---------------------------------------------------------------------------


async def test_positions_follow_commit_order_under_concurrent_writers(
    pool: asyncpg.Pool, caller: Caller
) -> None:
    """Writers commit changes for one user at once (random sizes and pauses before COMMIT);
    a reader polls all the while. Whatever a reader saw up to some position is never
    completed later by a lower position: resuming after what it saw misses nothing."""
    tenant, user = caller.tenant_id, "carol"
    rng = random.Random(7)
    snapshots: list[list[int]] = []
    done = asyncio.Event()

    async def writer() -> None:
        async with pool.acquire() as conn:
            for _ in range(40):
                async with conn.transaction():
                    for _ in range(rng.randint(1, 3)):
                        await conn.execute(
                            "INSERT INTO memory_changes (tenant_id, user_id, kind, memory_id)"
                            " VALUES ($1, $2, 'created', $3)",
                            tenant,
                            user,
                            uuid.uuid4(),
                        )
                    await asyncio.sleep(rng.random() * 0.003)

    async def reader() -> None:
        async with pool.acquire() as conn:
            while not done.is_set():
                rows = await conn.fetch(
                    "SELECT position FROM memory_changes WHERE tenant_id = $1"
                    " AND user_id = $2 AND position IS NOT NULL ORDER BY position",
                    tenant,
                    user,
                )
                snapshots.append([r["position"] for r in rows])

    reading = asyncio.ensure_future(reader())
    await asyncio.gather(*(writer() for _ in range(4)))
    done.set()
    await reading
    async with pool.acquire() as conn:
        final = [
            r["position"]
            for r in await conn.fetch(
                "SELECT position FROM memory_changes WHERE tenant_id = $1 AND user_id = $2"
                " ORDER BY position",
                tenant,
                user,
            )
        ]
    assert None not in final and len(final) == len(set(final))
    assert len(snapshots) > 10
    for seen in snapshots:
        if seen:
            assert [p for p in final if p <= seen[-1]] == seen


async def test_a_stream_under_concurrent_remembers_gets_each_once_in_order(stub: Any) -> None:
    watch = Watch(stub, whole_user=True)
    await watch.opened()
    written = await asyncio.gather(
        *(remember(stub, f"Fact number {n} is true", scope=pscope(agent=f"a{n % 3}"))
          for n in range(30))
    )  # fmt: skip
    got = await watch.changes(30)
    assert sorted(c.memory_id for c in got) == sorted(m.memory_id for m in written)
    positions = [c.position for c in got]
    assert positions == sorted(positions) and len(set(positions)) == 30
    await watch.quiet()
    watch.close()


# -- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"scope": None}, "scope"),
        ({"whole_user": True, "scope": pscope(agent="bot")}, "whole_user"),
        ({"after_position": -1}, "after_position"),
        ({"scope": pscope(user="")}, "user_id"),
    ],
)
async def test_bad_input_is_invalid_argument_naming_the_field(
    stub: Any, fields: dict[str, Any], named: str
) -> None:
    if fields.get("scope", pscope()) is None:
        call = stub.WatchMemories(pb.WatchMemoriesRequest(), timeout=5.0)
    else:
        fields.setdefault("scope", pscope())
        call = stub.WatchMemories(pb.WatchMemoriesRequest(**fields), timeout=5.0)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in (err.value.details() or "")


async def test_too_many_streams_of_a_tenant_is_resource_exhausted(
    stub: Any, watch_server: MemsvcServer
) -> None:
    held = [Watch(stub) for _ in range(PER_TENANT)]
    for watch in held:
        await watch.opened()
    extra = Watch(stub)
    assert await status_of(extra) == grpc.StatusCode.RESOURCE_EXHAUSTED
    held[0].close()
    for _ in range(50):  # the slot frees once the server sees the cancellation
        if watch_server.runtime.changes.open_streams < PER_TENANT:
            break
        await asyncio.sleep(0.05)
    again = Watch(stub)
    await again.opened()
    for watch in (*held[1:], again):
        watch.close()


async def test_client_helper_streams_and_resumes(
    watch_server: MemsvcServer, stub: Any, caller: Caller
) -> None:
    async with MemoryClient(f"127.0.0.1:{watch_server.port}", api_key=caller.key) as client:
        stream = client.watch_memories(pb.WatchMemoriesRequest(scope=pscope()), timeout=20.0)
        first = await anext(stream)
        assert first.kind == HEARTBEAT
        memory = await remember(stub, "I work in Berlin")
        change = await anext(stream)
        while change.kind == HEARTBEAT:
            change = await anext(stream)
        assert change.kind == CREATED and change.memory_id == memory.memory_id
        await stream.aclose()


# -- the other writers of issue 15 ------------------------------------------------------------


async def test_update_memory_is_updated_and_core_blocks_are_core_block_updated(stub: Any) -> None:
    from google.protobuf.field_mask_pb2 import FieldMask

    memory = await remember(stub, "I live near the sea")
    watch = Watch(stub)
    await watch.opened()
    await stub.UpdateMemory(
        pb.UpdateMemoryRequest(
            scope=pscope(), memory_id=memory.memory_id, update_mask=FieldMask(paths=["pinned"]),
            pinned=True,
        )
    )  # fmt: skip
    updated = [c for c in await watch.changes(1) if c.memory_id == memory.memory_id]
    assert [c.kind for c in updated] == [UPDATED]
    await stub.UpdateCoreBlock(
        pb.UpdateCoreBlockRequest(
            scope=pscope(), block=pb.CORE_BLOCK_KIND_PERSONA,
            mode=pb.CORE_BLOCK_MODE_REPLACE, text="A calm, patient tutor.",
        )
    )  # fmt: skip
    (block,) = await watch.changes(1)
    assert block.kind == pb.CHANGE_KIND_CORE_BLOCK_UPDATED
    assert block.block == pb.CORE_BLOCK_KIND_PERSONA and block.memory_id == ""
    assert block.position > updated[0].position
    watch.close()


async def test_a_dropped_listener_reconnects_and_no_change_is_lost(
    stub: Any, pool: asyncpg.Pool, watch_server: MemsvcServer
) -> None:
    stream = watch_server.runtime.changes
    watch = Watch(stub)
    await watch.opened()
    async with asyncio.timeout(5):
        await stream.listening.wait()
    async with pool.acquire() as conn:
        killed = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = $1 AND pid <> pg_backend_pid()",
            notifications.APPLICATION_NAME,
        )
    assert killed >= 1
    async with asyncio.timeout(5):
        await stream.dropped.wait()
    memory = await remember(stub, "I moved to Vienna")
    (change,) = await watch.changes(1)
    assert change.memory_id == memory.memory_id
    async with asyncio.timeout(10):
        await stream.listening.wait()
    watch.close()


async def test_client_helper_resumes_after_a_server_restart(
    settings: Settings, embedder: Embedder, caller: Caller
) -> None:
    """The server goes away mid-stream; changes committed meanwhile arrive once the helper
    reconnects (after the last position it got), and nothing arrives twice."""
    # Workers off: in a full run they would start on every earlier test's undrained outbox
    # rows and take the loop from the Remember this test times (CI once saw it miss 5 s).
    first = MemsvcServer(
        settings.with_overrides(watch_poll_s=0.2), embedder=embedder, with_worker=False
    )
    port = await first.start()
    second: MemsvcServer | None = None
    try:
        async with MemoryClient(f"127.0.0.1:{port}", api_key=caller.key) as client:
            stream = client.watch_memories(pb.WatchMemoriesRequest(scope=pscope()), timeout=60)
            assert (await anext(stream)).kind == HEARTBEAT
            before = await client.remember(pb.RememberRequest(scope=pscope(), content="I am 30"))
            change = await anext(stream)
            assert change.memory_id == before.memory.memory_id
            await first.stop(grace_s=0.1)
            second = MemsvcServer(
                settings.with_overrides(grpc_port=port, watch_poll_s=0.2),
                embedder=embedder,
                with_worker=False,
            )
            await second.start()
            after = await client.remember(pb.RememberRequest(scope=pscope(), content="I am 31"))
            seen = [c async for c in _until(stream, after.memory.memory_id)]
            assert [c.memory_id for c in seen if c.kind != HEARTBEAT] == [after.memory.memory_id]
            await stream.aclose()
    finally:
        for srv in (first, second):
            if srv is not None:
                await srv.stop(grace_s=0.1)


async def _until(
    stream: AsyncIterator[pb.MemoryChange], memory_id: str
) -> AsyncIterator[pb.MemoryChange]:
    async with asyncio.timeout(20):
        async for change in stream:
            yield change
            if change.memory_id == memory_id:
                return
