"""Workers: per-speaker isolation, retries, dead letters, lease takeover, SIGKILL, drain, quota."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Sequence

import orjson
import pytest

from memsvc.config import Settings
from memsvc.embedding import Embedder
from memsvc.extraction.base import (
    CandidateFact,
    Extraction,
    ExtractionError,
    ExtractionInput,
    Extractor,
)
from memsvc.extraction.openai_chat import OpenAIChatExtractor
from memsvc.extraction.rules import RulesExtractor
from memsvc.ingest.pipeline import ExtractionPipeline
from memsvc.ingest.reconcile import reconcile_once
from memsvc.ingest.worker import OutboxWorker
from memsvc.server.app import MemsvcServer
from memsvc.server.runtime import pipeline_settings, worker_settings
from memsvc.storage import outbox
from memsvc.storage.model import Scope
from memsvc.storage.outbox import Job
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import contents, ingest, msg, status
from tests.test_openai_extractor import FakeChat, chat, fact, fake_chat  # noqa: F401


class FailingFor(RulesExtractor):
    """The real rules extractor, except for chosen speakers, for whom it fails `times` times."""

    def __init__(self, speakers: set[str], times: int = 1_000) -> None:
        super().__init__()
        self.speakers = speakers
        self.remaining = times

    async def extract(self, data: ExtractionInput) -> Extraction:
        if data.speaker_id in self.speakers and self.remaining > 0:
            self.remaining -= 1
            raise ExtractionError("injected failure")
        return await super().extract(data)


class Scripted(RulesExtractor):
    """Proposes exactly the given candidates (sources rewritten to the speaker's turns)."""

    def __init__(self, facts: Sequence[CandidateFact]) -> None:
        super().__init__()
        self.facts = facts

    async def extract(self, data: ExtractionInput) -> Extraction:
        ids = tuple(t.message_id for t in data.turns)
        base = await super().extract(data)
        return dataclasses.replace(
            base, facts=tuple(dataclasses.replace(f, source_message_ids=ids) for f in self.facts)
        )


class Slow(RulesExtractor):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    async def extract(self, data: ExtractionInput) -> Extraction:
        await asyncio.sleep(self.seconds)
        return await super().extract(data)


def make_worker(
    server: MemsvcServer,
    extractor: Extractor,
    *,
    settings: Settings | None = None,
    embedder: Embedder | None = None,
    **worker: float,
) -> OutboxWorker:
    s = settings or server.settings
    runtime = server.runtime
    pipeline = ExtractionPipeline(
        runtime.pool,
        embedder or runtime.embedder,
        extractor,
        runtime.invalidator,
        pipeline_settings(s),
    )
    ws = dataclasses.replace(worker_settings(s), **worker)  # type: ignore[arg-type]
    return OutboxWorker(runtime.pool, pipeline, ws, listener=runtime.listener)


async def drain_all(worker: OutboxWorker, rounds: int = 20, pause_s: float = 0.05) -> None:
    for _ in range(rounds):
        await worker.drain()
        await asyncio.sleep(pause_s)


async def test_one_speakers_failure_never_rolls_back_another(caller: Caller, server, pool) -> None:  # type: ignore[no-untyped-def]
    reply = await ingest(
        caller, [msg("alice", "I live in Oslo."), msg("bob", "I work at Equinor.")]
    )
    flaky = FailingFor({"bob"}, times=1)
    # A retry delay (60 s, no jitter) far longer than one drain, on any machine: the first
    # drain ends after one attempt (with 1 s a loaded machine ran the retry in the same drain).
    worker = make_worker(server, flaky, backoff_base_s=60.0, backoff_jitter=0.0)
    await worker.drain()
    first = await status(caller, reply.ingest_id)
    assert first.state == pb.INGEST_STATE_PENDING
    assert first.attempts == 1 and first.last_error == "SpeakerFailures: ExtractionError"
    assert await contents(caller, "alice") == ["The user lives in Oslo."]
    assert await contents(caller, "bob") == []
    # The retry is due now rather than in a minute.
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE ingest_outbox SET available_at = now() WHERE ingest_id = $1",
            uuid.UUID(reply.ingest_id),
        )
    await drain_all(worker, rounds=20, pause_s=0.1)
    done = await status(caller, reply.ingest_id)
    assert done.state == pb.INGEST_STATE_DONE and done.attempts == 2
    # Alice was not processed twice; the outcome still counts both speakers once.
    assert await contents(caller, "alice") == ["The user lives in Oslo."]
    assert await contents(caller, "bob") == ["The user works at Equinor."]
    assert (done.outcome.added, done.outcome.speakers) == (2, 2)


async def test_rerunning_a_finished_job_adds_nothing(caller: Caller, server, drain, pool) -> None:  # type: ignore[no-untyped-def]
    reply = await ingest(caller, [msg("alice", "I love sailing.")], goals=["Buy a boat"])
    await drain()
    job = Job(
        scope=Scope(caller.tenant_id, "alice"),
        ingest_id=uuid.UUID(reply.ingest_id),
        session_id="s1",
        payload={"goals": ["Buy a boat"]},
        attempts=1,
        leased_by="x",
    )
    before = await contents(caller)
    outcome = await server.runtime.pipeline.run(job)
    again = await server.runtime.pipeline.run(job)
    assert await contents(caller) == before == ["Goal: Buy a boat", "The user loves sailing."]
    assert outcome.as_dict() == again.as_dict()
    async with pool.acquire() as conn:
        rows = await conn.fetchval(
            "SELECT count(*) FROM memories WHERE tenant_id = $1", caller.tenant_id
        )
    assert rows == 2


async def test_dead_letter_after_max_attempts(caller: Caller, server) -> None:  # type: ignore[no-untyped-def]
    reply = await ingest(caller, [msg("alice", "I live in Quito.")])
    worker = make_worker(server, FailingFor({"alice"}), max_attempts=3, backoff_base_s=0.01)
    await drain_all(worker, rounds=10)
    dead = await status(caller, reply.ingest_id)
    assert dead.state == pb.INGEST_STATE_DEAD
    assert dead.attempts == 3 and dead.last_error == "SpeakerFailures: ExtractionError"
    assert dead.HasField("finished_at")
    assert await contents(caller) == []
    # Dead jobs are never claimed again.
    assert await worker.drain() == 0


async def test_a_crashed_workers_job_is_taken_over_after_its_lease(
    caller: Caller, server, pool
) -> None:  # type: ignore[no-untyped-def]
    reply = await ingest(caller, [msg("alice", "I'm a nurse.")])
    async with pool.acquire() as conn:
        [taken] = await outbox.claim(
            conn,
            worker_id="crashed",
            lease_s=0.3,
            limit=1,
            tenant_id=caller.tenant_id,
            user_id="alice",
        )
    # The "crashed" worker never finishes. Until the lease ends nobody else may take it.
    other = make_worker(server, RulesExtractor())
    assert await other._claim_and_run(tenant_id=caller.tenant_id, user_id="alice") == 0
    await asyncio.sleep(0.4)
    await other.drain()
    done = await status(caller, reply.ingest_id)
    assert done.state == pb.INGEST_STATE_DONE and done.attempts == 2
    assert await contents(caller) == ["The user is a nurse."]
    # The late worker's completion is refused: the job is no longer its.
    async with pool.acquire() as conn:
        assert not await outbox.complete(conn, taken, {"added": 99})
    assert (await status(caller, reply.ingest_id)).outcome.added == 1


@pytest.mark.timeout(120)
async def test_worker_killed_mid_job_is_completed_once_by_another(  # type: ignore[no-untyped-def]
    caller: Caller,
    server,
    fake_chat: FakeChat,  # noqa: F811
) -> None:
    """A real `memsvc worker` process, SIGKILLed while its extractor call is in flight."""
    fake_chat.delay_s = 60  # the chat endpoint hangs: the job stays in flight
    reply = await ingest(caller, [msg("alice", "I live in Nairobi.")])
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSVC_")}
    env.update(
        MEMSVC_PG_DSN=server.settings.pg_dsn,
        MEMSVC_REDIS_URL=server.settings.redis_url,
        MEMSVC_EXTRACTOR="openai",
        MEMSVC_OPENAI_CHAT_BASE_URL=fake_chat.base_url,
        MEMSVC_WORKER_LEASE_S="3",
        MEMSVC_WORKER_JOB_TIMEOUT_S="2.5",
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "memsvc",
        "--log-level",
        "WARNING",
        "worker",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            if fake_chat.requests:
                break
            await asyncio.sleep(0.05)
        assert fake_chat.requests, "the worker process never called its extractor"
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), timeout=10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    held = await status(caller, reply.ingest_id)
    assert held.state == pb.INGEST_STATE_PROCESSING and held.attempts == 1
    assert await contents(caller) == []
    rescuer = make_worker(server, RulesExtractor())
    for _ in range(100):
        await rescuer.drain()
        if (await status(caller, reply.ingest_id)).state == pb.INGEST_STATE_DONE:
            break
        await asyncio.sleep(0.1)
    done = await status(caller, reply.ingest_id)
    assert done.state == pb.INGEST_STATE_DONE and done.attempts == 2
    assert await contents(caller) == ["The user lives in Nairobi."]


async def test_graceful_stop_lets_a_running_job_finish(caller: Caller, server) -> None:  # type: ignore[no-untyped-def]
    reply = await ingest(caller, [msg("alice", "I love chess.")])
    worker = make_worker(server, Slow(0.5))
    task = asyncio.create_task(worker.drain())
    for _ in range(100):
        if (await status(caller, reply.ingest_id)).state == pb.INGEST_STATE_PROCESSING:
            break
        await asyncio.sleep(0.02)
    await worker.stop(grace_s=10)
    await task
    assert (await status(caller, reply.ingest_id)).state == pb.INGEST_STATE_DONE
    assert await contents(caller) == ["The user loves chess."]


async def test_stop_past_the_grace_gives_the_job_back(caller: Caller, server) -> None:  # type: ignore[no-untyped-def]
    reply = await ingest(caller, [msg("alice", "I love go.")])
    worker = make_worker(server, Slow(30))
    task = asyncio.create_task(worker.drain())
    for _ in range(100):
        if (await status(caller, reply.ingest_id)).state == pb.INGEST_STATE_PROCESSING:
            break
        await asyncio.sleep(0.02)
    await worker.stop(grace_s=0.1)
    await asyncio.wait_for(task, timeout=5)  # a stopped worker claims nothing more
    back = await status(caller, reply.ingest_id)
    assert back.state == pb.INGEST_STATE_PENDING and back.last_error == "shutdown"
    assert await contents(caller) == []


async def test_kick_drains_only_that_users_work(new_caller, server) -> None:  # type: ignore[no-untyped-def]
    a: Caller = await new_caller()
    mine = await ingest(a, [msg("alice", "I live in Kyoto.")])
    theirs = await ingest(a, [msg("bob", "I live in Osaka.")], user="bob")
    worker = make_worker(server, RulesExtractor())
    worker.kick(a.tenant_id, "alice")
    for _ in range(100):
        if (await status(a, mine.ingest_id)).state == pb.INGEST_STATE_DONE:
            break
        await asyncio.sleep(0.05)
    assert (await status(a, mine.ingest_id)).state == pb.INGEST_STATE_DONE
    assert (await status(a, theirs.ingest_id)).state == pb.INGEST_STATE_PENDING
    await worker.stop(grace_s=1)


async def test_reads_kick_only_users_whose_work_was_announced(new_caller, server) -> None:  # type: ignore[no-untyped-def]
    """With its listener connected, a worker claims for a reading user only when that
    user's work was announced on the outbox channel: a burst of reads by users with nothing
    pending costs the database no claim statement."""
    a: Caller = await new_caller()
    worker = make_worker(server, RulesExtractor())
    await worker.start()
    try:
        for _ in range(100):
            if worker._listening:
                break
            await asyncio.sleep(0.05)
        assert worker._listening
        kicked: list[str | None] = []
        claim = worker._claim_and_run

        async def spy(*, tenant_id: str | None = None, user_id: str | None = None) -> int:
            kicked.append(user_id)
            return await claim(tenant_id=tenant_id, user_id=user_id)

        worker._claim_and_run = spy  # type: ignore[method-assign]
        worker.kick(a.tenant_id, "nobody")
        await asyncio.sleep(0.1)
        assert "nobody" not in kicked
        reply = await ingest(a, [msg("alice", "I live in Kyoto.")])
        for _ in range(100):
            if f"{a.tenant_id}:alice" in worker._announced:
                break
            await asyncio.sleep(0.02)
        worker.kick(a.tenant_id, "alice")
        for _ in range(100):
            if (await status(a, reply.ingest_id)).state == pb.INGEST_STATE_DONE:
                break
            await asyncio.sleep(0.05)
        assert "alice" in kicked
        assert (await status(a, reply.ingest_id)).state == pb.INGEST_STATE_DONE
        # Drained: the next read of alice's finds nothing announced and kicks nothing.
        for _ in range(100):
            if f"{a.tenant_id}:alice" not in worker._announced:
                break
            worker.kick(a.tenant_id, "alice")
            await asyncio.sleep(0.05)
        assert f"{a.tenant_id}:alice" not in worker._announced
        before = kicked.count("alice")
        worker.kick(a.tenant_id, "alice")
        await asyncio.sleep(0.1)
        assert kicked.count("alice") == before
    finally:
        await worker.stop(grace_s=1)


@pytest.fixture
async def server_with_worker(settings: Settings, embedder: Embedder) -> AsyncIterator[MemsvcServer]:
    s = settings.with_overrides(worker_sweep_interval_s=300.0)
    srv = MemsvcServer(s, embedder=embedder, with_worker=True)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop(grace_s=1)


async def wait_all_done(caller: Caller, replies: list[pb.IngestResponse]) -> list[int]:
    states: list[int] = []
    for _ in range(300):
        states = [(await status(caller, r.ingest_id)).state for r in replies]
        if all(s == pb.INGEST_STATE_DONE for s in states):
            break
        await asyncio.sleep(0.05)
    return states


async def test_in_server_worker_wakes_on_notify(caller: Caller, server_with_worker) -> None:  # type: ignore[no-untyped-def]
    # Let the worker's first sweep pass: the next is 300 s away, so only notifications and
    # finished jobs freeing a slot can wake it. More jobs than the worker's concurrency.
    await asyncio.sleep(0.5)
    users = [f"user{i}" for i in range(5)]
    replies = [await ingest(caller, [msg(u, "I'm from Accra.")], user=u) for u in users]
    assert await wait_all_done(caller, replies) == [pb.INGEST_STATE_DONE] * len(replies)
    for u in users:
        assert await contents(caller, u) == ["The user is from Accra."]


async def test_one_users_jobs_follow_each_other_at_once(caller: Caller, server_with_worker) -> None:  # type: ignore[no-untyped-def]
    """A user's next job may start only once the previous one is done: finishing must wake
    the claim loop after the final state is written, or the next job waits for the sweep."""
    await asyncio.sleep(0.5)
    replies = [
        await ingest(caller, [msg("alice", f"I love sport {i}.")], session=f"s{i}")
        for i in range(4)
    ]
    assert await wait_all_done(caller, replies) == [pb.INGEST_STATE_DONE] * len(replies)
    assert len(await contents(caller)) == 4


async def test_quota_skips_new_facts_but_never_reinforcements(caller: Caller, server) -> None:  # type: ignore[no-untyped-def]
    limited = server.settings.with_overrides(daily_fact_quota=2)
    worker = make_worker(server, RulesExtractor(), settings=limited)
    await ingest(caller, [msg("alice", "I love tea."), msg("alice", "I love jazz.")])
    await worker.drain()
    reply = await ingest(
        caller,
        [msg("alice", "I love cats."), msg("alice", "I love tea."), msg("alice", "I love rain.")],
        session="s2",
    )
    await worker.drain()
    done = await status(caller, reply.ingest_id)
    assert (done.outcome.added, done.outcome.reinforced, done.outcome.skipped_by_quota) == (0, 1, 2)
    # Quota-skipped candidates leave no trace.
    assert await contents(caller) == ["The user loves jazz.", "The user loves tea."]


async def test_confidence_floor_comes_before_dedup(caller: Caller, server, drain) -> None:  # type: ignore[no-untyped-def]
    await ingest(caller, [msg("alice", "I love tea.")])
    await drain()
    weak = CandidateFact(
        content="The user loves tea.",
        category="preference",
        role="context",
        confidence=0.2,
        source_message_ids=(),
        predicate="likes",
        object="tea",
    )
    unknown_role = dataclasses.replace(weak, content="Has a boat", role="gossip", confidence=0.9)
    worker = make_worker(server, Scripted([weak, unknown_role]))
    reply = await ingest(caller, [msg("alice", "maybe tea, maybe")], session="s2")
    await worker.drain()
    done = await status(caller, reply.ingest_id)
    # The weak repeat was dropped by the floor, so it did not reinforce the stored fact.
    assert (done.outcome.dropped_by_gates, done.outcome.reinforced, done.outcome.added) == (2, 0, 0)
    listed = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=pb.Scope(user_id="alice")))
    assert [(m.content, m.reinforced_count) for m in listed.memories] == [
        ("The user loves tea.", 0)
    ]


async def test_openai_extractor_end_to_end_with_a_malformed_reply(  # type: ignore[no-untyped-def]
    caller: Caller,
    server,
    fake_chat: FakeChat,  # noqa: F811
) -> None:
    extractor = OpenAIChatExtractor(
        base_url=fake_chat.base_url, model="m", api_key="sk-test", timeout_s=5
    )
    # A retry delay (0.3 s, no jitter) longer than one drain: the first ends after one attempt.
    worker = make_worker(server, extractor, backoff_base_s=0.3, backoff_jitter=0.0)
    reply = await ingest(caller, [msg("alice", "I'm vegetarian.", message_id="t1")])
    # Two malformed answers: the attempt fails and writes nothing.
    fake_chat.script((200, b'{"choices": []}'), chat("not json at all {"))
    await worker.drain()
    failed = await status(caller, reply.ingest_id)
    assert failed.state == pb.INGEST_STATE_PENDING
    # A malformed answer from a model is transient: it may answer well next time.
    assert failed.last_error == "SpeakerFailures: ExtractionError"
    assert await contents(caller) == []
    fake_chat.script(
        chat(
            {
                "episode": {
                    "title": "Diet",
                    "summary": "Talked about diet.",
                    "excerpt": "vegetarian",
                    "source_message_ids": ["t1"],
                },
                "facts": [
                    fact(
                        "Is vegetarian",
                        category="preference",
                        predicate="diet",
                        object="vegetarian",
                        source_message_ids=["t1"],
                    )
                ],
                "topics": ["food"],
            }
        )
    )
    await drain_all(worker, rounds=20)
    done = await status(caller, reply.ingest_id)
    assert done.state == pb.INGEST_STATE_DONE and done.outcome.added == 1
    assert await contents(caller) == ["Is vegetarian"]
    sent = fake_chat.requests[-1][2]
    assert sent["response_format"] == {"type": "json_object"} and sent["model"] == "m"
    assert orjson.loads(sent["messages"][1]["content"])
    await extractor.aclose()


async def test_reconcile_repairs_a_failed_embedding(caller: Caller, server, pool) -> None:  # type: ignore[no-untyped-def]
    m = (
        await caller.stub.Remember(
            pb.RememberRequest(scope=pb.Scope(user_id="alice"), content="Plays the oboe")
        )
    ).memory
    async with pool.acquire() as conn:
        # As a failed embedding leaves it: row in place, projection marked missing.
        await conn.execute(
            "UPDATE memories SET embedding = NULL, embedding_state = 'missing'"
            " WHERE tenant_id = $1 AND memory_id = $2::uuid",
            caller.tenant_id,
            m.memory_id,
        )
    for _ in range(50):
        await reconcile_once(pool, server.runtime.embedder)
        async with pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT embedding_state, embedding IS NOT NULL AS has FROM memories"
                " WHERE tenant_id = $1 AND memory_id = $2::uuid",
                caller.tenant_id,
                m.memory_id,
            )
        if row["embedding_state"] == "ok":
            break
    assert row["embedding_state"] == "ok" and row["has"]


async def test_drain_waits_for_what_the_background_loop_took(
    caller: Caller, server_with_worker
) -> None:  # type: ignore[no-untyped-def]
    """`memsvc worker --once` and tests drain while the same worker's loop also claims: drain
    must not return while one user's later jobs still wait behind a job the loop holds."""
    replies = [
        await ingest(caller, [msg("alice", f"I love sport {i}.")], session=f"s{i}")
        for i in range(4)
    ]
    worker = server_with_worker.runtime.worker
    assert worker is not None
    await worker.drain()
    states = [(await status(caller, r.ingest_id)).state for r in replies]
    assert states == [pb.INGEST_STATE_DONE] * len(replies)
