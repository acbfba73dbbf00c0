"""Per-tenant rate limit and concurrent-call cap: the arithmetic, then the real server, where
one tenant over its limits gets RESOURCE_EXHAUSTED with a retry hint and another does not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import pytest
from google.rpc import error_details_pb2, status_pb2

from memsvc.config import Settings
from memsvc.embedding import Embedder
from memsvc.errors import ResourceExhausted
from memsvc.server.admission import Bucket, TenantLimits, take_token
from memsvc.server.app import MemsvcServer
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.read_helpers import StartServer, WrappedEmbedder, stub_for
from tests.read_helpers import start_server as start_server  # fixture

LIST = pb.ListMemoriesRequest(scope=pb.Scope(user_id="alice"))

# -- the arithmetic ------------------------------------------------------------------------


def test_token_bucket_takes_refills_and_says_how_long_to_wait() -> None:
    bucket = Bucket(tokens=2.0, at=0.0)
    bucket, wait = take_token(bucket, 0.0, rate_per_s=4.0, burst=2.0)
    assert (bucket.tokens, wait) == (1.0, 0.0)
    bucket, wait = take_token(bucket, 0.0, rate_per_s=4.0, burst=2.0)
    assert (bucket.tokens, wait) == (0.0, 0.0)
    bucket, wait = take_token(bucket, 0.125, rate_per_s=4.0, burst=2.0)
    assert bucket.tokens == pytest.approx(0.5) and wait == pytest.approx(0.125)
    bucket, wait = take_token(bucket, 0.25, rate_per_s=4.0, burst=2.0)
    assert bucket.tokens == pytest.approx(0.0) and wait == 0.0
    # Idle for long: never more than the burst.
    bucket, _ = take_token(bucket, 100.0, rate_per_s=4.0, burst=2.0)
    assert bucket.tokens == pytest.approx(1.0)
    # A clock that goes backwards refills nothing.
    bucket, wait = take_token(Bucket(0.0, 5.0), 4.0, rate_per_s=4.0, burst=2.0)
    assert bucket.tokens == 0.0 and wait == pytest.approx(0.25)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rate_is_per_tenant_and_the_refusal_carries_the_wait() -> None:
    clock = FakeClock()
    limits = TenantLimits(rate_per_s=2.0, burst=2, max_in_flight=0, clock=clock)
    for _ in range(2):
        with limits.admit("a"):
            pass
    with pytest.raises(ResourceExhausted) as err, limits.admit("a"):
        pass
    assert err.value.retry_after_s == pytest.approx(0.5)
    assert "retry in 500 ms" in err.value.message
    with limits.admit("b"):  # another tenant is untouched
        pass
    clock.now = 0.5
    with limits.admit("a"):
        pass


def test_burst_defaults_to_one_seconds_worth() -> None:
    limits = TenantLimits(rate_per_s=3.0, burst=0, max_in_flight=0, clock=FakeClock())
    for _ in range(3):
        with limits.admit("a"):
            pass
    with pytest.raises(ResourceExhausted), limits.admit("a"):
        pass


def test_in_flight_cap_is_per_tenant_and_frees_on_exit() -> None:
    limits = TenantLimits(rate_per_s=0.0, burst=0, max_in_flight=2, clock=FakeClock())
    with limits.admit("a"), limits.admit("a"):
        assert limits.in_flight("a") == 2
        with pytest.raises(ResourceExhausted) as err, limits.admit("a"):
            pass
        assert err.value.retry_after_s is not None and err.value.retry_after_s > 0
        with limits.admit("b"):
            assert limits.in_flight("b") == 1
    assert limits.in_flight("a") == 0
    with pytest.raises(RuntimeError), limits.admit("a"):
        raise RuntimeError("the handler failed")
    assert limits.in_flight("a") == 0


def test_a_refused_call_spends_no_token() -> None:
    """Refused for concurrency, a call must not also use up the tenant's rate."""
    limits = TenantLimits(rate_per_s=1.0, burst=2, max_in_flight=1, clock=FakeClock())
    with limits.admit("a"):
        for _ in range(3):
            with pytest.raises(ResourceExhausted, match="in flight"), limits.admit("a"):
                pass
    with limits.admit("a"):  # the second token is still there
        pass


def test_zero_turns_them_off() -> None:
    limits = TenantLimits(rate_per_s=0.0, burst=0, max_in_flight=0)
    for _ in range(1000):
        with limits.admit("a"):
            pass


# -- on the server -------------------------------------------------------------------------


def retry_hint(err: grpc.aio.AioRpcError) -> tuple[float, int]:
    """(RetryInfo's delay in seconds, retry-after-ms) from the trailers; both required."""
    trailers = dict(err.trailing_metadata() or ())
    raw = trailers["grpc-status-details-bin"]
    assert isinstance(raw, bytes)
    status = status_pb2.Status.FromString(raw)
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert status.message == err.details()
    info = error_details_pb2.RetryInfo()
    assert len(status.details) == 1 and status.details[0].Unpack(info)
    return info.retry_delay.ToTimedelta().total_seconds(), int(trailers["retry-after-ms"])


async def test_a_tenant_over_its_rate_is_told_when_to_retry(
    start_server: StartServer, new_caller: Callable[[], Awaitable[Caller]]
) -> None:
    # Almost no refill: the outcome depends on the count of calls, never on timing.
    _, ch = await start_server(tenant_rate_per_s=0.001, tenant_burst=2)
    greedy, other = await new_caller(), await new_caller()
    stub = stub_for(ch, greedy)
    for _ in range(2):
        await stub.ListMemories(LIST)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListMemories(
            LIST, metadata=(("x-api-key", greedy.key), ("x-request-id", "greedy-3"))
        )
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "rate limit" in (err.value.details() or "")
    delay_s, after_ms = retry_hint(err.value)
    assert delay_s > 0 and after_ms >= 1
    assert after_ms == pytest.approx(delay_s * 1000, abs=1)
    assert dict(err.value.trailing_metadata() or ())["x-request-id"] == "greedy-3"
    # The other tenant has its own bucket, full.
    for _ in range(2):
        await stub_for(ch, other).ListMemories(LIST)


class GatedEmbedder(WrappedEmbedder):
    """The real embedder, held at a gate the test opens: a call stays in flight for as long
    as the test needs, without any timing."""

    def __init__(self, inner: Embedder) -> None:
        super().__init__(inner)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def embed(
        self, texts: Sequence[str], *, timeout_s: float | None = None
    ) -> npt.NDArray[np.float32]:
        self.entered.set()
        await self.release.wait()
        return await super().embed(texts, timeout_s=timeout_s)


@pytest.fixture
async def gated_server(
    settings: Settings, embedder: Embedder
) -> AsyncIterator[tuple[MemsvcServer, grpc.aio.Channel, GatedEmbedder]]:
    gate = GatedEmbedder(embedder)
    srv = MemsvcServer(
        settings.with_overrides(tenant_max_in_flight=1, embed_timeout_ms=60_000),
        embedder=gate,
        with_worker=False,
    )
    await srv.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}")
    try:
        yield srv, channel, gate
    finally:
        gate.release.set()
        await channel.close()
        await srv.stop(grace_s=1.0)


async def test_a_tenant_at_its_in_flight_cap_is_refused_and_others_are_not(
    gated_server: tuple[MemsvcServer, grpc.aio.Channel, GatedEmbedder],
    new_caller: Callable[[], Awaitable[Caller]],
) -> None:
    _, ch, gate = gated_server
    busy, other = await new_caller(), await new_caller()
    busy_stub: Any = stub_for(ch, busy)
    held = asyncio.ensure_future(
        busy_stub.Remember(
            pb.RememberRequest(scope=pb.Scope(user_id="alice"), content="held at the gate"),
            timeout=60,
        )
    )
    try:
        await asyncio.wait_for(gate.entered.wait(), timeout=30)  # in flight, past admission
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await busy_stub.ListMemories(LIST)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "in flight" in (err.value.details() or "")
        delay_s, after_ms = retry_hint(err.value)
        assert delay_s > 0 and after_ms >= 1
        assert list((await stub_for(ch, other).ListMemories(LIST)).memories) == []
    finally:
        gate.release.set()
    assert (await held).memory.content == "held at the gate"
    # The slot is free again.
    assert len((await busy_stub.ListMemories(LIST)).memories) == 1


def test_limit_settings_from_the_environment() -> None:
    s = Settings.from_env(
        {
            "MEMSVC_TENANT_RATE_PER_S": "12.5",
            "MEMSVC_TENANT_BURST": "40",
            "MEMSVC_TENANT_MAX_IN_FLIGHT": "8",
        }
    )
    assert (s.tenant_rate_per_s, s.tenant_burst, s.tenant_max_in_flight) == (12.5, 40, 8)
    # On by default (issue 31), at values one small tenant never meets.
    defaults = Settings()
    assert defaults.tenant_rate_per_s >= 100 and defaults.tenant_max_in_flight >= 64
    limits = TenantLimits(
        rate_per_s=defaults.tenant_rate_per_s,
        burst=defaults.tenant_burst,
        max_in_flight=defaults.tenant_max_in_flight,
    )
    with limits.admit("a"), limits.admit("a"):
        pass
