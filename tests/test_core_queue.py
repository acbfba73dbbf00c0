"""The queue in front of the handlers: calls waiting in gRPC's core, measured from channelz's
counters, and reads refused at once while its oldest call has waited too long (issue 17:
never late under overload).

The unit tests script the counters and the clock; the end-to-end tests block a real server's
event loop while another thread's client sends calls, so they queue in gRPC's core exactly as
they do behind a saturated loop.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
import pytest

from memsvc.errors import ResourceExhausted
from memsvc.overload.core_queue import CoreQueue, Counters, read_counters, server_ids
from memsvc.overload.load import Load, LoadLimits
from memsvc.overload.read_gate import InFlightLimit
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import Caller
from tests.read_helpers import StartServer, pscope
from tests.read_helpers import start_server as start_server  # fixture
from tests.test_read_deadlines import seeded


class Scripted:
    """A clock and channelz counters the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0
        self.arrived = 0
        self.ended = 0
        self.reads = 0

    def clock(self) -> float:
        return self.now

    def read(self, server_id: int) -> Counters:
        assert server_id == 7
        self.reads += 1
        return self.arrived, self.ended


def watched(script: Scripted) -> CoreQueue:
    queue = CoreQueue(clock=script.clock, read=script.read)
    queue.watch(7)
    return queue


def test_the_wait_is_the_age_of_the_oldest_call_no_handler_took() -> None:
    script = Scripted()
    queue = watched(script)
    assert queue.sample() and queue.wait_s() == 0.0  # nothing arrived

    script.arrived = 3  # three calls, all in handlers
    for _ in range(3):
        queue.entered()
    script.now += 0.01
    queue.sample()
    assert queue.wait_s() == 0.0 and queue.waiting == 0

    script.arrived = 5  # two more, no handler free to take them
    script.now += 0.01
    queue.sample()
    assert queue.wait_s() == 0.0  # first counted now: no wait yet
    assert queue.waiting == 2
    script.now += 0.04
    assert queue.wait_s() == pytest.approx(0.04)  # the wait grows between samples
    queue.sample()
    assert queue.wait_s() == pytest.approx(0.04)  # dated by the sample that first counted it

    # The first two handlers end and the oldest queued call enters one; four more arrive:
    # the head of the queue is now the fifth call, counted with the fourth.
    queue.left()
    queue.left()
    script.ended = 2
    queue.entered()
    script.arrived = 9
    script.now += 0.02
    queue.sample()
    assert queue.waiting == 5 and queue.wait_s() == pytest.approx(0.06)
    # The queue drains: every call arrived is in a handler or ended.
    for _ in range(5):
        queue.entered()
    script.now += 0.01
    queue.sample()
    assert queue.wait_s() == 0.0 and queue.waiting == 0

    # Handlers that returned while the core has not sent their status yet are not queued.
    for _ in range(7):
        queue.left()
    script.now += 0.01
    queue.sample()
    assert queue.waiting == 0 and queue.wait_s() == 0.0


def test_calls_that_died_in_the_queue_are_not_taken_for_waiting_ones() -> None:
    script = Scripted()
    queue = watched(script)
    script.arrived = 3  # three calls queue; the core ends them (their deadline passed)
    queue.sample()
    script.now += 0.3
    assert queue.waiting == 3 and queue.wait_s() == pytest.approx(0.3)
    script.ended = 3
    script.now += 0.01
    queue.sample()  # seen empty: the three are known to have died
    assert queue.waiting == 0 and queue.wait_s() == 0.0
    script.arrived = 5  # two more: a handler takes the first, the second waits
    queue.entered()
    queue.sample()
    script.now += 0.02
    assert queue.waiting == 1 and queue.wait_s() == pytest.approx(0.02)


def test_a_stopped_measure_reports_no_queue() -> None:
    """Stopped (the server stops first), the last wait must not go on growing: Recall would
    degrade and the gate refuse on it during a graceful stop."""
    script = Scripted()
    queue = watched(script)
    script.arrived = 3
    queue.sample()
    script.now += 0.2
    assert queue.wait_s() == pytest.approx(0.2)
    queue.stop()
    assert queue.wait_s() == 0.0 and queue.waiting == 0


def test_nothing_is_read_until_a_server_is_watched() -> None:
    script = Scripted()
    queue = CoreQueue(clock=script.clock, read=script.read)
    queue.start()  # not watching: no thread
    assert not queue.sample() and queue.wait_s() == 0.0 and script.reads == 0
    queue.stop()


def test_a_call_older_than_the_history_is_at_least_as_old_as_the_oldest_sample() -> None:
    script = Scripted()
    queue = watched(script)
    script.arrived = 1
    queue.sample()
    for _ in range(100):  # 5 s of samples while the one call waits
        script.now += 0.05
        queue.sample()
    assert CoreQueue.HISTORY_S - 0.05 <= queue.wait_s() <= CoreQueue.HISTORY_S


def test_a_failed_read_turns_the_measure_off() -> None:
    script = Scripted()
    script.arrived = 2

    def broken(server_id: int) -> Counters:
        raise KeyError("server")

    queue = watched(script)
    queue.sample()
    script.now += 1.0
    assert queue.wait_s() == pytest.approx(1.0)
    queue._read = broken
    assert not queue.sample()
    assert not queue.watching and queue.wait_s() == 0.0


def test_the_read_gate_refuses_while_the_queue_is_old_and_admits_after() -> None:
    script = Scripted()
    queue = watched(script)
    limit = InFlightLimit(16, load=Load(LoadLimits(refuse_queue_s=0.05), queue=queue))
    script.arrived = 4
    queue.sample()
    script.now += 0.08
    with pytest.raises(ResourceExhausted) as refused, limit.slot(0.2):
        pass
    assert "80 ms" in str(refused.value) and "4 waiting" in str(refused.value)
    assert refused.value.retry_after_s is not None and refused.value.retry_after_s > 0
    for _ in range(4):
        queue.entered()
    queue.sample()
    with limit.slot(0.2):
        pass
    # Off (0): a queue however old is not looked at.
    queue.left()
    queue.sample()
    script.now += 1.0
    off = InFlightLimit(16, load=Load(LoadLimits(refuse_queue_s=0.0), queue=queue))
    with off.slot(0.2):
        pass


async def test_the_counters_of_a_real_server() -> None:
    before = server_ids()
    server = grpc.aio.server()
    (new,) = server_ids() - before
    server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        assert read_counters(new) == (0, 0)
    finally:
        await server.stop(None)


class Burst:
    """Recalls sent from threads with their own gRPC channel, beside the test's event loop
    (which is the server's): with the loop blocked, they queue in gRPC's core."""

    def __init__(self, port: int, key: str, query: str, calls: int) -> None:
        self._channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self._stub = memory_pb2_grpc.MemoryServiceStub(self._channel)
        self._query = query
        self._request = pb.RecallRequest(scope=pscope(), query=query)
        self._metadata = (("x-api-key", key),)
        self._pool = ThreadPoolExecutor(calls)
        self._calls = calls

    def connect(self) -> None:
        """One call answered (run it off the loop): the channel is connected before the burst."""
        self._stub.Recall(self._request, metadata=self._metadata, timeout=10)

    def _one(self, i: int) -> str:
        # A query of its own: a vector cached by an earlier call would cost nothing to use.
        request = pb.RecallRequest(scope=pscope(), query=f"{self._query} {i}")
        try:
            reply = self._stub.Recall(request, metadata=self._metadata, timeout=10)
            return f"OK degraded {list(reply.missing_legs)}" if reply.degraded else "OK"
        except grpc.RpcError as exc:
            hint = dict(exc.trailing_metadata() or ()).get("retry-after-ms")
            return f"{exc.code().name} (retry after {hint} ms): {exc.details()}"

    def send(self) -> list[Future[str]]:
        return [self._pool.submit(self._one, i) for i in range(self._calls)]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._channel.close()


async def burst_behind_a_blocked_loop(
    port: int, caller: Caller, query: str, *, calls: int = 12, block_s: float = 0.4
) -> list[str]:
    """The outcomes of ``calls`` Recalls sent while the server's event loop is blocked for
    ``block_s``, in the order they were sent."""
    burst = Burst(port, caller.key, query, calls)
    try:
        await asyncio.to_thread(burst.connect)
        futures = burst.send()
        time.sleep(block_s)  # noqa: ASYNC251 (the point: no handler takes a call meanwhile)
        return await asyncio.to_thread(lambda: [f.result(timeout=30) for f in futures])
    finally:
        await asyncio.to_thread(burst.close)


@pytest.mark.parametrize("max_queue_ms", [50, 0])
async def test_reads_queued_too_long_in_grpc_are_refused_at_once_with_the_gate_on(
    caller: Caller, start_server: StartServer, max_queue_ms: int
) -> None:
    query = await seeded(caller)
    srv, _channel = await start_server(reads_max_queue_ms=max_queue_ms)
    outcomes = await burst_behind_a_blocked_loop(srv.port, caller, query)
    refused = [o for o in outcomes if not o.startswith("OK")]
    if not max_queue_ms:
        assert not refused  # off: the same burst is answered
        return
    assert refused, outcomes
    for outcome in refused:
        assert outcome.startswith("RESOURCE_EXHAUSTED (retry after 100 ms)"), outcome
        assert "in its queue before a handler takes them" in outcome, outcome


@pytest.mark.parametrize("degrade_queue_ms", [50, 0])
async def test_recall_answers_without_its_embedding_while_calls_queue_in_grpc(
    caller: Caller, start_server: StartServer, degrade_queue_ms: int
) -> None:
    """The cheapest answer before a refusal: calls that queued behind a saturated loop are
    answered from the lexical leg alone (degraded, reason overload), none refused."""
    query = await seeded(caller)
    # The refusal gate far off either way: the queue is sampled in both cases.
    srv, _channel = await start_server(
        reads_degrade_queue_ms=degrade_queue_ms, reads_max_queue_ms=10_000
    )
    outcomes = await burst_behind_a_blocked_loop(srv.port, caller, query)
    assert all(o.startswith("OK") for o in outcomes), outcomes
    degraded = [o for o in outcomes if o != "OK"]
    if not degrade_queue_ms:
        assert not degraded, outcomes  # off: each call embeds its query
        return
    assert degraded, outcomes
    assert all(o == "OK degraded ['embed', 'dense']" for o in degraded), outcomes
    for _ in range(100):  # drained: the next samples see the queue empty
        if srv.runtime.core_queue.wait_s() == 0.0:
            break
        await asyncio.sleep(0.01)
    assert srv.runtime.core_queue.wait_s() == 0.0
