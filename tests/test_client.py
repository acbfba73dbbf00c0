"""memsvc.client against live servers: deadline presets the server really budgets by, retries
only where safe (and never a duplicated Ingest), and ``ingest_nowait`` under a dead server."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import grpc
import pytest

from memsvc.client import (
    IngestFailure,
    MemoryClient,
    MemsvcCallError,
    RetryPolicy,
    message,
    scope,
)
from memsvc.client.retry import backoff_ms, retry_after_ms
from memsvc.server.app import MemsvcServer
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.read_helpers import TEST_MARGIN_MS, StartServer
from tests.read_helpers import start_server as start_server  # fixture

SLOW_MS = 30_000  # a slowed leg never finishes: the answer comes when the budget ends


class Recorder(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Test-side view of each attempt: its method, metadata, status and trailers.

    With ``lose_first_reply`` the first Ingest reaches the server and completes there, and the
    client is then told UNAVAILABLE, as when a connection drops after the server committed.
    """

    def __init__(self, *, lose_first_reply: bool = False) -> None:
        self.attempts: list[dict[str, Any]] = []
        self.lose_first_reply = lose_first_reply
        self.lost: list[Any] = []

    async def intercept_unary_unary(
        self, continuation: Callable[..., Awaitable[Any]], details: Any, request: Any
    ) -> Any:
        call = await continuation(details, request)
        code = await call.code()
        trailing = await call.trailing_metadata()
        self.attempts.append(
            {
                "method": details.method.decode()
                if isinstance(details.method, bytes)
                else details.method,
                "metadata": dict(details.metadata or ()),
                "timeout": details.timeout,
                "code": code,
                "trailing": dict(trailing or ()),
            }
        )
        if self.lose_first_reply and not self.lost and code == grpc.StatusCode.OK:
            self.lost.append(await call)
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details="connection lost after the server answered (simulated)",
            )
        return call


def client_for(port: int, caller: Caller, **kwargs: Any) -> MemoryClient:
    return MemoryClient(f"127.0.0.1:{port}", api_key=caller.key, **kwargs)


def ingest_request(session: str = "s1", text: str = "I live in Lisbon") -> pb.IngestRequest:
    return pb.IngestRequest(
        session_id=session,
        scope=scope("alice"),
        messages=[message(text, sender_id="alice")],
    )


async def outbox_rows(pool: asyncpg.Pool, tenant: str) -> int:
    async with pool.acquire() as conn:
        count: int = await conn.fetchval(
            "SELECT count(*) FROM ingest_outbox WHERE tenant_id = $1", tenant
        )
        return count


# -- pure parts -------------------------------------------------------------------------------


def test_backoff_grows_caps_and_yields_to_a_longer_server_hint() -> None:
    policy = RetryPolicy(initial_backoff_ms=10, max_backoff_ms=50, multiplier=2, jitter=0.0)
    assert [backoff_ms(policy, a, 0.5, None) for a in (1, 2, 3, 4)] == [10, 20, 40, 50]
    assert backoff_ms(policy, 1, 0.0, 300) == 300
    assert backoff_ms(policy, 3, 0.0, 5) == 40
    jittered = RetryPolicy(initial_backoff_ms=100, jitter=0.2)
    assert backoff_ms(jittered, 1, 0.999, None) == pytest.approx(80.02)


def test_retry_after_trailer_parsing() -> None:
    assert retry_after_ms((("retry-after-ms", "250"),)) == 250
    assert retry_after_ms((("other", "1"), ("retry-after-ms", b"7"))) == 7
    assert retry_after_ms((("retry-after-ms", "soon"),)) is None
    assert retry_after_ms(None) is None


# -- deadlines --------------------------------------------------------------------------------


async def test_deadline_presets_reach_the_server(caller: Caller, start_server: StartServer) -> None:
    """Both Recall legs sleep in PostgreSQL far past any deadline, so the server answers
    (OK, degraded) exactly when the budget it derived from the call's deadline runs out:
    its own ``timings.total_ms`` is that budget (deadline minus its margin) as the handler saw
    it. Nothing on the client side is measured."""
    srv, _ = await start_server(slow_stages_ms=dict((("dense", SLOW_MS), ("lexical", SLOW_MS))))
    request = pb.RecallRequest(scope=scope("alice"), query="coffee")
    async with client_for(srv.port, caller) as client:
        await client.recall(request, timeout=2.0)  # warm the channel and the query embedder
        voice = await client.recall(request, preset="voice")
        chat = await client.recall(request, preset="chat")
        explicit = await client.recall(request, preset="voice", timeout=0.5)
    for reply in (voice, chat, explicit):
        assert reply.degraded and set(reply.missing_legs) == {"dense", "lexical"}
    # Upper bounds are the deadline minus the server's margin; lower bounds leave room for the
    # time the request spent in transit and queued on a shared, busy event loop.
    assert 200 - TEST_MARGIN_MS - 120 < voice.timings.total_ms <= 200 - TEST_MARGIN_MS + 5
    assert 800 - TEST_MARGIN_MS - 200 < chat.timings.total_ms <= 800 - TEST_MARGIN_MS + 5
    assert 500 - TEST_MARGIN_MS - 200 < explicit.timings.total_ms <= 500 - TEST_MARGIN_MS + 5


async def test_request_id_and_api_key_travel_in_metadata(
    server: MemsvcServer, caller: Caller
) -> None:
    recorder = Recorder()
    async with client_for(server.port, caller, interceptors=[recorder]) as client:
        await client.list_memories(pb.ListMemoriesRequest(scope=scope("alice")), request_id="gw-1")
        await client.list_memories(pb.ListMemoriesRequest(scope=scope("alice")))
    first, second = recorder.attempts
    assert first["metadata"]["x-api-key"] == caller.key
    assert first["metadata"]["x-request-id"] == "gw-1"
    # The server echoes the id it used: ours, and a fresh one per call otherwise.
    assert first["trailing"]["x-request-id"] == "gw-1"
    assert second["trailing"]["x-request-id"] == second["metadata"]["x-request-id"] != "gw-1"


async def test_a_failed_call_names_its_code_and_request_id(server: MemsvcServer) -> None:
    async with MemoryClient(f"127.0.0.1:{server.port}", api_key="wrong") as client:
        with pytest.raises(MemsvcCallError) as err:
            await client.recall(pb.RecallRequest(scope=scope("alice"), query="x"), request_id="r-9")
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert err.value.request_id == "r-9" and err.value.attempts == 1


# -- retries ----------------------------------------------------------------------------------


async def test_ingest_retry_after_a_lost_reply_is_not_duplicated(
    server: MemsvcServer, caller: Caller, pool: asyncpg.Pool
) -> None:
    recorder = Recorder(lose_first_reply=True)
    async with client_for(server.port, caller, interceptors=[recorder]) as client:
        reply = await client.ingest(ingest_request(), timeout=5.0)
    first = recorder.lost[0]
    keys = [a["metadata"]["x-request-id"] for a in recorder.attempts]
    assert len(recorder.attempts) == 2 and keys[0] == keys[1]
    assert not first.duplicate and reply.duplicate
    assert reply.ingest_id == first.ingest_id
    assert await outbox_rows(pool, caller.tenant_id) == 1


async def test_reads_retry_on_resource_exhausted_after_the_servers_hint(
    caller: Caller, start_server: StartServer
) -> None:
    # One call per second per tenant: the second is refused with retry-after-ms ~1000.
    srv, _ = await start_server(tenant_rate_per_s=1.0, tenant_burst=1)
    recorder = Recorder()
    request = pb.ListMemoriesRequest(scope=scope("alice"))
    async with client_for(srv.port, caller, interceptors=[recorder]) as client:
        await client.list_memories(request, timeout=5.0)
        started = time.monotonic()
        await client.list_memories(request, timeout=5.0)
        elapsed = time.monotonic() - started
    codes = [a["code"] for a in recorder.attempts]
    assert codes[0] == grpc.StatusCode.OK and codes[-1] == grpc.StatusCode.OK
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes[1:-1]
    hinted = float(recorder.attempts[1]["trailing"]["retry-after-ms"])
    assert elapsed >= hinted / 1000 * 0.9


async def test_writes_are_never_retried(caller: Caller, start_server: StartServer) -> None:
    srv, _ = await start_server(tenant_rate_per_s=0.2, tenant_burst=1)
    recorder = Recorder()
    async with client_for(srv.port, caller, interceptors=[recorder]) as client:
        await client.remember(pb.RememberRequest(scope=scope("alice"), content="Likes tea"))
        for call in (
            client.remember(pb.RememberRequest(scope=scope("alice"), content="Likes jazz")),
            client.forget(pb.ForgetRequest(scope=scope("alice"), all_in_scope=True)),
        ):
            with pytest.raises(MemsvcCallError) as err:
                await call
            assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert err.value.attempts == 1
    assert len(recorder.attempts) == 3


# -- ingest_nowait ----------------------------------------------------------------------------


async def test_ingest_nowait_sends_in_the_background(
    server: MemsvcServer, caller: Caller, pool: asyncpg.Pool
) -> None:
    failures: list[IngestFailure] = []
    client = client_for(server.port, caller, on_ingest_failure=failures.append)
    started = time.monotonic()
    for i in range(5):
        assert client.ingest_nowait(ingest_request(session=f"s{i}"))
    assert time.monotonic() - started < 0.05  # handed over, not sent
    await client.aclose(flush_timeout_s=5.0)
    assert client.ingest_stats.sent == 5 and not failures
    assert await outbox_rows(pool, caller.tenant_id) == 5


async def test_ingest_nowait_under_a_stopped_server_never_raises(
    caller: Caller, start_server: StartServer
) -> None:
    srv, _ = await start_server()
    port = srv.port
    await srv.stop(grace_s=0.1)
    failures: list[IngestFailure] = []
    failed = asyncio.Event()

    def on_failure(failure: IngestFailure) -> None:
        failures.append(failure)
        if failure.reason == "failed":
            failed.set()

    client = client_for(
        port,
        caller,
        on_ingest_failure=on_failure,
        ingest_queue_size=4,
        ingest_senders=1,
        ingest_nowait_timeout_s=1.0,
        retry=RetryPolicy(max_attempts=2, initial_backoff_ms=20),
    )
    submitted = [client.ingest_nowait(ingest_request(session=f"s{i}")) for i in range(50)]
    assert not all(submitted)
    async with asyncio.timeout(10):
        await failed.wait()
    await client.aclose(flush_timeout_s=0.2)
    stats = client.ingest_stats
    reasons = {f.reason for f in failures}
    assert {"overflow", "failed"} <= reasons
    assert stats.sent == 0 and stats.submitted == 50
    assert stats.failed + stats.overflowed + stats.abandoned == 50 == len(failures)
    assert stats.overflowed == submitted.count(False)
    unavailable = [f for f in failures if f.reason == "failed"]
    assert all(
        f.error is not None and f.error.code == grpc.StatusCode.UNAVAILABLE for f in unavailable
    )
    # Keys were fixed at submission, so a failed request could be re-sent without duplicates.
    assert all(f.request.idempotency_key for f in failures)
    assert len({f.request.idempotency_key for f in failures}) == 50


async def test_ingest_nowait_keeps_the_callers_key(server: MemsvcServer, caller: Caller) -> None:
    key = f"k-{uuid.uuid4().hex}"
    async with client_for(server.port, caller) as client:
        request = ingest_request()
        request.idempotency_key = key
        first = await client.ingest(request)
        again = await client.ingest(request)
    assert again.duplicate and again.ingest_id == first.ingest_id
