"""Every hot statement is a single-shard router query on Citus (EXPLAIN shows Task Count: 1).

Each test runs memsvc's own function through a Recorder on the coordinator, then EXPLAINs
every statement it ran with the same arguments: a statement that fans out to every shard,
or pulls rows to the coordinator first, fails the test with its plan."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
import numpy as np
import pytest

from memsvc.concurrency.deadline import Budget
from memsvc.prefetch import queries as prefetch_sql
from memsvc.retrieval.dense import dense_hits
from memsvc.retrieval.lexical import lexical_hits
from memsvc.retrieval.query import ItemKind
from memsvc.storage import (
    changes,
    erasure,
    export,
    extraction,
    memories,
    outbox,
    retention,
    sessions,
    versions,
)
from memsvc.storage.messages import StoredMessage, insert_messages
from memsvc.storage.model import NewMemory, Scope
from tests.cluster.plans import Plan, Recorder, Statement, distributed_plans, explain
from tests.ingest_helpers import stored_fact

KINDS = (ItemKind.FACT, ItemKind.EPISODE, ItemKind.MESSAGE)


@pytest.fixture
async def conn(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    """A pooled connection (pgvector codec registered), in a transaction rolled back after."""
    async with pool.acquire() as connection:
        tx = connection.transaction()
        await tx.start()
        try:
            yield connection  # type: ignore[misc]
        finally:
            await tx.rollback()


@pytest.fixture
def scope() -> Scope:
    return Scope(f"t-{uuid.uuid4().hex[:12]}", f"u-{uuid.uuid4().hex[:8]}", "", "")


def _assert_single_shard(plans: list[Plan], expected_at_least: int) -> None:
    assert len(plans) >= expected_at_least, [p.describe() for p in plans]
    wide = [p.describe() for p in plans if not p.single_shard]
    assert not wide, "not single-shard:\n\n" + "\n\n".join(wide)


async def _recorded(
    conn: asyncpg.Connection, run: Callable[[Recorder], Awaitable[object]]
) -> list[Plan]:
    recorder = Recorder(conn)
    await run(recorder)
    return await distributed_plans(conn, recorder)


def _memory(text: str) -> NewMemory:
    return NewMemory(content=text, category="preference", role="fact", confidence=0.9)


async def _remember(conn: Recorder | asyncpg.Connection, scope: Scope, text: str) -> None:
    await memories.insert_or_reinforce(
        conn,  # type: ignore[arg-type]
        scope,
        _memory(text),
        content_hash=hashlib.sha256(text.encode()).digest(),
        embedding=None,
        embedding_model="",
    )


async def test_remember_insert_and_reinforce(conn: asyncpg.Connection, scope: Scope) -> None:
    async def run(rec: Recorder) -> None:
        await _remember(rec, scope, "Alice likes hiking in the Alps")
        await _remember(rec, scope, "Alice likes hiking in the Alps")  # reinforces

    _assert_single_shard(await _recorded(conn, run), expected_at_least=2)


async def test_ingest_enqueue_and_messages(conn: asyncpg.Connection, scope: Scope) -> None:
    ingest_id = uuid.uuid4()
    sent = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

    async def run(rec: Recorder) -> None:
        await outbox.enqueue(
            rec,  # type: ignore[arg-type]
            scope,
            ingest_id=ingest_id,
            idempotency_key=f"k-{ingest_id}",
            session_id="s1",
            payload={"messages": 2},
            request_digest="v1:first",
        )
        await insert_messages(
            rec,  # type: ignore[arg-type]
            scope,
            ingest_id,
            [
                StoredMessage("s1", "m1", "alice", "user", "I went hiking", sent),
                StoredMessage("s1", "m2", "bot", "assistant", "Where?", sent),
            ],
        )
        # The same key again: refused, then the first job is looked up (one statement).
        assert not await outbox.enqueue(
            rec,  # type: ignore[arg-type]
            scope,
            ingest_id=uuid.uuid4(),
            idempotency_key=f"k-{ingest_id}",
            session_id="s1",
            payload={},
            request_digest="v1:first",
        )
        first = await outbox.first_use(rec, scope, f"k-{ingest_id}")  # type: ignore[arg-type]
        assert first is not None and first.ingest_id == ingest_id

    _assert_single_shard(await _recorded(conn, run), expected_at_least=4)


async def test_ingest_status_of_a_scope_and_extractions_source_check(
    conn: asyncpg.Connection, scope: Scope
) -> None:
    """GetIngestStatus with a scope reads the user's shard alone (without one it must look
    everywhere); the worker's check that a speaker's sources survived names the owner."""
    ingest_id = uuid.uuid4()

    async def run(rec: Recorder) -> None:
        db: Any = rec
        await outbox.status(db, scope.tenant_id, ingest_id, user_id=scope.user_id)
        await extraction.sources_remain(db, scope, ingest_id, "s1", ["m1", "m2"])

    _assert_single_shard(await _recorded(conn, run), expected_at_least=2)


async def test_recall_lexical_leg(conn: asyncpg.Connection, scope: Scope) -> None:
    await _remember(conn, scope, "Alice likes hiking in the Alps")

    async def run(rec: Recorder) -> None:
        await lexical_hits(
            rec,  # type: ignore[arg-type]
            scope,
            "where does alice go hiking",
            KINDS,
            limit=10,
            exact_max_rows=2000,
            as_of=None,
            budget=Budget(10.0),
        )

    _assert_single_shard(await _recorded(conn, run), expected_at_least=1)


async def test_recall_dense_leg(conn: asyncpg.Connection, scope: Scope) -> None:
    await _remember(conn, scope, "Alice likes hiking in the Alps")
    vector = np.random.default_rng(7).standard_normal(384).astype(np.float32)
    vector /= np.linalg.norm(vector)

    async def run(rec: Recorder) -> None:
        await dense_hits(
            rec,  # type: ignore[arg-type]
            scope,
            vector,
            KINDS,
            model_id="test-model",
            limit=10,
            exact_max_rows=2000,
            as_of=None,
            budget=Budget(10.0),
        )

    _assert_single_shard(await _recorded(conn, run), expected_at_least=1)


@pytest.mark.parametrize("whole_user", [False, True], ids=["scope", "whole-user"])
async def test_export_statements(conn: asyncpg.Connection, scope: Scope, whole_user: bool) -> None:
    """Every kind's export statement reads one shard group; except a whole user's messages,
    which include their turns in sessions other users own (stored on those users' shards)."""
    await _remember(conn, scope, "Alice likes hiking in the Alps")
    subject = export.Subject(scope, whole_user=whole_user)
    at = datetime.now(UTC)
    plans = {
        kind: await explain(conn, Statement(*statement(subject, at)))
        for kind, statement in export.KINDS
    }
    fan_out = {"message"} if whole_user else set()
    assert {k for k, p in plans.items() if not p.single_shard} == fan_out, {
        k: p.describe() for k, p in plans.items()
    }


async def test_one_users_expiry_and_pruning(conn: asyncpg.Connection, scope: Scope) -> None:
    """The expiry task's per-user batches (Citus takes one user at a time) lock, delete and
    record on that user's shard alone."""
    user = (scope.tenant_id, scope.user_id)

    async def run(rec: Recorder) -> None:
        db: Any = rec  # the functions take a Connection; the recorder passes through
        await retention.expire_memories(db, 100, user=user)
        await retention.expire_episodes(db, 100, user=user)
        await retention.expire_messages(db, 100, user=user)
        await changes.prune(db, 3600.0, 100, user=user)
        await retention.live_sessions(db, [(scope, "s1"), (scope, "s2")], user=user)

    _assert_single_shard(await _recorded(conn, run), expected_at_least=5)


async def test_prefetch_reads(conn: asyncpg.Connection, scope: Scope) -> None:
    """Every read a Prefetch build makes (its version, core and persona facts, blocks, the
    topic -> episode -> fact walk, recent facts), each on the user's shard alone."""
    await _remember(conn, scope, "Alice likes hiking in the Alps")
    vector = np.random.default_rng(11).standard_normal(384).astype(np.float32)
    vector /= np.linalg.norm(vector)
    some_ids = [uuid.uuid4()]

    async def run(rec: Recorder) -> None:
        db: Any = rec
        await versions.current_version(db, scope.tenant_id, scope.user_id)
        await prefetch_sql.core_facts(db, scope, core_role="core", limit=10, timeout_s=10)
        await prefetch_sql.block_texts(db, scope, timeout_s=10)
        await prefetch_sql.persona_facts(db, scope, limit=10, timeout_s=10)
        await prefetch_sql.topics(
            db,
            scope,
            hint="hiking",
            vector=vector,
            model_id="test-model",
            patterns=[],
            limit=5,
            timeout_s=10,
        )
        await prefetch_sql.episodes(
            db, scope, topic_ids=some_ids, recent=3, limit=5, idle_s=1800.0, timeout_s=10
        )
        await prefetch_sql.walk_facts(db, scope, episode_ids=some_ids, limit=10, timeout_s=10)
        await prefetch_sql.recent_facts(db, scope, core_role="core", limit=10, timeout_s=10)

    _assert_single_shard(await _recorded(conn, run), expected_at_least=8)


async def test_list_episodes(conn: asyncpg.Connection, scope: Scope) -> None:
    """ListEpisodes, each episode with its topics (a subquery over its edges), on the user's
    shard alone."""

    async def run(rec: Recorder) -> None:
        db: Any = rec
        await sessions.list_episodes(db, scope, limit=5, after=None)
        await sessions.list_episodes(db, scope, limit=5, after=None, session_id="s1")

    _assert_single_shard(await _recorded(conn, run), expected_at_least=2)


async def _remember_from(conn: asyncpg.Connection, scope: Scope, text: str, session: str) -> Any:
    """A memory taken from a message of the user's own session, as extraction stores one."""
    sent = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    message_id = f"m-{uuid.uuid4().hex[:8]}"
    await insert_messages(
        conn, scope, uuid.uuid4(), [StoredMessage(session, message_id, "alice", "user", text, sent)]
    )
    return await stored_fact(conn, scope, text, session_id=session, message_id=message_id)


async def test_correct_statements(conn: asyncpg.Connection, scope: Scope) -> None:
    """What Correct runs in its transaction (memories/service.py): the old version read and
    locked, the duplicate check, its validity closed, the new version, the user's version."""
    old = await _remember_from(conn, scope, "Alice lives in Lyon", "s1")
    text = "Alice lives in Paris"
    digest = hashlib.sha256(text.encode()).digest()

    async def run(rec: Recorder) -> None:
        db: Any = rec
        locked = await memories.get_owned(db, scope, old.memory_id, for_update=True)
        assert locked is not None
        assert await memories.find_active_duplicate(db, scope, digest) is None
        new_id = uuid.uuid4()
        await memories.mark_superseded(db, locked, new_id)
        await memories.insert_or_reinforce(
            db,
            scope,
            _memory(text),
            content_hash=digest,
            embedding=None,
            embedding_model="",
            memory_id=new_id,
            lineage_id=locked.lineage_id,
            supersedes_id=locked.memory_id,
            correction_reason="moved",
        )
        await versions.bump_version(db, scope.tenant_id, scope.user_id)

    _assert_single_shard(await _recorded(conn, run), expected_at_least=5)


@pytest.mark.parametrize("what", ["ids", "scope"])
async def test_forget_statements(conn: asyncpg.Connection, scope: Scope, what: str) -> None:
    """Forget of memories by id (with the messages they came from, in the user's own
    session, their episodes and topics) and of a whole scope: the user's shard alone."""
    record = await _remember_from(conn, scope, "Alice likes hiking in the Alps", "s1")

    async def run(rec: Recorder) -> None:
        db: Any = rec
        if what == "ids":
            found = await memories.owned_lineages(db, scope, [record.memory_id])
            assert await erasure.erase_memories(db, scope, list(found.values())) == 1
        else:
            assert await erasure.erase_scope(db, scope) == 1
        await versions.bump_version(db, scope.tenant_id, scope.user_id)

    _assert_single_shard(await _recorded(conn, run), expected_at_least=4)


async def test_erasure_of_a_user(conn: asyncpg.Connection, scope: Scope) -> None:
    """Every table's rows of the user go on their shard alone; one statement fans out, by
    design: what the user said in sessions other users own (a meeting) is stored on those
    users' shards, and which users they are is known only by looking."""
    await _remember_from(conn, scope, "Alice likes hiking in the Alps", "s1")

    async def run(rec: Recorder) -> None:
        await erasure.erase_user(rec, scope.tenant_id, scope.user_id)  # type: ignore[arg-type]

    plans = await _recorded(conn, run)
    wide = [p for p in plans if not p.single_shard]
    assert len(plans) >= len(erasure.USER_TABLES) + 1, [p.describe() for p in plans]
    assert [" ".join(p.statement.sql.split()) for p in wide] == [
        "DELETE FROM messages WHERE tenant_id = $1 AND sender_id = $2"
        " RETURNING tenant_id, user_id, persona_id, agent_id, session_id"
    ], [p.describe() for p in wide]
