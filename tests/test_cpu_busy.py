"""The machine gate: a saturated machine's CPUs make Recall skip its embedding and each
process admit fewer reads at a time (issue 17: never late when the machine is saturated).

The CPU readings are scripted (a fake of psutil.cpu_times' tuple), so the tests decide when
the machine is busy; the suite's own load never does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import namedtuple
from collections.abc import Iterator

import grpc
import pytest

from memsvc.errors import ResourceExhausted
from memsvc.overload.cpu_busy import CpuBusy
from memsvc.overload.load import Load, LoadLimits
from memsvc.overload.read_gate import InFlightLimit
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.read_helpers import StartServer, pscope, stub_for
from tests.read_helpers import start_server as start_server  # fixture
from tests.test_read_deadlines import seeded

Times = namedtuple("Times", "user system idle iowait")


class ScriptedCpu:
    """Cumulative CPU times that advance by 1 s of CPU per read, ``busy`` of it not idle."""

    def __init__(self, busy: float) -> None:
        self.busy = busy
        self._used = 0.0
        self._idle = 0.0

    def __call__(self) -> Times:
        self._used += self.busy
        self._idle += 1.0 - self.busy
        return Times(self._used * 0.7, self._used * 0.3, self._idle * 0.9, self._idle * 0.1)


def test_busy_is_the_share_not_idle_over_the_window() -> None:
    cpu = ScriptedCpu(0.25)
    busy = CpuBusy(read=cpu, window=2)
    busy.sample()
    assert busy.samples == 0  # one reading: no interval yet
    busy.sample()
    assert busy.busy == pytest.approx(0.25) and busy.samples == 1
    cpu.busy = 1.0
    busy.sample()
    assert busy.busy == pytest.approx((0.25 + 1.0) / 2)  # two intervals in the window
    busy.sample()
    assert busy.busy == pytest.approx(1.0)
    cpu.busy = 0.0
    busy.sample()
    busy.sample()
    assert busy.busy == pytest.approx(0.0) and busy.samples == 5


def _fill(limit: InFlightLimit, reads: int) -> None:
    """Hold ``reads`` slots at once (each admitted), then free them."""
    with contextlib.ExitStack() as held:
        for _ in range(reads):
            held.enter_context(limit.slot())


def test_a_saturated_machine_shrinks_the_read_cap_and_it_grows_back() -> None:
    cpu = ScriptedCpu(1.0)
    busy = CpuBusy(read=cpu, window=1)
    busy.sample()
    limit = InFlightLimit(32, load=Load(LoadLimits(max_cpu_busy=0.9), cpu=busy))
    assert limit.cap == InFlightLimit.START_CAP
    for _ in range(30):  # every measurement saturated: multiplicative decrease to the floor
        busy.sample()
        assert limit.cap < InFlightLimit.START_CAP
    assert limit.cap == InFlightLimit.MIN_CAP
    with contextlib.ExitStack() as held:
        for _ in range(InFlightLimit.MIN_CAP):
            held.enter_context(limit.slot())
        with pytest.raises(ResourceExhausted, match="saturated") as refused:
            held.enter_context(limit.slot())
    assert refused.value.retry_after_s is not None
    cpu.busy = 0.5
    for step in range(1, 6):  # additive increase while reads fill the cap
        busy.sample()
        _fill(limit, limit.cap)
        assert limit.cap == InFlightLimit.MIN_CAP + step
    # No new measurement, no change: the cap moves once per measurement, not per call.
    _fill(limit, limit.cap)
    assert limit.cap == limit.cap == InFlightLimit.MIN_CAP + 5


def test_a_cap_no_read_reached_does_not_grow() -> None:
    """Spare CPU says nothing about more reads at once unless reads were held back by the
    cap: after a quiet spell a burst meets the cap the last busy spell left."""
    cpu = ScriptedCpu(0.1)
    busy = CpuBusy(read=cpu, window=1)
    busy.sample()
    limit = InFlightLimit(32, load=Load(LoadLimits(max_cpu_busy=0.9), cpu=busy))
    for _ in range(20):  # an idle machine, a read at a time
        busy.sample()
        _fill(limit, 1)
    assert limit.cap == InFlightLimit.START_CAP
    # One measurement later, the reads that reached the cap count once, not per sample.
    _fill(limit, limit.cap)
    for _ in range(10):
        busy.sample()
    assert limit.cap == InFlightLimit.START_CAP + 1
    # A refusal at the cap counts as reaching it.
    with contextlib.ExitStack() as held:
        for _ in range(limit.cap):
            held.enter_context(limit.slot())
        with pytest.raises(ResourceExhausted, match="saturated"):
            held.enter_context(limit.slot())
    busy.sample()
    assert limit.cap == InFlightLimit.START_CAP + 2


def test_the_gate_off_never_shrinks_the_cap() -> None:
    busy = CpuBusy(read=ScriptedCpu(1.0), window=1)
    limit = InFlightLimit(4, load=Load(LoadLimits(max_cpu_busy=0.0), cpu=busy))
    for _ in range(10):
        busy.sample()
    assert limit.cap == 4


@pytest.fixture
def scripted() -> Iterator[ScriptedCpu]:
    yield ScriptedCpu(0.2)


async def test_recall_skips_its_embedding_while_the_machine_is_saturated(
    caller: Caller, start_server: StartServer, scripted: ScriptedCpu
) -> None:
    query = await seeded(caller)
    # A lexical leg of 300 ms: the burst below overlaps for sure.
    srv, channel = await start_server(
        reads_max_cpu_busy=0.9, slow_stages_ms=dict((("lexical", 300.0),))
    )
    cpu_busy = srv.runtime.load.cpu
    assert cpu_busy is not None  # the gate is on: the server measures the machine
    cpu_busy.stop()
    cpu_busy._read = scripted  # the test decides how busy the machine is
    stub = stub_for(channel, caller)

    for _ in range(3):  # the window holds scripted readings only
        cpu_busy.sample()
    calm = await stub.Recall(pb.RecallRequest(scope=pscope(), query=query), timeout=5)
    assert not calm.degraded, calm.missing_legs

    scripted.busy = 1.0
    cpu_busy.sample()
    cpu_busy.sample()
    other = "maya daughter name"  # not embedded before: a cached vector would cost nothing
    busy = await stub.Recall(pb.RecallRequest(scope=pscope(), query=other), timeout=5)
    assert busy.degraded and list(busy.missing_legs) == ["embed", "dense"]
    assert any("Maya" in item.text for item in busy.items)  # the lexical leg's

    # Many reads at once on a saturated machine: beyond the shrunk cap, refused at once.
    for _ in range(30):
        cpu_busy.sample()
    calls = [
        stub.Recall(pb.RecallRequest(scope=pscope(), query=f"coffee {i}"), timeout=5)
        for i in range(12)
    ]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
    assert refused and all(o.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for o in refused)
    assert "saturated" in (refused[0].details() or "")
    assert len(refused) < len(outcomes)  # the cap still admits some

    scripted.busy = 0.2
    for _ in range(40):
        cpu_busy.sample()
    again = await stub.Recall(pb.RecallRequest(scope=pscope(), query=query), timeout=5)
    assert not again.degraded
