"""Fair extraction (issue 31, item 1): one tenant's flood of Ingests cannot delay another
tenant's work past a bound. Claims go tenant by tenant with a cap per tenant, a job's size is
bounded at Ingest, and parsing stops when its job is cancelled, timed out or deleted."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import asyncpg
import grpc
import pytest

from memsvc.extraction.base import Extraction, ExtractionInput, Turn
from memsvc.extraction.rules import Parsed, RulesExtractor
from memsvc.server.app import MemsvcServer
from memsvc.storage import outbox
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import ingest, msg, status
from tests.read_helpers import pscope
from tests.test_workers import make_worker

NewCaller = Callable[[], Awaitable[Caller]]


async def flood_and_one(new_caller: NewCaller, users: int) -> tuple[Caller, Caller, str]:
    """Tenant A: one job for each of ``users`` users; then tenant B: one job (the newest)."""
    a, b = await new_caller(), await new_caller()
    for i in range(users):
        await ingest(a, [msg(f"u{i}", "I live in Kyoto.")], user=f"u{i}")
    mine = await ingest(b, [msg("alice", "I live in Osaka.")])
    return a, b, mine.ingest_id


async def test_another_tenants_job_is_claimed_before_a_floods_second(
    new_caller: NewCaller, pool: asyncpg.Pool
) -> None:
    """Oldest-due-first claimed all of A's six jobs before B's one."""
    a, b, _ = await flood_and_one(new_caller, users=6)
    worker = f"test-{uuid.uuid4().hex[:8]}"
    order: list[str] = []
    async with pool.acquire() as conn:
        # One at a time, as slots free up (other tests' leftovers may come first: any tenant's
        # first job ranks with B's). Short leases: whatever this takes is claimable again soon.
        for _ in range(500):
            jobs = await outbox.claim_fairly(conn, worker_id=worker, lease_s=0.5, limit=1)
            if not jobs:
                break
            order += [
                j.scope.tenant_id for j in jobs if j.scope.tenant_id in (a.tenant_id, b.tenant_id)
            ]
            if b.tenant_id in order:
                break
    assert b.tenant_id in order
    assert order.index(b.tenant_id) <= 1  # at most A's first job before B's
    async with pool.acquire() as conn:
        await conn.execute(
            "DELETE FROM ingest_outbox WHERE tenant_id = ANY($1::text[])",
            [a.tenant_id, b.tenant_id],
        )


async def test_a_tenants_users_take_turns_in_claims(
    new_caller: NewCaller, pool: asyncpg.Pool
) -> None:
    """Xavier's three jobs are older than Yann's one (same tenant, one job at a time): by
    oldest due job alone Yann waited for all three; served in turns, he goes second."""
    a = await new_caller()
    for i in range(3):
        await ingest(a, [msg("xavier", f"I live in Kyoto, {i}.")], user="xavier")
    await ingest(a, [msg("yann", "I live in Osaka.")], user="yann")
    worker = f"test-{uuid.uuid4().hex[:8]}"
    served: dict[tuple[str, str], int] = {}
    order: list[str] = []
    async with pool.acquire() as conn:
        for n in range(500):
            # Short leases: other tests' leftovers taken here are claimable again soon.
            jobs = await outbox.claim_fairly(
                conn, worker_id=worker, lease_s=0.5, limit=1, max_per_tenant=1, served=served
            )
            if not jobs:
                break
            for job in jobs:
                served[(job.scope.tenant_id, job.scope.user_id)] = n
                if job.scope.tenant_id == a.tenant_id:
                    order.append(job.scope.user_id)
                    await outbox.complete(conn, job, {})  # the user's next job is claimable
            if len(order) == 4:
                break
        await conn.execute("DELETE FROM ingest_outbox WHERE tenant_id = $1", a.tenant_id)
    assert order == ["xavier", "yann", "xavier", "xavier"]


async def test_a_tenant_at_its_cap_gets_no_more_jobs_and_others_do(
    new_caller: NewCaller, pool: asyncpg.Pool
) -> None:
    a, b, _ = await flood_and_one(new_caller, users=5)
    worker = f"test-{uuid.uuid4().hex[:8]}"
    async with pool.acquire() as conn:
        claimed: list[str] = []
        for _ in range(200):
            jobs = await outbox.claim_fairly(
                conn, worker_id=worker, lease_s=60, limit=4, max_per_tenant=2
            )
            if not jobs:
                break
            claimed += [j.scope.tenant_id for j in jobs]
        assert claimed.count(a.tenant_id) == 2  # its cap, whatever it has due
        assert claimed.count(b.tenant_id) == 1
        assert await outbox.running_jobs(conn, a.tenant_id) == 2
        await conn.execute(
            "DELETE FROM ingest_outbox WHERE tenant_id = ANY($1::text[])",
            [a.tenant_id, b.tenant_id],
        )


class HeldFlood(RulesExtractor):
    """Jobs of session "flood" are parsed only once the test lets them go; any other job
    (another test's left over included) is parsed as usual."""

    def __init__(self) -> None:
        super().__init__(offload=False)
        self.entered = 0
        self.release = asyncio.Event()

    async def extract(self, data: ExtractionInput) -> Extraction:
        if data.session_id == "flood":
            self.entered += 1
            await self.release.wait()
        return await super().extract(data)


async def test_another_tenants_job_runs_while_one_tenant_holds_every_other_slot(
    new_caller: NewCaller, server: MemsvcServer
) -> None:
    """With both slots of the worker taken by A's long jobs, B's one-message Ingest waited
    for one of them to end."""
    a, b = await new_caller(), await new_caller()
    for i in range(3):
        await ingest(a, [msg(f"u{i}", "I live in Kyoto.")], user=f"u{i}", session="flood")
    extractor = HeldFlood()
    worker = make_worker(server, extractor, concurrency=2, reserved_slots=1, max_jobs_per_tenant=2)
    await worker.start()
    try:
        for _ in range(600):
            if extractor.entered:
                break
            await asyncio.sleep(0.05)
        assert extractor.entered == 1  # A's job holds the one slot open to anyone
        mine = await ingest(b, [msg("alice", "I live in Osaka.")])
        for _ in range(1200):
            if (await status(b, mine.ingest_id)).state == pb.INGEST_STATE_DONE:
                break
            await asyncio.sleep(0.05)
        assert (await status(b, mine.ingest_id)).state == pb.INGEST_STATE_DONE
        assert extractor.entered == 1  # A's first job still held, no other of A's taken
    finally:
        extractor.release.set()
        await worker.stop(grace_s=5)


# -- parsing in chunks, stopped when its job is -------------------------------------------

SAID = [
    "I live in Kyoto with my sister Hana.",
    "My favourite food is ramen, and I love jazz.",
    "Last year I moved from Osaka for a new job at a bank.",
    "I am allergic to peanuts.",
    "We talked about the trip to Lisbon and the jazz festival there.",
    "My daughter plays the piano every evening.",
]


def conversation(turns: int) -> ExtractionInput:
    when = datetime(2026, 3, 1, 12, tzinfo=UTC)
    return ExtractionInput(
        speaker_id="alice",
        session_id="s1",
        turns=tuple(Turn(f"m{i}", SAID[i % len(SAID)], when) for i in range(turns)),
        categories=("preference", "profile", "relationship", "goal", "event", "context"),
        roles=("core", "context", "episodic"),
        max_facts=50,
    )


async def test_parsing_in_chunks_finds_what_one_parse_finds() -> None:
    data = conversation(12)
    whole = RulesExtractor(offload=False).extract_sync(data)
    chunked = await RulesExtractor(chunk_chars=60).extract(data)  # in the parser process
    assert isinstance(chunked, Extraction) and chunked == whole
    assert whole.facts and whole.episode is not None


class CountedChunks(RulesExtractor):
    """Parses in a thread, chunk by chunk, counting the chunks it starts."""

    def __init__(self) -> None:
        super().__init__(offload=False, chunk_chars=60)
        self.started = 0
        self.second = asyncio.Event()

    async def _parse_chunk(self, chunk: ExtractionInput) -> Parsed:
        self.started += 1
        if self.started == 2:
            self.second.set()
        return await super()._parse_chunk(chunk)


async def test_a_cancelled_extraction_parses_no_further_chunk() -> None:
    """One call parsed the whole job, and went on after its job was cancelled."""
    extractor = CountedChunks()
    task = asyncio.ensure_future(extractor.extract(conversation(40)))
    await asyncio.wait_for(extractor.second.wait(), timeout=60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert extractor.started == 2  # of 40


class Held(RulesExtractor):
    """Parsing of session "doomed" that never ends on its own: says when it started and when
    it was cancelled (any other job, another test's left over, is parsed as usual)."""

    def __init__(self) -> None:
        super().__init__(offload=False)
        self.entered = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def extract(self, data: ExtractionInput) -> Extraction:
        if data.session_id != "doomed":
            return await super().extract(data)
        self.entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        raise AssertionError("unreachable")


async def test_a_deleted_job_stops_its_parsing(caller: Caller, server: MemsvcServer) -> None:
    """ForgetSession deleted the job; its parse ran on to the end (or the job timeout)."""
    extractor = Held()
    worker = make_worker(server, extractor, job_check_s=0.1)
    job = await ingest(caller, [msg("alice", "I live in Kyoto.")], session="doomed")
    await worker.start()
    try:
        await asyncio.wait_for(extractor.entered.wait(), timeout=30)
        await caller.stub.ForgetSession(
            pb.ForgetSessionRequest(scope=pscope(), session_id="doomed")
        )
        await asyncio.wait_for(extractor.cancelled.wait(), timeout=30)
    finally:
        await worker.stop(grace_s=1)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await status(caller, job.ingest_id)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


# -- the size budget of a job ---------------------------------------------------------------


async def test_an_ingest_over_one_jobs_budget_is_refused_and_nothing_is_queued(
    caller: Caller, pool: asyncpg.Pool
) -> None:
    """200 messages of 8,000 characters (1.6 MB) were accepted as one job that could only
    time out, and stalled every tenant's extraction for minutes."""
    text = " ".join(SAID * 200)[:8000]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ingest(caller, [msg("alice", text) for _ in range(200)])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = info.value.details() or ""
    assert details.startswith("messages:") and "split them over several Ingests" in details
    assert text[:40] not in details
    async with pool.acquire() as conn:
        queued = await conn.fetchval(
            "SELECT count(*) FROM ingest_outbox WHERE tenant_id = $1", caller.tenant_id
        )
    assert queued == 0
    # Split over Ingests within the budget, the same messages are taken.
    for i in range(0, 16, 8):
        await ingest(caller, [msg("alice", text) for _ in range(8)], key=f"part-{i}")
