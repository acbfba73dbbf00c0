"""A job's failure is classified: permanent ones are dead at once with their reason, transient
ones are retried, bugs are aborted and logged with their stack; expiry's cancellation
propagates. Failures come from outside: an Extractor or Embedder of the test, a held lock, a
row written by hand."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence

import asyncpg
import numpy as np
import numpy.typing as npt
import pytest

from memsvc.embedding import Embedder, EmbeddingError
from memsvc.extraction.base import (
    CandidateFact,
    DecisionResult,
    ExistingFact,
    Extraction,
    ExtractionError,
    ExtractionInput,
)
from memsvc.extraction.rules import RulesExtractor
from memsvc.governance.expiry import ExpirySettings, ExpiryTask
from memsvc.ingest.failures import (
    InvalidExtraction,
    InvalidJobPayload,
    SpeakerFailures,
    Verdict,
    classify,
)
from memsvc.ingest.payload import JobPayload, parse_payload
from memsvc.observability import metrics
from memsvc.server.app import MemsvcServer
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import contents, ingest, msg, status
from tests.test_workers import Scripted, drain_all, make_worker

DEAD = pb.INGEST_STATE_DEAD
PENDING = pb.INGEST_STATE_PENDING
DONE = pb.INGEST_STATE_DONE


class FlakyEmbedder:
    """The real embedder, except that it fails (EmbeddingError) while ``down`` is set."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.down = True

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def dimension(self) -> int:
        return self.inner.dimension

    async def embed(
        self, texts: Sequence[str], *, timeout_s: float | None = None
    ) -> npt.NDArray[np.float32]:
        if self.down:
            raise EmbeddingError("injected: the embedder is down")
        return await self.inner.embed(texts, timeout_s=timeout_s)

    async def aclose(self) -> None:
        """The wrapped embedder belongs to the test session."""


class WrongShape(RulesExtractor):
    """A plug-in that answers with something other than an Extraction, every time."""

    async def extract(self, data: ExtractionInput) -> Extraction:
        return {"facts": []}  # type: ignore[return-value]


class Buggy(RulesExtractor):
    """A plug-in with a bug: it reads a turn that is not there."""

    async def extract(self, data: ExtractionInput) -> Extraction:
        _ = data.turns[99]
        return await super().extract(data)

    async def decide(
        self, candidate: CandidateFact, existing: Sequence[ExistingFact]
    ) -> DecisionResult | None:
        return None


def nul_fact() -> CandidateFact:
    """A fact PostgreSQL refuses to store as text, whatever the attempt (SQLSTATE 22021)."""
    return CandidateFact(
        content="The user likes tea\x00 with milk.",
        category="preference",
        role="context",
        confidence=0.9,
        source_message_ids=(),
        predicate="likes",
        object="tea",
    )


def dead_count() -> float:
    value: float = metrics.INGEST_DEAD._value.get()
    return value


# -- permanent: dead after one attempt, with the reason ----------------------------------------


async def test_a_value_the_database_refuses_is_dead_after_one_attempt(
    caller: Caller, server: MemsvcServer
) -> None:
    # Work other tests left pending (tests/test_ingest.py acknowledges ingests nobody drains)
    # would die under this worker's scripted extractor too and count in the metric: the
    # real extractor finishes it first.
    await drain_all(make_worker(server, server.runtime.extractor), rounds=3)
    reply = await ingest(caller, [msg("alice", "I like tea with milk.")])
    before = dead_count()
    worker = make_worker(server, Scripted([nul_fact()]), max_attempts=5, backoff_base_s=0.01)
    await drain_all(worker, rounds=5)
    dead = await status(caller, reply.ingest_id)
    assert dead.state == DEAD and dead.attempts == 1
    assert dead.last_error == "SpeakerFailures: CharacterNotInRepertoireError (22021)"
    assert dead.HasField("finished_at")
    assert await contents(caller) == []
    assert dead_count() == before + 1
    # Dead is final: nothing claims it again.
    assert await worker.drain() == 0


async def test_a_bad_stored_payload_is_dead_after_one_attempt(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool
) -> None:
    reply = await ingest(caller, [msg("alice", "I live in Lima.")], goals=["Move to Cusco"])
    async with pool.acquire() as conn:
        await conn.execute(
            'UPDATE ingest_outbox SET payload = \'{"goals": "Move to Cusco"}\'::jsonb'
            " WHERE tenant_id = $1 AND ingest_id = $2",
            caller.tenant_id,
            uuid.UUID(reply.ingest_id),
        )
    worker = make_worker(server, RulesExtractor(), backoff_base_s=0.01)
    await drain_all(worker, rounds=5)
    dead = await status(caller, reply.ingest_id)
    assert (dead.state, dead.attempts, dead.last_error) == (DEAD, 1, "InvalidJobPayload")
    # Read strictly: a string of goals is not taken for a list of characters.
    assert await contents(caller) == []


async def test_an_extractor_answering_the_wrong_shape_is_dead_after_one_attempt(
    caller: Caller, server: MemsvcServer
) -> None:
    reply = await ingest(caller, [msg("alice", "I love sailing.")])
    worker = make_worker(server, WrongShape(), backoff_base_s=0.01)
    await drain_all(worker, rounds=5)
    dead = await status(caller, reply.ingest_id)
    assert (dead.state, dead.attempts) == (DEAD, 1)
    assert dead.last_error == "SpeakerFailures: InvalidExtraction"


async def test_a_bug_is_dead_at_once_and_logged_with_its_stack(
    caller: Caller, server: MemsvcServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="memsvc.ingest.worker")
    reply = await ingest(caller, [msg("alice", "I love rowing.")])
    worker = make_worker(server, Buggy(), backoff_base_s=0.01)
    await drain_all(worker, rounds=5)
    dead = await status(caller, reply.ingest_id)
    assert (dead.state, dead.attempts, dead.last_error) == (DEAD, 1, "unexpected IndexError")
    [logged] = [r for r in caplog.records if r.exc_info is not None]
    assert logged.levelno == logging.ERROR and logged.exc_info is not None
    assert logged.exc_info[0] is IndexError
    assert reply.ingest_id in logged.getMessage()


# -- transient: retried with backoff -------------------------------------------------------------


async def test_an_unavailable_embedder_is_retried_then_done(
    caller: Caller, server: MemsvcServer
) -> None:
    reply = await ingest(caller, [msg("alice", "I live in Quito.")])
    embedder = FlakyEmbedder(server.runtime.embedder)
    # A retry delay (0.3 s, no jitter) longer than one drain: the first ends after one attempt.
    worker = make_worker(
        server, RulesExtractor(), embedder=embedder, backoff_base_s=0.3, backoff_jitter=0.0
    )
    await worker.drain()
    waiting = await status(caller, reply.ingest_id)
    assert (waiting.state, waiting.attempts, waiting.last_error) == (PENDING, 1, "EmbeddingError")
    embedder.down = False
    await drain_all(worker, rounds=20)
    done = await status(caller, reply.ingest_id)
    assert (done.state, done.attempts) == (DONE, 2)
    assert await contents(caller) == ["The user lives in Quito."]


async def test_a_job_held_by_a_lock_times_out_and_is_retried(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool
) -> None:
    """The job's deadline bounds a statement that waits on a lock another session holds."""
    reply = await ingest(caller, [msg("alice", "I work in Porto.")])
    worker = make_worker(
        server, RulesExtractor(), job_timeout_s=1.0, backoff_base_s=0.3, backoff_jitter=0.0
    )
    async with pool.acquire() as conn, conn.transaction():
        # The lock every extraction of this user takes before it writes.
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 7))", f"{caller.tenant_id}\x1falice"
        )
        await asyncio.wait_for(worker.drain(), timeout=10)
        held = await status(caller, reply.ingest_id)
    assert (held.state, held.attempts, held.last_error) == (PENDING, 1, "TimeoutError")
    assert await contents(caller) == []
    await drain_all(worker, rounds=20)
    done = await status(caller, reply.ingest_id)
    assert (done.state, done.attempts) == (DONE, 2)
    assert await contents(caller) == ["The user works in Porto."]


# -- the classification itself (pure) -----------------------------------------------------------


LOST = "ConnectionDoesNotExistError"
OUT_OF_RANGE = "NumericValueOutOfRangeError"


@pytest.mark.parametrize(
    ("exc", "verdict", "reason"),
    [
        (asyncpg.SerializationError(), Verdict.RETRY, "SerializationError (40001)"),
        (asyncpg.DeadlockDetectedError(), Verdict.RETRY, "DeadlockDetectedError (40P01)"),
        (asyncpg.QueryCanceledError(), Verdict.RETRY, "QueryCanceledError (57014)"),
        (
            asyncpg.ConnectionDoesNotExistError(),
            Verdict.RETRY,
            "ConnectionDoesNotExistError (08003)",
        ),
        (asyncpg.TooManyConnectionsError(), Verdict.RETRY, "TooManyConnectionsError (53300)"),
        (asyncpg.InternalServerError(), Verdict.RETRY, "InternalServerError (XX000)"),
        (asyncpg.InterfaceError("connection is closed"), Verdict.RETRY, "InterfaceError"),
        (ConnectionResetError(), Verdict.RETRY, "ConnectionResetError"),
        (TimeoutError(), Verdict.RETRY, "TimeoutError"),
        (EmbeddingError(), Verdict.RETRY, "EmbeddingError"),
        (ExtractionError(), Verdict.RETRY, "ExtractionError"),
        (
            asyncpg.NumericValueOutOfRangeError(),
            Verdict.ABORT,
            "NumericValueOutOfRangeError (22003)",
        ),
        (asyncpg.UniqueViolationError(), Verdict.ABORT, "UniqueViolationError (23505)"),
        (asyncpg.UndefinedColumnError(), Verdict.ABORT, "UndefinedColumnError (42703)"),
        (InvalidJobPayload(), Verdict.ABORT, "InvalidJobPayload"),
        (InvalidExtraction(), Verdict.ABORT, "InvalidExtraction"),
        (KeyError("x"), Verdict.ABORT, "unexpected KeyError"),
    ],
)
def test_failures_are_classified_by_class_and_sqlstate(
    exc: Exception, verdict: Verdict, reason: str
) -> None:
    failure = classify(exc)
    assert (failure.verdict, failure.reason) == (verdict, reason)
    assert failure.unexpected == reason.startswith("unexpected")


def test_a_message_never_decides_nor_shows() -> None:
    # The same class is classified the same whatever its message says, and the message
    # (which may quote a user's text) is not the reason.
    for text in ("deadlock detected", "permanent", "alice's phone is 555-0100"):
        assert classify(asyncpg.InterfaceError(text)).reason == "InterfaceError"
        assert classify(RuntimeError(text)).verdict is Verdict.ABORT


def test_speakers_are_retried_while_one_may_yet_succeed() -> None:
    mixed = SpeakerFailures({"alice": asyncpg.DataError(), "bob": TimeoutError()})
    assert classify(mixed).verdict is Verdict.RETRY
    assert classify(mixed).reason == "SpeakerFailures: DataError (22000), TimeoutError"
    permanent = SpeakerFailures({"alice": asyncpg.DataError(), "bob": InvalidExtraction()})
    assert classify(permanent).verdict is Verdict.ABORT


def test_the_payload_is_read_strictly() -> None:
    written = JobPayload(end_of_session=True, goals=("Buy a boat",), counterpart_persona_id="p1")
    assert parse_payload(written.as_json()) == written
    assert parse_payload({}) == JobPayload()
    assert parse_payload({"goals": [], "added_later": 1}) == JobPayload()
    for bad in (None, [], {"goals": "Buy a boat"}, {"end_of_session": "yes"}, {"goals": [1]}):
        with pytest.raises(InvalidJobPayload):
            parse_payload(bad)


# -- expiry: its cancellation propagates ---------------------------------------------------------


def expiry_of(server: MemsvcServer) -> ExpiryTask:
    runtime = server.runtime
    return ExpiryTask(runtime.pool, runtime.invalidator, ExpirySettings(interval_s=0.05))


async def test_cancelling_whoever_stops_expiry_propagates(server: MemsvcServer) -> None:
    expiry = expiry_of(server)
    expiry.start()
    await asyncio.sleep(0)
    stopper = asyncio.create_task(expiry.stop())
    await asyncio.sleep(0)  # stop() has cancelled the loop and waits for it to end
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert stopper.cancelled()


async def test_an_expiry_pass_cancelled_mid_statement_propagates_and_lets_go(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool
) -> None:
    await caller.stub.Remember(
        pb.RememberRequest(scope=pb.Scope(user_id="alice"), content="Parked on level three")
    )
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE memories SET expires_at = now() - interval '1 second' WHERE tenant_id = $1",
            caller.tenant_id,
        )
    waiting = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND query LIKE 'INSERT INTO scope_versions%'"
    )
    expiry = expiry_of(server)
    async with pool.acquire() as holder, holder.transaction():
        # The user's version row, which the pass bumps after deleting the expired memory.
        await holder.execute(
            "SELECT 1 FROM scope_versions WHERE tenant_id = $1 AND user_id = 'alice' FOR UPDATE",
            caller.tenant_id,
        )
        task = asyncio.create_task(expiry.run_once())
        for _ in range(200):
            if await pool.fetchval(waiting):
                break
            await asyncio.sleep(0.02)
        assert await pool.fetchval(waiting) == 1, "the pass never reached the held row"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        # The statement was cancelled on the server too: nothing waits on the row any more.
        for _ in range(100):
            if await pool.fetchval(waiting) == 0:
                break
            await asyncio.sleep(0.02)
        assert await pool.fetchval(waiting) == 0
