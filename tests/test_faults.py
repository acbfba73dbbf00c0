"""Faults injected for real: Redis killed or paused, PostgreSQL restarted under load, the pool
exhausted, SIGTERM to a `memsvc serve` under write load. Each test runs its own PostgreSQL,
valkey and memsvc (never the session's), and asserts what a caller sees: a well-defined status
within the deadline, recovery without restarting memsvc, and nothing acknowledged lost.

(A worker SIGKILLed mid-job is tested in test_workers.py.)
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest
import redis.asyncio as aioredis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memsvc.config import Settings
from memsvc.embedded import EmbeddedStack
from memsvc.embedding import Embedder
from memsvc.server.app import MemsvcServer
from memsvc.storage import api_keys
from memsvc.storage.migrate import migrate
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import LOAD_GATES_OFF, Caller, _KeyedStub
from tests.embedded_faults import crash, restart
from tests.ingest_helpers import ASSISTANT, msg
from tests.read_helpers import TEST_MARGIN_MS, pscope
from tests.slowed_stages import MARKER, slow_stages

OK = grpc.StatusCode.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
HIT, MISS, BYPASSED = pb.CACHE_STATUS_HIT, pb.CACHE_STATUS_MISS, pb.CACHE_STATUS_BYPASSED
DONE = pb.INGEST_STATE_DONE
# Added to every deadline before a call counts as late: client, servers and databases share
# one event loop or two cores, so timers fire late; a hang is seconds past, not this.
SLACK_S = 1.0


# -- a stack and servers of the test's own --------------------------------------------------


@pytest.fixture(autouse=True)
async def no_unhandled_loop_errors() -> AsyncIterator[None]:
    """Fail a test whose event loop saw an unhandled exception (a task's error nobody
    retrieved, a failing callback): under a fault that is a crash nobody would notice."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        yield
        gc.collect()  # tasks report an unretrieved error when they are collected
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert not seen, [f"{c.get('message')}: {c.get('exception')!r} {c.get('future')}" for c in seen]


@pytest.fixture
async def own_stack(tmp_path: Path) -> AsyncIterator[EmbeddedStack]:
    """PostgreSQL (durable: fsync on) and valkey for this test alone."""
    stack = EmbeddedStack(tmp_path / "stack", durable=True)
    await asyncio.to_thread(stack.start)
    try:
        yield stack
    finally:
        await asyncio.to_thread(stack.stop)


@dataclass
class Own:
    server: MemsvcServer
    channel: grpc.aio.Channel
    caller: Caller


StartOwn = Callable[..., Awaitable[Own]]


@pytest.fixture
async def start_own(own_stack: EmbeddedStack, embedder: Embedder) -> AsyncIterator[StartOwn]:
    """Factory: an in-process memsvc (port 0) on the test's stack, with a tenant and its key."""
    started: list[tuple[MemsvcServer, grpc.aio.Channel]] = []

    async def start(
        *,
        with_worker: bool = False,
        slow_stages_ms: Mapping[str, float] | None = None,
        **overrides: Any,
    ) -> Own:
        settings = Settings(
            grpc_host="127.0.0.1",
            grpc_port=0,
            pg_dsn=own_stack.postgres.dsn,
            redis_url=own_stack.valkey.url,
            auth_enabled=True,
            shutdown_grace_s=2.0,
            deadline_margin_ms=TEST_MARGIN_MS,
            metrics_port=None,
            **LOAD_GATES_OFF,
        ).with_overrides(**overrides)
        srv = MemsvcServer(settings, embedder=embedder, with_worker=with_worker)
        await srv.start()
        slow_stages(srv, slow_stages_ms or {})
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}")
        started.append((srv, channel))
        return Own(srv, channel, await _tenant(srv, channel))

    yield start
    for srv, channel in started:
        await channel.close()
        await srv.stop(grace_s=1.0)


async def _tenant(srv: MemsvcServer, channel: grpc.aio.Channel) -> Caller:
    assert srv.pool is not None
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    async with srv.pool.acquire() as conn:
        key = await api_keys.create_key(conn, tenant, "faults")
    stub = _KeyedStub(memory_pb2_grpc.MemoryServiceStub(channel), key)
    return Caller(tenant, key, stub)  # type: ignore[arg-type]


# -- calls, timed and classified ----------------------------------------------------------


@dataclass
class Call:
    """One RPC as the caller saw it: when it ran, its deadline, its status and reply."""

    rpc: str
    started: float
    ended: float
    timeout_s: float
    code: grpc.StatusCode
    reply: Any = None
    request: Any = None

    @property
    def elapsed(self) -> float:
        return self.ended - self.started


async def timed(stub: Any, rpc: str, request: Any, timeout_s: float, **kwargs: Any) -> Call:
    started = time.monotonic()
    try:
        reply = await getattr(stub, rpc)(request, timeout=timeout_s, **kwargs)
        code = OK
    except grpc.aio.AioRpcError as exc:
        reply, code = None, exc.code()
    return Call(rpc, started, time.monotonic(), timeout_s, code, reply, request)


def outcomes(calls: Iterable[Call]) -> Counter[tuple[str, str]]:
    return Counter((c.rpc, c.code.name) for c in calls)


def assert_within_deadlines(calls: Iterable[Call]) -> None:
    late = [
        (c.rpc, c.code.name, round(c.elapsed, 2))
        for c in calls
        if c.elapsed > c.timeout_s + SLACK_S
    ]
    assert not late, f"calls answered past their deadline: {late}"


def ingest_request(user: str, text: str, session: str = "s1") -> pb.IngestRequest:
    return pb.IngestRequest(
        scope=pscope(user),
        session_id=session,
        idempotency_key=uuid.uuid4().hex,
        messages=[msg(user, text), msg("assistant", "Noted.", role=ASSISTANT)],
    )


async def wait_done(stub: Any, ingest_ids: Iterable[str], timeout_s: float) -> dict[str, Any]:
    """Each job's final status once every one is DONE (or the timeout ran out)."""
    deadline = time.monotonic() + timeout_s
    found: dict[str, Any] = {}
    for ingest_id in ingest_ids:
        while True:
            reply = await stub.GetIngestStatus(
                pb.GetIngestStatusRequest(ingest_id=ingest_id), timeout=5
            )
            found[ingest_id] = reply
            if reply.state == DONE or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    return found


# -- Redis ----------------------------------------------------------------------------------

PREFETCH_S = 1.0
RECALL_S = 1.0


async def _reads_answer_without_the_cache(own: Own) -> None:
    stub = own.caller.stub
    prefetch = pb.PrefetchRequest(scope=pscope(), session_id="s", hint="seats")
    recall = pb.RecallRequest(scope=pscope(), query="window seats")
    for _ in range(3):
        p = await timed(stub, "Prefetch", prefetch, PREFETCH_S)
        r = await timed(stub, "Recall", recall, RECALL_S)
        assert_within_deadlines([p, r])
        assert p.code == OK and r.code == OK
        assert p.reply.cache == BYPASSED and not p.reply.degraded
        assert "window seats" in p.reply.text
        # Recall never touches Redis: complete, not degraded.
        assert not r.reply.degraded and "Prefers window seats" in [i.text for i in r.reply.items]


async def _cache_comes_back(own: Own) -> None:
    """HIT again without a restart of memsvc (it skips the cache for cache_retry_after_ms)."""
    prefetch = pb.PrefetchRequest(scope=pscope(), session_id="s", hint="seats")
    deadline = time.monotonic() + 10
    while (reply := await own.caller.stub.Prefetch(prefetch, timeout=PREFETCH_S)).cache != HIT:
        assert time.monotonic() < deadline, f"the cache never came back (last: {reply.cache})"
        await asyncio.sleep(0.1)


async def _warm(own: Own) -> None:
    stub = own.caller.stub
    await stub.Remember(pb.RememberRequest(scope=pscope(), content="Prefers window seats"))
    prefetch = pb.PrefetchRequest(scope=pscope(), session_id="s", hint="seats")
    assert (await stub.Prefetch(prefetch, timeout=5)).cache == MISS
    assert (await stub.Prefetch(prefetch, timeout=5)).cache == HIT


async def test_redis_killed_reads_answer_in_time_and_recover(
    own_stack: EmbeddedStack, start_own: StartOwn
) -> None:
    own = await start_own(cache_retry_after_ms=200)
    await _warm(own)

    crash(own_stack.valkey)
    await _reads_answer_without_the_cache(own)
    # Writes too: invalidation is best effort and bounded.
    write = await timed(
        own.caller.stub, "Remember", pb.RememberRequest(scope=pscope(), content="Flies economy"), 2
    )
    assert write.code == OK and write.elapsed < 2 + SLACK_S

    await asyncio.to_thread(own_stack.valkey.start)  # same port, no memsvc restart
    await _cache_comes_back(own)


async def test_redis_answering_slowly_is_bypassed_in_time_and_recovers(
    own_stack: EmbeddedStack, start_own: StartOwn
) -> None:
    own = await start_own(cache_retry_after_ms=200, redis_timeout_ms=50)
    await _warm(own)

    admin = aioredis.Redis.from_url(own_stack.valkey.url)
    try:
        # Every client's next command waits 2.5 s (DEBUG SLEEP is disabled in valkey).
        await admin.execute_command("CLIENT", "PAUSE", 2500, "ALL")
        paused = time.monotonic()
        await _reads_answer_without_the_cache(own)
        assert time.monotonic() - paused < 2.5, "the checks outlasted the pause: nothing proven"
        # UNPAUSE is itself held until the pause ends: this returns when Redis answers again.
        await admin.execute_command("CLIENT", "UNPAUSE")
    finally:
        await admin.aclose()
    await _cache_comes_back(own)


# -- PostgreSQL restarted under load ----------------------------------------------------------

LOAD_LOOPS = 6
CALL_S = 3.0
# Reads sleep this long in PostgreSQL (a real pg_sleep per stage), so some are in flight
# whenever the server goes down.
READ_STAGE_MS = 400


async def _mixed_load(own: Own, loop: int, stop: asyncio.Event, calls: list[Call]) -> None:
    stub = own.caller.stub
    user = f"u{loop}"
    cities = ["Lisbon", "Oslo", "Kyoto", "Quito", "Perth", "Accra"]
    i = 0
    while not stop.is_set():
        i += 1
        batch = [
            ("Ingest", ingest_request(user, f"I live in {cities[i % len(cities)]}.", f"s{i}")),
            ("Remember", pb.RememberRequest(scope=pscope(user), content=f"Note {loop}-{i}")),
            ("Recall", pb.RecallRequest(scope=pscope(user), query="where does she live")),
            ("Prefetch", pb.PrefetchRequest(scope=pscope(user), hint="home")),
        ]
        for rpc, request in batch:
            call = await timed(stub, rpc, request, CALL_S)
            calls.append(call)
            if call.code != OK:
                await asyncio.sleep(0.02)  # no tight loop while the database is down


@pytest.mark.timeout(120)
async def test_postgres_restarted_mid_load(own_stack: EmbeddedStack, start_own: StartOwn) -> None:
    own = await start_own(
        with_worker=True,
        slow_stages_ms=dict.fromkeys(
            ("dense", "lexical", "prefetch_core", "prefetch_relevant"), READ_STAGE_MS
        ),
        worker_lease_s=4.0,
        worker_job_timeout_s=3.0,
        worker_sweep_interval_s=0.5,
        worker_backoff_base_s=0.2,
    )
    calls: list[Call] = []
    stop = asyncio.Event()
    loops = [asyncio.create_task(_mixed_load(own, k, stop, calls)) for k in range(LOAD_LOOPS)]
    try:
        await asyncio.sleep(1.0)
        await _wait_for_sleeping_reads(own_stack.postgres.dsn)
        down = time.monotonic()
        await asyncio.to_thread(restart, own_stack.postgres)  # fast shutdown, same port
        up = time.monotonic()
        await asyncio.sleep(3.0)
    finally:
        stop.set()
        await asyncio.gather(*loops)

    seen = outcomes(calls)
    # Reads may also be shed at once while the outage slows the reads ahead of them
    # (admission.InFlightLimit); writes never are.
    assert {code for rpc, code in seen if rpc in ("Ingest", "Remember")} <= {"OK", "UNAVAILABLE"}
    assert {code for _rpc, code in seen} <= {"OK", "UNAVAILABLE", "RESOURCE_EXHAUSTED"}, seen
    assert_within_deadlines(calls)
    in_flight = [c for c in calls if c.started < down < c.ended]
    assert in_flight, "no call was in flight when PostgreSQL went down"
    # Fast: they end when their session does, not when their deadline would.
    assert all(c.ended - down < SLACK_S for c in in_flight), in_flight
    assert any(c.code == UNAVAILABLE for c in calls), f"the restart was never observed: {seen}"
    # The pool recovered by itself: every call sent a second after the restart succeeded.
    later = [c for c in calls if c.started > up + 1.0]
    assert {c.rpc for c in later} == {"Ingest", "Remember", "Recall", "Prefetch"}, seen
    assert all(c.code == OK for c in later), outcomes(later)

    # No acknowledged write is lost: every Ingest that got OK reaches done...
    acked = {c.reply.ingest_id: c.request for c in calls if c.rpc == "Ingest" and c.code == OK}
    assert acked
    final = await wait_done(own.caller.stub, acked, timeout_s=40)
    not_done = {i: pb.IngestState.Name(s.state) for i, s in final.items() if s.state != DONE}
    assert not not_done, not_done
    assert all(s.attempts >= 1 for s in final.values())
    # ...with every message it stored, and every Remember that got OK is listed.
    conn = await asyncpg.connect(own_stack.postgres.dsn)
    try:
        stored = dict(
            await conn.fetch(
                "SELECT ingest_id::text, count(*) FROM messages"
                " WHERE tenant_id = $1 GROUP BY ingest_id",
                own.caller.tenant_id,
            )
        )
    finally:
        await conn.close()
    assert {i: stored.get(i, 0) for i in acked} == {i: 2 for i in acked}
    remembered = [c for c in calls if c.rpc == "Remember" and c.code == OK]
    for loop in range(LOAD_LOOPS):
        listed = await own.caller.stub.ListMemories(
            pb.ListMemoriesRequest(scope=pscope(f"u{loop}"), page_size=500), timeout=5
        )
        ids = {m.memory_id for m in listed.memories}
        mine = [
            c.reply.memory.memory_id for c in remembered if c.request.scope.user_id == f"u{loop}"
        ]
        assert set(mine) <= ids


async def _wait_for_sleeping_reads(dsn: str, timeout_s: float = 10.0) -> None:
    """Until some read is inside its pg_sleep on the server (so it is in flight for sure)."""
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + timeout_s
        while not await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE $1", f"%{MARKER}%"
        ):
            assert time.monotonic() < deadline, "no read ever reached PostgreSQL"
            await asyncio.sleep(0.02)
    finally:
        await conn.close()


# -- the pool exhausted ------------------------------------------------------------------------

ACQUIRE_MS = 300


@pytest.mark.timeout(60)
async def test_exhausted_pool_answers_fast_and_clearly(start_own: StartOwn) -> None:
    own = await start_own(pg_pool_min=1, pg_pool_max=2, pg_acquire_timeout_ms=ACQUIRE_MS)
    srv, stub = own.server, own.caller.stub
    assert srv.pool is not None
    first = await stub.Remember(pb.RememberRequest(scope=pscope(), content="Prefers tea"))
    ingested = await stub.Ingest(ingest_request("alice", "I live in Oslo."))
    # A second tenant whose key the server has not seen yet (authentication needs the pool).
    newcomer = await _tenant(srv, own.channel)

    # Hold every pooled connection, each busy with pg_sleep, until told to let go.
    release = asyncio.Event()
    holding = asyncio.Semaphore(0)

    async def hog() -> None:
        async with srv.pool.acquire() as conn:  # type: ignore[union-attr]
            holding.release()
            while not release.is_set():
                await conn.execute("SELECT pg_sleep(0.1)")

    hogs = [asyncio.create_task(hog()) for _ in range(2)]
    try:
        for _ in hogs:
            await asyncio.wait_for(holding.acquire(), timeout=5)
        requests: list[tuple[Any, str, Any]] = [
            (stub, "Remember", pb.RememberRequest(scope=pscope(), content="Flies economy")),
            (stub, "Ingest", ingest_request("alice", "I live in Lima.")),
            (stub, "ListMemories", pb.ListMemoriesRequest(scope=pscope())),
            (stub, "GetIngestStatus", pb.GetIngestStatusRequest(ingest_id=ingested.ingest_id)),
            (stub, "Prefetch", pb.PrefetchRequest(scope=pscope(), hint="drinks")),
            (stub, "Recall", pb.RecallRequest(scope=pscope(), query="what does she drink")),
            (newcomer.stub, "ListMemories", pb.ListMemoriesRequest(scope=pscope())),
        ]
        starved = await asyncio.gather(*(timed(s, rpc, req, 2.0) for s, rpc, req in requests))
    finally:
        release.set()
        await asyncio.gather(*hogs)

    for c in starved:
        # Fast: the pool's acquire timeout, not the call's 2 s deadline.
        assert c.elapsed < ACQUIRE_MS / 1000 + SLACK_S, (c.rpc, c.code, c.elapsed)
        if c.rpc == "Recall":
            # Reads answer degraded rather than fail: no leg got a connection in time.
            assert c.code == OK and c.reply.degraded and not c.reply.items
            assert set(c.reply.missing_legs) >= {"dense", "lexical"}
        else:
            assert c.code == RESOURCE_EXHAUSTED, (c.rpc, c.code)

    # Connections back: everything works again, nothing was written by the refused calls.
    listed = await stub.ListMemories(pb.ListMemoriesRequest(scope=pscope()))
    assert [m.memory_id for m in listed.memories] == [first.memory.memory_id]
    assert (await newcomer.stub.ListMemories(pb.ListMemoriesRequest(scope=pscope()))).memories == []
    recall = await stub.Recall(pb.RecallRequest(scope=pscope(), query="tea"), timeout=5)
    assert not recall.degraded and [i.text for i in recall.items] == ["Prefers tea"]


# -- SIGTERM to `memsvc serve` under load --------------------------------------------------------

GRACE_S = 5
WRITE_LOOPS = 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _tenant_key(dsn: str) -> tuple[str, str]:
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn, embedding_dim=384)
        tenant = f"t-{uuid.uuid4().hex[:12]}"
        return tenant, await api_keys.create_key(conn, tenant, "faults")
    finally:
        await conn.close()


class Served:
    """`memsvc serve` in its own process, as production runs it."""

    def __init__(self, stack: EmbeddedStack, log_path: Path) -> None:
        self.port = _free_port()
        self._stack = stack
        self._log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSVC_")}
        env.update(
            MEMSVC_PG_DSN=self._stack.postgres.dsn,
            MEMSVC_REDIS_URL=self._stack.valkey.url,
            MEMSVC_GRPC_PORT=str(self.port),
            MEMSVC_SHUTDOWN_GRACE_S=str(GRACE_S),
            MEMSVC_METRICS_PORT="off",
            MEMSVC_WORKER_LEASE_S="5",
            MEMSVC_WORKER_JOB_TIMEOUT_S="4",
            MEMSVC_WORKER_SWEEP_INTERVAL_S="0.5",
        )
        with self._log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "memsvc",
                "--log-level",
                "WARNING",
                "serve",
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
            )
        await self._wait_serving()

    async def _wait_serving(self, timeout_s: float = 60) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                assert self.proc.returncode is None, self.log()
                try:
                    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                assert time.monotonic() < deadline, "memsvc serve never became ready"
                await asyncio.sleep(0.1)

    def log(self) -> str:
        return self._log_path.read_text(errors="replace")[-4000:]

    async def terminate(self, timeout_s: float) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), timeout=timeout_s)

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def _write_load(stub: Any, loop: int, stop: asyncio.Event, calls: list[Call]) -> None:
    """Remember and Ingest, one user per call, so each is all-or-nothing checkable in SQL."""
    i = 0
    while not stop.is_set():
        i += 1
        remember = pb.RememberRequest(scope=pscope(f"r-{loop}-{i}"), content=f"Likes tea no. {i}")
        ingest = ingest_request(f"i-{loop}-{i}", f"I live in Oslo and I play chess, {i}.")
        for rpc, request in (("Remember", remember), ("Ingest", ingest)):
            call = await timed(stub, rpc, request, 5.0)
            calls.append(call)
            if call.code != OK:
                await asyncio.sleep(0.05)


HOLD_S = 0.5


async def _hold_two_writes(conn: asyncpg.Connection, tenant: str) -> None:
    """In an open transaction: rows that a Remember of user `held-r` (its version bump) and
    an Ingest with key `held-key` (its outbox insert) will wait for, inside PostgreSQL."""
    await conn.execute("BEGIN")
    await conn.execute(
        "INSERT INTO scope_versions (tenant_id, user_id, version) VALUES ($1, 'held-r', 0)",
        tenant,
    )
    await conn.execute(
        "INSERT INTO ingest_outbox (tenant_id, user_id, ingest_id, idempotency_key, session_id,"
        " payload) VALUES ($1, 'held-i', gen_random_uuid(), 'held-key', 's1', '{}')",
        tenant,
    )


async def _wait_for_lock_waiters(dsn: str, count: int) -> None:
    # Its own connection: inside the holder's transaction pg_stat_activity would be a snapshot.
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + 10
        while (
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query ~ '^INSERT INTO (scope_versions|ingest_outbox) '"
            )
            < count
        ):
            assert time.monotonic() < deadline, "the held writes never reached their lock"
            await asyncio.sleep(0.02)
    finally:
        await conn.close()


@pytest.mark.timeout(120)
async def test_sigterm_under_load_finishes_in_flight_and_leaves_nothing_half_written(
    own_stack: EmbeddedStack, tmp_path: Path
) -> None:
    dsn = own_stack.postgres.dsn
    tenant, key = await _tenant_key(dsn)
    first = Served(own_stack, tmp_path / "serve-1.log")
    second = Served(own_stack, tmp_path / "serve-2.log")
    holder = await asyncpg.connect(dsn)
    try:
        await first.start()
        calls: list[Call] = []
        stop = asyncio.Event()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{first.port}") as channel:
            stub = _KeyedStub(memory_pb2_grpc.MemoryServiceStub(channel), key)
            loops = [
                asyncio.create_task(_write_load(stub, k, stop, calls)) for k in range(WRITE_LOOPS)
            ]
            await asyncio.sleep(1.5)
            # Two writes certainly in flight when the signal comes: waiting on a row lock.
            await _hold_two_writes(holder, tenant)
            remember = pb.RememberRequest(scope=pscope("held-r"), content="Held over SIGTERM")
            ingest = ingest_request("held-i", "I live in Lima.")
            ingest.idempotency_key = "held-key"
            held = [
                asyncio.create_task(timed(stub, "Remember", remember, 10.0)),
                asyncio.create_task(timed(stub, "Ingest", ingest, 10.0)),
            ]
            await _wait_for_lock_waiters(dsn, 2)
            signalled = time.monotonic()
            assert first.proc is not None
            first.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(HOLD_S)
            await holder.execute("ROLLBACK")  # the held writes go ahead, mid-shutdown
            code = await asyncio.wait_for(first.proc.wait(), timeout=GRACE_S + 20)
            exited = time.monotonic()
            stop.set()
            await asyncio.gather(*loops)
            held_calls = [await task for task in held]
        assert code == 0, first.log()
        assert exited - signalled < GRACE_S + SLACK_S, exited - signalled
        calls.extend(held_calls)

        # The held calls were in flight throughout and finished after the signal, in grace.
        for c in held_calls:
            assert c.code == OK and signalled + HOLD_S < c.ended < signalled + GRACE_S, c
        seen = outcomes(calls)
        assert {code for _rpc, code in seen} <= {"OK", "UNAVAILABLE", "CANCELLED"}, seen
        assert_within_deadlines(calls)
        assert all(c.ended <= signalled + GRACE_S + SLACK_S for c in calls if c.code == OK)
        # gRPC core answers CANCELLED (not UNAVAILABLE) for calls it had received but not yet
        # handed to memsvc when shutdown began: those must have written nothing.
        cancelled = [c for c in calls if c.code == grpc.StatusCode.CANCELLED]
        assert all(abs(c.ended - signalled) < SLACK_S for c in cancelled), cancelled

        # A new server on the same data: every acknowledged write is there, every job done.
        await second.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{second.port}") as channel:
            stub = _KeyedStub(memory_pb2_grpc.MemoryServiceStub(channel), key)
            for c in calls:
                if c.rpc == "Remember" and c.code == OK:
                    listed = await stub.ListMemories(
                        pb.ListMemoriesRequest(scope=c.request.scope), timeout=5
                    )
                    assert [m.memory_id for m in listed.memories] == [c.reply.memory.memory_id]
            acked = [c.reply.ingest_id for c in calls if c.rpc == "Ingest" and c.code == OK]
            final = await wait_done(stub, acked, timeout_s=40)
            assert all(s.state == DONE and s.attempts >= 1 for s in final.values()), {
                i: (pb.IngestState.Name(s.state), s.attempts) for i, s in final.items()
            }
        assert await second.terminate(timeout_s=GRACE_S + 20) == 0, second.log()
        await _assert_nothing_half_written(
            dsn, tenant, acked, never_ran=[c.request.scope.user_id for c in cancelled]
        )
    finally:
        await holder.close()
        await first.kill()
        await second.kill()


async def _assert_nothing_half_written(
    dsn: str, tenant: str, acked_ingests: list[str], *, never_ran: list[str]
) -> None:
    """Every write is all or nothing, whether or not its caller heard back:

    - a Remember (users r-*) is a memory row and its user's version bump, or neither;
    - an Ingest (users i-*) is its outbox row and both its messages, or none of them; no
      message belongs to an ingest that has no outbox row;
    - an extracted memory has the extraction_runs row written in its transaction, and every
      acknowledged Ingest's speaker has exactly one;
    - users of calls that never reached memsvc (``never_ran``) have nothing at all.
    """
    conn = await asyncpg.connect(dsn)
    try:
        assert not await conn.fetch(
            "SELECT user_id FROM memories WHERE tenant_id = $1 AND user_id = ANY($2::text[])"
            " UNION ALL SELECT user_id FROM ingest_outbox"
            " WHERE tenant_id = $1 AND user_id = ANY($2::text[])",
            tenant,
            never_ran,
        )
        memory_users = {
            r[0]
            for r in await conn.fetch(
                "SELECT DISTINCT user_id FROM memories WHERE tenant_id = $1 AND user_id LIKE 'r-%'",
                tenant,
            )
        }
        versioned = {
            r[0]
            for r in await conn.fetch(
                "SELECT user_id FROM scope_versions WHERE tenant_id = $1 AND user_id LIKE 'r-%'",
                tenant,
            )
        }
        assert memory_users == versioned
        assert not await conn.fetch(
            "SELECT user_id FROM memories WHERE tenant_id = $1 AND user_id LIKE 'r-%'"
            " GROUP BY user_id HAVING count(*) <> 1",
            tenant,
        )
        assert not await conn.fetch(
            "SELECT o.ingest_id, count(m.message_id) FROM ingest_outbox o"
            " LEFT JOIN messages m USING (tenant_id, user_id, persona_id, agent_id, ingest_id)"
            " WHERE o.tenant_id = $1 GROUP BY o.ingest_id HAVING count(m.message_id) <> 2",
            tenant,
        )
        assert not await conn.fetch(
            "SELECT m.ingest_id FROM messages m WHERE m.tenant_id = $1 AND NOT EXISTS"
            " (SELECT 1 FROM ingest_outbox o WHERE (o.tenant_id, o.user_id, o.ingest_id)"
            " = (m.tenant_id, m.user_id, m.ingest_id))",
            tenant,
        )
        assert not await conn.fetch(
            "SELECT m.memory_id FROM memories m WHERE m.tenant_id = $1"
            " AND m.ingest_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM extraction_runs r"
            " WHERE (r.tenant_id, r.user_id, r.persona_id, r.agent_id, r.ingest_id)"
            " = (m.tenant_id, m.user_id, m.persona_id, m.agent_id, m.ingest_id))",
            tenant,
        )
        runs = Counter(
            str(r[0])
            for r in await conn.fetch(
                "SELECT ingest_id FROM extraction_runs WHERE tenant_id = $1", tenant
            )
        )
        assert {i: runs[i] for i in acked_ingests} == {i: 1 for i in acked_ingests}
    finally:
        await conn.close()
