"""Deadlines of the read path, with legs slowed for real: a server-side pg_sleep before a
leg's SQL (a test-only setting), a held table lock, or an embedder that is slow to answer.

Every call here must come back OK (degraded, with the missing legs named) well before the
caller's deadline, and the abandoned database work must really stop.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable
from typing import Any

import asyncpg
import grpc
import pytest

from memsvc.concurrency.deadline import Budget
from memsvc.config import Settings
from memsvc.observability import metrics
from memsvc.retrieval.dense import dense_sql
from memsvc.retrieval.lexical import lexical_sql
from memsvc.retrieval.query import DEFAULT_KINDS
from memsvc.storage.pool import acquire
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import Caller
from tests.read_helpers import StartServer, pscope, stub_for
from tests.read_helpers import start_server as start_server  # fixture
from tests.slowed_stages import MARKER
from tests.test_explicit_memory import remember

FACT = pb.ITEM_TYPE_FACT
SLOW_S = 30  # far longer than any deadline here: if the reply came, the leg was abandoned
# The client, the servers and the test share one event loop on a shared 2-core box: timing
# is asserted only generously. What is asserted strictly is the status (OK, never
# DEADLINE_EXCEEDED) and what the answer says is missing.
SLACK_S = 1.0


async def active_queries(pool: asyncpg.Pool, pattern: str) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        rows: list[asyncpg.Record] = await conn.fetch(
            "SELECT pid, state, wait_event_type, query FROM pg_stat_activity"
            " WHERE query LIKE $1 AND state <> 'idle' AND pid <> pg_backend_pid()",
            f"%{pattern}%",
        )
        return rows


async def eventually_none(pool: asyncpg.Pool, pattern: str, within_s: float = 5.0) -> None:
    """The server shows no running query matching ``pattern`` (it may take a moment for the
    cancel request to land), long before the query would have ended by itself."""
    deadline = time.monotonic() + within_s
    while True:
        rows = await active_queries(pool, pattern)
        if not rows:
            return
        assert time.monotonic() < deadline, f"still running: {[r['query'][:80] for r in rows]}"
        await asyncio.sleep(0.05)


async def seeded(caller: Caller) -> str:
    await remember(caller, "Takes no sugar in coffee")
    await remember(caller, "Daughter is named Maya")
    return "coffee sugar"


async def timed(call: Awaitable[Any]) -> tuple[Any, float]:
    started = time.monotonic()
    reply = await call
    return reply, time.monotonic() - started


@pytest.mark.parametrize(
    ("slowed", "missing", "survivor"),
    [
        ("dense", ["dense"], "lexical"),
        ("lexical", ["lexical"], "dense"),
    ],
)
async def test_one_slow_leg_is_cancelled_and_the_other_answers(
    caller: Caller,
    pool: asyncpg.Pool,
    start_server: StartServer,
    slowed: str,
    missing: list[str],
    survivor: str,
) -> None:
    query = await seeded(caller)
    _srv, channel = await start_server(slow_stages_ms=dict(((slowed, SLOW_S * 1000),)))
    call = stub_for(channel, caller).Recall(
        pb.RecallRequest(scope=pscope(), query=query), timeout=0.6
    )
    reply, elapsed = await timed(call)
    assert elapsed < 0.6 + SLACK_S
    assert reply.degraded and list(reply.missing_legs) == missing
    assert reply.items and reply.items[0].text == "Takes no sugar in coffee"
    for item in reply.items:
        assert getattr(item, f"{slowed}_rank") == 0 and getattr(item, f"{survivor}_rank") > 0
    await eventually_none(pool, f"{MARKER}:{slowed}")


async def test_both_legs_slow_is_ok_empty_and_degraded(
    caller: Caller, pool: asyncpg.Pool, start_server: StartServer
) -> None:
    query = await seeded(caller)
    _srv, channel = await start_server(
        slow_stages_ms=dict((("dense", SLOW_S * 1000), ("lexical", SLOW_S * 1000)))
    )
    reply, elapsed = await timed(
        stub_for(channel, caller).Recall(pb.RecallRequest(scope=pscope(), query=query), timeout=0.4)
    )
    assert elapsed < 0.4 + SLACK_S
    assert reply.degraded and list(reply.items) == []
    assert list(reply.missing_legs) == ["dense", "lexical"]
    await eventually_none(pool, MARKER)


async def test_cancelled_leg_query_really_stops_on_the_server(
    caller: Caller, pool: asyncpg.Pool, start_server: StartServer
) -> None:
    query = await seeded(caller)
    _srv, channel = await start_server(slow_stages_ms=dict((("dense", SLOW_S * 1000),)))
    call = asyncio.ensure_future(
        stub_for(channel, caller).Recall(pb.RecallRequest(scope=pscope(), query=query), timeout=1.5)
    )
    # While the call runs, the slowed leg's query is visible on the server...
    deadline = time.monotonic() + 1.0
    while not await active_queries(pool, f"{MARKER}:dense"):
        assert time.monotonic() < deadline, "the slowed leg never reached the server"
        await asyncio.sleep(0.02)
    reply = await call
    assert reply.degraded and list(reply.missing_legs) == ["dense"]
    # ...and once the budget ran out it is gone, ~28 s before pg_sleep would have ended.
    await eventually_none(pool, f"{MARKER}:dense")


async def lock_memories(conn: asyncpg.Connection) -> None:
    """LOCK TABLE memories IN ACCESS EXCLUSIVE MODE in ``conn``'s transaction, asked for two
    seconds at a time (a savepoint each), for up to a minute.

    The lock waits for every open transaction on memories, and while it waits every new
    reader of the table queues behind it. Asked once with one long bound it failed in full
    CI runs, at 5 s and then at 60 s (the setup, not what this test checks): a transaction of
    earlier tests' background work that awaits another connection's read of memories cannot
    end while that read queues behind the lock. Withdrawing the request every two seconds
    lets such a transaction finish."""
    deadline = time.monotonic() + 60
    while True:
        try:
            async with conn.transaction():
                await conn.execute("SET LOCAL lock_timeout = '2s'")
                await conn.execute("LOCK TABLE memories IN ACCESS EXCLUSIVE MODE", timeout=10)
                await conn.execute("SET LOCAL lock_timeout = 0")
            return
        except asyncpg.LockNotAvailableError:
            holders = await conn.fetch(
                "SELECT a.pid, a.state, a.xact_start, left(a.query, 120) AS query"
                " FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                " WHERE l.relation = 'memories'::regclass AND l.granted"
                " AND a.pid <> pg_backend_pid()"
            )
            assert time.monotonic() < deadline, f"memories held for a minute by {holders}"
            await asyncio.sleep(0.2)


async def test_legs_blocked_by_a_lock_are_cancelled(
    caller: Caller, pool: asyncpg.Pool, start_server: StartServer
) -> None:
    query = await seeded(caller)
    # A server just started (its legs are the first on their connections), so the result
    # does not depend on which tests ran before: see memsvc/server/warmup.py.
    _srv, fresh = await start_server()
    async with pool.acquire() as locker:
        tx = locker.transaction()
        await tx.start()
        try:
            await lock_memories(locker)
            reply, elapsed = await timed(
                stub_for(fresh, caller).Recall(
                    pb.RecallRequest(scope=pscope(), query=query, types=[FACT]), timeout=0.5
                )
            )
            assert elapsed < 0.5 + SLACK_S
            # Both legs missing: their statements waited on the lock. The query's embedding is
            # not this test's matter (in one full run it missed the 0.5 s as well).
            assert reply.degraded and {"dense", "lexical"} <= set(reply.missing_legs)
            assert set(reply.missing_legs) <= {"embed", "dense", "lexical"}
            # The real leg statements were waiting on the lock; they were cancelled.
            await eventually_none(pool, "memsvc:recall")
        finally:
            await tx.rollback()
    after = await caller.stub.Recall(pb.RecallRequest(scope=pscope(), query=query))
    assert not after.degraded and after.items


async def test_slow_embedder_makes_the_dense_leg_missing(
    caller: Caller, start_server: StartServer
) -> None:
    await seeded(caller)
    _srv, channel = await start_server(slow_embedder_s=SLOW_S)
    reply, elapsed = await timed(
        stub_for(channel, caller).Recall(
            pb.RecallRequest(scope=pscope(), query="sugar in my coffee"), timeout=0.5
        )
    )
    assert elapsed < 0.5 + SLACK_S
    assert reply.degraded and list(reply.missing_legs) == ["embed", "dense"]
    assert reply.items[0].text == "Takes no sugar in coffee" and reply.items[0].dense_rank == 0
    # A caller-supplied vector needs no embedder: nothing is missing.
    vector = [0.05] * 384
    direct = await stub_for(channel, caller).Recall(
        pb.RecallRequest(scope=pscope(), query="coffee", query_vector=vector), timeout=0.5
    )
    assert not direct.degraded


async def test_no_deadline_uses_the_configured_default(
    caller: Caller, start_server: StartServer
) -> None:
    query = await seeded(caller)
    _srv, channel = await start_server(
        slow_stages_ms=dict((("dense", SLOW_S * 1000), ("lexical", SLOW_S * 1000))),
        recall_default_deadline_ms=300,
        recall_answer_headroom=0.0,
    )
    reply, elapsed = await timed(
        stub_for(channel, caller).Recall(
            pb.RecallRequest(scope=pscope(), query=query), timeout=None
        )
    )
    assert reply.degraded and 0.25 < elapsed < 5.0


async def test_legs_leave_the_answer_headroom_of_the_budget_unused(
    caller: Caller, start_server: StartServer
) -> None:
    # Both legs would run for ever: with half the budget kept for the answer's way out, a
    # 1 s call is answered after about half a second, not at its deadline.
    query = await seeded(caller)
    _srv, channel = await start_server(
        slow_stages_ms=dict((("dense", SLOW_S * 1000), ("lexical", SLOW_S * 1000))),
        recall_answer_headroom=0.5,
    )
    reply, elapsed = await timed(
        stub_for(channel, caller).Recall(pb.RecallRequest(scope=pscope(), query=query), timeout=1)
    )
    assert reply.degraded and list(reply.missing_legs) == ["dense", "lexical"]
    assert 0.4 < elapsed < 0.8


async def test_overload_is_shed_with_resource_exhausted(
    caller: Caller, start_server: StartServer
) -> None:
    query = await seeded(caller)
    _srv, channel = await start_server(
        slow_stages_ms=dict((("dense", SLOW_S * 1000),)), reads_max_in_flight=1
    )
    s = stub_for(channel, caller)
    first = asyncio.ensure_future(
        s.Recall(pb.RecallRequest(scope=pscope(), query=query), timeout=1.0)
    )
    await asyncio.sleep(0.2)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await s.Recall(pb.RecallRequest(scope=pscope(), query=query), timeout=1.0)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Refused on arrival, before anything of the call is checked: a bad key or request
    # would be thrown-away work for a saturated loop (the caller learns once it retries).
    bare = memory_pb2_grpc.MemoryServiceStub(channel)
    for request, metadata in (
        (pb.RecallRequest(scope=pscope(), query=query), (("x-api-key", "not-a-key"),)),
        (pb.RecallRequest(scope=pscope(), query=""), (("x-api-key", caller.key),)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await bare.Recall(request, metadata=metadata, timeout=1.0)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
        assert "more than 1 reads in flight" in (refused.value.details() or "")
    assert (await first).degraded
    # With room again, the same calls get their own answers.
    for request, metadata, code in (
        (
            pb.RecallRequest(scope=pscope(), query=query),
            (("x-api-key", "not-a-key"),),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
        (
            pb.RecallRequest(scope=pscope(), query=""),
            (("x-api-key", caller.key),),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as answered:
            await bare.Recall(request, metadata=metadata, timeout=1.0)
        assert answered.value.code() == code, answered.value


async def test_a_leg_cancelled_on_a_spent_budget_keeps_its_connection_and_nothing_leaks(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    # Issue 15. A leg that took its connection with almost no budget left (the dense leg
    # after a slow embed) used to give it back with that same sliver as the release bound:
    # asyncpg then dropped the connection while its cancel request was still connecting,
    # which cancelled asyncpg's own cancel task and could leave "Future exception was never
    # retrieved ... ConnectionError('unexpected connection_lost() call')" on the loop.
    loop = asyncio.get_running_loop()
    reports: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reports.append(context))
    assert settings.pg_dsn is not None
    one: asyncpg.Pool = await asyncpg.create_pool(settings.pg_dsn, min_size=1, max_size=1)
    try:
        async with one.acquire() as conn:
            pid = conn.get_server_pid()

        async def leg(tag: str) -> None:
            # A spent budget: acquire waits at most its 1 ms floor (the connection is idle).
            async with acquire(one, Budget(0), timeout_s=1.0, busy_is_late=True) as conn:
                await conn.execute(f"SELECT pg_sleep({SLOW_S}) /* {tag} */")

        for round_ in range(5):
            tag = f"{MARKER}:spent-{round_}"
            task = asyncio.create_task(leg(tag))
            deadline = time.monotonic() + 2.0
            while not await active_queries(pool, tag):
                assert time.monotonic() < deadline, "the leg's query never reached the server"
                await asyncio.sleep(0.01)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await eventually_none(pool, tag)
            # The cancel was acknowledged and the connection went back to the pool (the
            # same server process), not dropped.
            async with one.acquire() as conn:
                assert conn.get_server_pid() == pid, f"round {round_}: connection dropped"
        gc.collect()  # an unretrieved future reports itself when collected
    finally:
        await one.close()
        loop.set_exception_handler(previous)
    assert [(r.get("message"), r.get("exception")) for r in reports] == []


# -- Prefetch -------------------------------------------------------------------------------


async def test_prefetch_slow_walk_keeps_core_facts(
    caller: Caller, start_server: StartServer
) -> None:
    await remember(caller, "Vegetarian", role="core")
    await remember(caller, "Likes jazz")
    _srv, channel = await start_server(slow_stages_ms=dict((("prefetch_relevant", SLOW_S * 1000),)))
    reply, elapsed = await timed(
        stub_for(channel, caller).Prefetch(
            pb.PrefetchRequest(scope=pscope(), hint="music"), timeout=0.3
        )
    )
    assert elapsed < 0.3 + SLACK_S
    assert reply.degraded and reply.cache == pb.CACHE_STATUS_MISS
    assert "Vegetarian" in reply.text and "Likes jazz" not in reply.text
    assert reply.counts.core.shown == 1 and reply.counts.relevant.total == 0


async def test_prefetch_degraded_packets_are_not_cached(
    caller: Caller, start_server: StartServer
) -> None:
    await remember(caller, "Vegetarian", role="core")
    _srv, slow = await start_server(slow_stages_ms=dict((("prefetch_core", SLOW_S * 1000),)))
    reply = await stub_for(slow, caller).Prefetch(pb.PrefetchRequest(scope=pscope()), timeout=0.3)
    # The core leg is missing (the fact still shows among the recent ones).
    assert reply.degraded and reply.counts.core.total == 0
    # The shared server (no delays) must build a full packet, not serve the degraded one.
    full = await caller.stub.Prefetch(pb.PrefetchRequest(scope=pscope()))
    assert not full.degraded and full.cache == pb.CACHE_STATUS_MISS
    assert full.counts.core.shown == 1 and "Pinned and core facts" in full.text
    again = await caller.stub.Prefetch(pb.PrefetchRequest(scope=pscope()))
    assert again.cache == pb.CACHE_STATUS_HIT and again.text == full.text


async def test_prefetch_everything_slow_is_ok_and_empty(
    caller: Caller, pool: asyncpg.Pool, start_server: StartServer
) -> None:
    await remember(caller, "Vegetarian", role="core")
    _srv, channel = await start_server(
        slow_stages_ms=dict(
            (
                ("prefetch_core", SLOW_S * 1000),
                ("prefetch_relevant", SLOW_S * 1000),
            )
        ),
        prefetch_default_deadline_ms=250,
    )
    reply, elapsed = await timed(
        stub_for(channel, caller).Prefetch(pb.PrefetchRequest(scope=pscope()), timeout=None)
    )
    assert 0.2 < elapsed < 5.0
    assert reply.degraded and reply.text == "" and list(reply.facts) == []
    await eventually_none(pool, f"{MARKER}:prefetch")


async def test_prefetch_slow_embedder_falls_back_to_full_text(
    caller: Caller, start_server: StartServer
) -> None:
    await remember(caller, "Plays the cello on Sundays")
    _srv, channel = await start_server(slow_embedder_s=SLOW_S)
    reply, elapsed = await timed(
        stub_for(channel, caller).Prefetch(
            pb.PrefetchRequest(scope=pscope(), hint="cello lessons"), timeout=0.4
        )
    )
    assert elapsed < 0.4 + SLACK_S
    assert reply.degraded and "Plays the cello on Sundays" in reply.text


async def test_a_started_server_has_its_read_statements_prepared_on_every_connection(
    start_server: StartServer,
) -> None:
    # The warm-up (memsvc/server/warmup.py) ran both legs' statements on every pooled
    # connection before the port served: no caller's first read pays for preparing them
    # (nor waits behind a lock to do so).
    srv, _channel = await start_server()
    pool = srv.pool
    assert pool is not None
    wanted = {
        dense_sql(DEFAULT_KINDS, with_as_of=False),
        lexical_sql(DEFAULT_KINDS, with_as_of=False, with_cjk=False),
    }
    conns = [await pool.acquire() for _ in range(pool.get_size())]
    try:
        for conn in conns:
            rows = await conn.fetch("SELECT statement FROM pg_prepared_statements")
            assert wanted <= {r[0] for r in rows}
    finally:
        for conn in conns:
            await pool.release(conn)


async def test_a_busy_embedder_sends_a_new_recall_to_the_lexical_leg_at_once(
    caller: Caller, start_server: StartServer
) -> None:
    # Each embedding takes 300 ms: three queries ahead of a new one are about a second of
    # wait, more than half of its 1 s budget. It is not queued: it answers from the lexical
    # leg alone, at once, saying what is missing and why (the metric's reason).
    await seeded(caller)
    _srv, channel = await start_server(slow_embedder_s=0.3)
    stub = stub_for(channel, caller)
    first = await stub.Recall(pb.RecallRequest(scope=pscope(), query="who is Maya"), timeout=5)
    assert not first.degraded  # the embedder's cost is now known
    ahead = [
        asyncio.ensure_future(
            stub.Recall(pb.RecallRequest(scope=pscope(), query=f"coffee question {i}"), timeout=5)
        )
        for i in range(3)
    ]
    await asyncio.sleep(0.05)
    shed_before = metrics.RECALL_MISSING_LEGS.labels("embed", "overload")._value.get()
    reply, elapsed = await timed(
        stub.Recall(pb.RecallRequest(scope=pscope(), query="sugar in my coffee"), timeout=1.0)
    )
    assert reply.degraded and list(reply.missing_legs) == ["embed", "dense"]
    assert reply.items[0].text == "Takes no sugar in coffee" and reply.items[0].dense_rank == 0
    assert metrics.RECALL_MISSING_LEGS.labels("embed", "overload")._value.get() == shed_before + 1
    # It did not wait for the embedder (the three ahead of it need about 0.9 s).
    assert elapsed < 0.9
    for done in await asyncio.gather(*ahead):
        assert not done.degraded  # the queued ones were embedded within their 5 s


async def test_a_deadline_too_short_to_do_anything_says_so_not_busy(
    caller: Caller, start_server: StartServer
) -> None:
    # Issue 31: a Recall with a 1 ms deadline on an idle server answered "this server is
    # busy, retry shortly" (RESOURCE_EXHAUSTED): a client would retry the same doomed call.
    # Here the server keeps 400 ms back to answer, so a 300 ms deadline is spent on arrival
    # while the answer still reaches the caller in time.
    query = await seeded(caller)
    _srv, channel = await start_server(deadline_margin_ms=400, prefetch_default_deadline_ms=1000)
    stub = stub_for(channel, caller)
    warm = await stub.Recall(pb.RecallRequest(scope=pscope(), query=query), timeout=5)
    assert warm.items  # the read path has run once: its cheapest answer has a cost now
    calls = {
        "Recall": stub.Recall(pb.RecallRequest(scope=pscope(), query=query), timeout=0.3),
        "Prefetch": stub.Prefetch(pb.PrefetchRequest(scope=pscope(), hint=query), timeout=0.3),
        "Remember": stub.Remember(
            pb.RememberRequest(scope=pscope(), content="Owns a red bicycle"), timeout=0.3
        ),
    }
    for rpc, call in calls.items():
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, (rpc, err.value.details())
        assert (err.value.details() or "").startswith("deadline:"), (rpc, err.value.details())
