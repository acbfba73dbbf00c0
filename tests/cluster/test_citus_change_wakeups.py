"""On Citus every writer of memory changes wakes the change listeners itself.

The commit trigger's NOTIFY is gone from the shards (storage.citus_triggers), so each write
path notifies from its coordinator connection (storage.changes.Waker). A server of its own
watches with a poll and a heartbeat far beyond the tests' waits: a change that arrives within
seconds was delivered by a notification, not found by a later read. The writes go through the
suite's shared server (another process's listener, as with separate workers) and its drain.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask

from memsvc.config import Settings
from memsvc.embedding import Embedder
from memsvc.server.app import MemsvcServer
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller, started_server
from tests.ingest_helpers import ingest, msg
from tests.read_helpers import pscope, stub_for
from tests.test_import import export_lines, import_lines
from tests.test_watch import remember

# Far beyond any wait below: only a notification can bring a change in time.
SLOW_S = 120.0
PROMPT_S = 3.0
CAROL = pscope("carol")


@pytest.fixture(scope="module")
async def slow_server(settings: Settings, embedder: Embedder) -> AsyncIterator[MemsvcServer]:
    async with started_server(
        settings, embedder, watch_poll_s=SLOW_S, watch_heartbeat_s=SLOW_S
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
async def slow_channel(slow_server: MemsvcServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{slow_server.port}") as ch:
        yield ch


@pytest.fixture
def watcher(caller: Caller, slow_channel: grpc.aio.Channel) -> Any:
    return stub_for(slow_channel, caller)


class Stream:
    """A WatchMemories stream of the scope's whole user, read into a queue in the background
    (waiting on the queue never cancels the call, as a timed-out read would)."""

    def __init__(self, stub: Any, scope: pb.Scope) -> None:
        self._call = stub.WatchMemories(
            pb.WatchMemoriesRequest(scope=scope, whole_user=True), timeout=SLOW_S
        )
        self._queue: asyncio.Queue[pb.MemoryChange] = asyncio.Queue()
        self._pump = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for change in self._call:
            await self._queue.put(change)

    async def opened(self, server: MemsvcServer) -> None:
        """The opening heartbeat, once the server's LISTEN connection is up (a write before
        that would be found by the connect's catch-up read, not by its notification)."""
        first = await asyncio.wait_for(self._queue.get(), 10)
        assert first.kind == pb.CHANGE_KIND_HEARTBEAT
        async with asyncio.timeout(10):
            await server.runtime.changes.listening.wait()

    async def arrived(self) -> list[pb.MemoryChange]:
        """Every change that arrives until none has for PROMPT_S."""
        got: list[pb.MemoryChange] = []
        while True:
            try:
                change = await asyncio.wait_for(self._queue.get(), PROMPT_S)
            except TimeoutError:
                assert not self._pump.done(), self._pump
                return got
            if change.kind != pb.CHANGE_KIND_HEARTBEAT:
                got.append(change)

    async def close(self) -> None:
        self._call.cancel()
        self._pump.cancel()
        await asyncio.gather(self._pump, return_exceptions=True)


async def opened(watcher: Any, server: MemsvcServer, scope: pb.Scope) -> Stream:
    stream = Stream(watcher, scope)
    await stream.opened(server)
    return stream


async def test_a_remember_reaches_a_watch_stream_within_seconds(
    caller: Caller, watcher: Any, slow_server: MemsvcServer
) -> None:
    stream = await opened(watcher, slow_server, pscope())
    memory = await remember(caller.stub, "I live in Lisbon")
    got = await stream.arrived()
    assert [(c.kind, c.memory_id) for c in got] == [(pb.CHANGE_KIND_CREATED, memory.memory_id)]
    await stream.close()


@dataclass
class Writing:
    """What a write under test needs: the caller, the servers, and ``settle``, which reads
    everything its preparing writes sent to the stream, so only the write under test is left."""

    caller: Caller
    stream: Stream
    server: MemsvcServer
    drain: Callable[[], Awaitable[int]]
    pool: asyncpg.Pool

    async def settle(self) -> None:
        await self.stream.arrived()

    async def remember(self, content: str = "I am 40", **fields: Any) -> pb.Memory:
        return await remember(self.caller.stub, content, **fields)


# Each prepares, settles, then makes the write under test; it returns the kind of change that
# write must bring to the stream.
async def _correct(w: Writing) -> int:
    memory = await w.remember()
    await w.settle()
    await w.caller.stub.Correct(
        pb.CorrectRequest(scope=pscope(), memory_id=memory.memory_id, new_content="I am 41")
    )
    return pb.CHANGE_KIND_SUPERSEDED


async def _update(w: Writing) -> int:
    memory = await w.remember()
    await w.settle()
    await w.caller.stub.UpdateMemory(
        pb.UpdateMemoryRequest(
            scope=pscope(), memory_id=memory.memory_id, update_mask=FieldMask(paths=["pinned"]),
            pinned=True,
        )
    )  # fmt: skip
    return pb.CHANGE_KIND_UPDATED


async def _forget(w: Writing) -> int:
    memory = await w.remember()
    await w.settle()
    await w.caller.stub.Forget(pb.ForgetRequest(scope=pscope(), memory_ids=[memory.memory_id]))
    return pb.CHANGE_KIND_FORGOTTEN


async def _erase_user(w: Writing) -> int:
    await w.remember()
    await w.settle()
    await w.caller.stub.Forget(pb.ForgetRequest(scope=pscope(), erase_user=True))
    return pb.CHANGE_KIND_ERASED


async def _core_block(w: Writing) -> int:
    await w.caller.stub.UpdateCoreBlock(
        pb.UpdateCoreBlockRequest(
            scope=pscope(), block=pb.CORE_BLOCK_KIND_PERSONA,
            mode=pb.CORE_BLOCK_MODE_REPLACE, text="A calm, patient tutor.",
        )
    )  # fmt: skip
    return pb.CHANGE_KIND_CORE_BLOCK_UPDATED


async def _batch(w: Writing) -> int:
    await w.caller.stub.RememberBatch(
        pb.RememberBatchRequest(
            scope=pscope(),
            items=[pb.RememberRequest(content="I like tea"), pb.RememberRequest(content="I run")],
        )
    )
    return pb.CHANGE_KIND_CREATED


async def _import(w: Writing) -> int:
    # Alice's export into carol: the stream watches carol.
    await w.remember()
    lines = await export_lines(w.caller.stub, pscope())
    await import_lines(w.caller.stub, CAROL, lines, keep=False)
    return pb.CHANGE_KIND_CREATED


async def _extraction(w: Writing) -> int:
    await ingest(w.caller, [msg("alice", "I live in Oslo.")], session="call-1")
    await w.drain()
    return pb.CHANGE_KIND_CREATED


async def _session_end(w: Writing) -> int:
    await w.remember(
        "Call me back at noon", retention_policy=pb.RETENTION_POLICY_SESSION, session_id="call-2"
    )
    await w.settle()
    await ingest(w.caller, [], session="call-2", end_of_session=True)
    await w.drain()
    return pb.CHANGE_KIND_EXPIRED


async def _forget_session(w: Writing) -> int:
    await ingest(w.caller, [msg("alice", "My sister is called Maria.")], session="call-3")
    await w.drain()
    await w.settle()
    await w.caller.stub.ForgetSession(pb.ForgetSessionRequest(scope=pscope(), session_id="call-3"))
    return pb.CHANGE_KIND_FORGOTTEN


async def _expiry(w: Writing) -> int:
    await w.remember(
        "I am in Rome this week", retention_policy=pb.RETENTION_POLICY_TTL,
        ttl=Duration(seconds=3600),
    )  # fmt: skip
    async with w.pool.acquire() as conn:
        # The test's own write (not memsvc's: it wakes nobody on Citus), then the poll-less
        # stream has not read it; settle below reads nothing more, so expiry's wake must.
        await conn.execute(
            "UPDATE memories SET expires_at = now() - interval '1 second' WHERE tenant_id = $1",
            w.caller.tenant_id,
        )
    await w.settle()
    report = await w.server.runtime.expiry.run_once()
    assert report.memories >= 1
    return pb.CHANGE_KIND_EXPIRED


WRITES: dict[str, Callable[[Writing], Awaitable[int]]] = {
    "correct": _correct,
    "update_memory": _update,
    "forget": _forget,
    "erase_user": _erase_user,
    "update_core_block": _core_block,
    "remember_batch": _batch,
    "import": _import,
    "extraction": _extraction,
    "session_end": _session_end,
    "forget_session": _forget_session,
    "expiry": _expiry,
}


@pytest.mark.parametrize("write", sorted(WRITES))
async def test_every_writer_wakes_the_stream_within_seconds(
    write: str,
    caller: Caller,
    watcher: Any,
    slow_server: MemsvcServer,
    server: MemsvcServer,
    drain: Callable[[], Awaitable[int]],
    pool: asyncpg.Pool,
) -> None:
    """The stream opens first; after the preparing writes settle, the write under test must
    bring its change within seconds."""
    stream = await opened(watcher, slow_server, CAROL if write == "import" else pscope())
    try:
        kind = await WRITES[write](Writing(caller, stream, server, drain, pool))
        got = await stream.arrived()
    finally:
        await stream.close()
    assert kind in {c.kind for c in got}, f"{write}: no such change within {PROMPT_S} s: {got}"
