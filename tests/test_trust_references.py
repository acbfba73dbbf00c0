"""Trust over time end to end: effective confidence on every returned Memory (decayed from
stored inputs, as_of aware) and last_referenced_at written in batches off the read path."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from memsvc.observability import metrics
from memsvc.retrieval.references import ReferenceRecorder
from memsvc.server.app import MemsvcServer
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller

SCOPE = pb.Scope(user_id="alice")


async def remember(caller: Caller, content: str, **fields: object) -> pb.Memory:
    reply: pb.RememberResponse = await caller.stub.Remember(
        pb.RememberRequest(scope=SCOPE, content=content, **fields)  # type: ignore[arg-type]
    )
    return reply.memory


async def listed(caller: Caller) -> dict[str, pb.Memory]:
    reply = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=SCOPE, page_size=100))
    return {m.content: m for m in reply.memories}


async def age(pool: asyncpg.Pool, caller: Caller, memory_id: str, days: float) -> None:
    """Pretend the memory was written (and valid since) ``days`` ago. The times are computed
    here: Citus (tests/cluster runs these tests again) refuses timestamptz arithmetic on
    columns in an UPDATE (the operator is STABLE)."""
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT user_id, recorded_at, valid_from FROM memories"
            " WHERE tenant_id = $1 AND memory_id = $2",
            caller.tenant_id,
            uuid.UUID(memory_id),
        )
        assert row is not None
        back = timedelta(days=days)
        await conn.execute(
            "UPDATE memories SET recorded_at = $4, valid_from = $5"
            " WHERE tenant_id = $1 AND user_id = $2 AND memory_id = $3",
            caller.tenant_id,
            row["user_id"],
            uuid.UUID(memory_id),
            row["recorded_at"] - back,
            row["valid_from"] - back,
        )


async def referenced(pool: asyncpg.Pool, caller: Caller) -> dict[str, datetime | None]:
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT m.content, r.last_referenced_at FROM memories m"
            " LEFT JOIN memory_references r USING (tenant_id, user_id, memory_id)"
            " WHERE m.tenant_id = $1",
            caller.tenant_id,
        )
    return {r["content"]: r["last_referenced_at"] for r in rows}


async def test_effective_confidence_decays_and_each_rule_keeps_its_own(
    caller: Caller, pool: asyncpg.Pool
) -> None:
    event = await remember(
        caller, "Went to Lisbon for a conference", category="event", confidence=0.8
    )
    assert event.effective_confidence == pytest.approx(0.8, abs=1e-4)
    pinned = await remember(caller, "Is allergic to peanuts", category="profile", pinned=True)
    fixed = await remember(caller, "Drinks coffee with sugar", category="preference")
    corrected: pb.Memory = await caller.stub.Correct(
        pb.CorrectRequest(scope=SCOPE, memory_id=fixed.memory_id, new_content="No sugar in coffee")
    )
    for memory_id in (event.memory_id, pinned.memory_id, corrected.memory_id):
        await age(pool, caller, memory_id, 30)

    now = await listed(caller)
    # event: 30-day half-life -> half of the stored 0.8, which itself is untouched.
    assert now["Went to Lisbon for a conference"].confidence == pytest.approx(0.8)
    assert now["Went to Lisbon for a conference"].effective_confidence == pytest.approx(
        0.4, abs=1e-3
    )
    assert now["Is allergic to peanuts"].effective_confidence == pytest.approx(0.9)
    assert now["No sugar in coffee"].effective_confidence == pytest.approx(1.0)

    # Recall shows the same decayed value, and as_of decays to that time instead.
    reply = await caller.stub.Recall(
        pb.RecallRequest(
            scope=SCOPE, query="Lisbon conference", top_k=1, mode=pb.RECALL_MODE_LEXICAL
        )
    )
    assert reply.items[0].memory.effective_confidence == pytest.approx(0.4, abs=1e-3)
    as_of = Timestamp()
    as_of.FromDatetime(datetime.now(UTC) - timedelta(days=15))
    reply = await caller.stub.Recall(
        pb.RecallRequest(
            scope=SCOPE,
            query="Lisbon conference",
            top_k=1,
            mode=pb.RECALL_MODE_LEXICAL,
            as_of=as_of,
        )
    )
    assert reply.items[0].memory.effective_confidence == pytest.approx(0.8 * 0.5**0.5, abs=1e-3)

    # Reinforcement: stated again -> the clock restarts, trust is the higher statement.
    again = await remember(caller, "Went to Lisbon for a conference", category="event")
    assert again.reinforced_count == 1 and again.HasField("last_reinforced_at")
    assert again.confidence == pytest.approx(0.9)
    assert again.effective_confidence == pytest.approx(0.9, abs=1e-4)
    assert (await listed(caller))["Went to Lisbon for a conference"].HasField("last_reinforced_at")


async def test_recall_then_flush_marks_exactly_the_returned_ids(
    caller: Caller, pool: asyncpg.Pool, server: MemsvcServer
) -> None:
    for text in ("Has a dog named Rex", "Likes jazz music", "Works as a nurse"):
        await remember(caller, text)
    reply = await caller.stub.Recall(
        pb.RecallRequest(scope=SCOPE, query="dog Rex", top_k=1, mode=pb.RECALL_MODE_LEXICAL)
    )
    assert [i.memory.content for i in reply.items] == ["Has a dog named Rex"]
    await server.runtime.references.flush()
    seen = await referenced(pool, caller)
    assert seen["Has a dog named Rex"] is not None
    assert seen["Likes jazz music"] is None and seen["Works as a nurse"] is None

    # ListMemories returns all three: all referenced, and the Memory shows when.
    await listed(caller)
    await server.runtime.references.flush()
    assert all(v is not None for v in (await referenced(pool, caller)).values())
    assert all(m.HasField("last_referenced_at") for m in (await listed(caller)).values())

    # Forgetting memories removes their references too (a trigger, whatever path deletes).
    async def references_left() -> int:
        async with pool.acquire() as conn:
            n: int = await conn.fetchval(
                "SELECT count(*) FROM memory_references WHERE tenant_id = $1", caller.tenant_id
            )
        return n

    assert await references_left() == 3
    await caller.stub.Forget(pb.ForgetRequest(scope=SCOPE, all_in_scope=True))
    assert await references_left() == 0


async def test_prefetch_cache_hits_are_references_too(
    caller: Caller, pool: asyncpg.Pool, server: MemsvcServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every reference written, however recent the last one (see the next test).
    monkeypatch.setattr(server.runtime.references, "_min_interval_s", 0.0)
    await remember(caller, "Prefers to be called Sam", pinned=True)
    first = await caller.stub.Prefetch(pb.PrefetchRequest(scope=SCOPE, session_id="s1"))
    assert [f.content for f in first.facts] == ["Prefers to be called Sam"]
    await server.runtime.references.flush()
    async with pool.acquire() as conn:
        await conn.execute("DELETE FROM memory_references WHERE tenant_id = $1", caller.tenant_id)
    second = await caller.stub.Prefetch(pb.PrefetchRequest(scope=SCOPE, session_id="s2"))
    assert second.cache == pb.CACHE_STATUS_HIT
    await server.runtime.references.flush()
    assert (await referenced(pool, caller))["Prefers to be called Sam"] is not None


async def test_an_id_referenced_again_within_the_interval_is_not_rewritten(
    caller: Caller, pool: asyncpg.Pool
) -> None:
    memory_id = uuid.UUID((await remember(caller, "Collects stamps")).memory_id)
    now = [1_000.0]
    recorder = ReferenceRecorder(
        pool, interval_s=3_600, max_pending=100, min_interval_s=60.0, clock=lambda: now[0]
    )
    recorder.record(caller.tenant_id, "alice", [memory_id])
    assert await recorder.flush() == 1
    first = (await referenced(pool, caller))["Collects stamps"]
    now[0] += 59.0
    recorder.record(caller.tenant_id, "alice", [memory_id])
    assert recorder.pending == 0
    now[0] += 2.0
    recorder.record(caller.tenant_id, "alice", [memory_id])
    assert recorder.pending == 1
    assert await recorder.flush() == 1
    second = (await referenced(pool, caller))["Collects stamps"]
    assert first is not None and second is not None and second > first


async def test_a_failing_flush_never_fails_a_read(
    caller: Caller, pool: asyncpg.Pool, server: MemsvcServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    await remember(caller, "Has a cat named Tom")
    assert server.settings.pg_dsn is not None
    closed = await asyncpg.create_pool(server.settings.pg_dsn, min_size=0, max_size=1)
    await closed.close()
    recorder = server.runtime.references
    await recorder.flush()
    monkeypatch.setattr(recorder, "_pool", closed)
    failed = metrics.REFERENCES_DROPPED.labels("flush_failed")
    before = failed._value.get()
    reply = await caller.stub.Recall(
        pb.RecallRequest(scope=SCOPE, query="cat Tom", top_k=1, mode=pb.RECALL_MODE_LEXICAL)
    )
    assert [i.memory.content for i in reply.items] == ["Has a cat named Tom"]
    assert recorder.pending >= 1
    assert await recorder.flush() == 0  # logged and counted, not raised
    assert failed._value.get() > before
    assert recorder.pending == 0
    monkeypatch.undo()
    # The next read is recorded and flushed as usual.
    await listed(caller)
    await recorder.flush()
    assert (await referenced(pool, caller))["Has a cat named Tom"] is not None


async def test_full_buffer_drops_and_stop_flushes(caller: Caller, pool: asyncpg.Pool) -> None:
    # Ids from Remember, not from ListMemories: that read records them itself, and the
    # server's own flush would then write the id this recorder drops.
    ids = {
        text: uuid.UUID((await remember(caller, text)).memory_id)
        for text in ("Plays the cello", "Runs marathons")
    }
    recorder = ReferenceRecorder(pool, interval_s=3_600, max_pending=1)
    recorder.start()
    full = metrics.REFERENCES_DROPPED.labels("full")
    before = full._value.get()
    recorder.record(caller.tenant_id, "alice", [ids["Plays the cello"], ids["Runs marathons"]])
    recorder.record(caller.tenant_id, "alice", [ids["Plays the cello"]])  # already pending: kept
    assert recorder.pending == 1 and full._value.get() == before + 1
    # Another user's id is never written to this one's rows (scoped by tenant and user).
    recorder.record(caller.tenant_id, "bob", [ids["Runs marathons"]])
    await recorder.stop()
    seen = await referenced(pool, caller)
    assert seen["Plays the cello"] is not None and seen["Runs marathons"] is None


async def test_a_flush_larger_than_a_chunk_writes_every_id(
    caller: Caller, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memsvc.retrieval import references

    # Ids from Remember (not a read, so nothing else records them).
    texts = ("Plays chess", "Grows tomatoes", "Speaks Dutch", "Owns a kayak", "Bakes bread")
    ids = [uuid.UUID((await remember(caller, text)).memory_id) for text in texts]
    monkeypatch.setattr(references, "FLUSH_CHUNK", 2)
    recorder = ReferenceRecorder(pool, interval_s=3_600, max_pending=100)
    recorder.record(caller.tenant_id, "alice", ids)
    assert await recorder.flush() == 5
    assert all(at is not None for at in (await referenced(pool, caller)).values())
