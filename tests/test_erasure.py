"""Erasure, proven: after Forget (one memory, a scope, a user) nothing about it is left in any
table, index, cached packet, derived episode or topic text, or pending work — and the same
content can be stored again afterwards."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import UTC, datetime

from memsvc.extraction.base import Extraction, ExtractionInput
from memsvc.extraction.rules import RulesExtractor
from memsvc.ingest.pipeline import ExtractionPipeline
from memsvc.ingest.worker import OutboxWorker
from memsvc.server.runtime import pipeline_settings, worker_settings
from memsvc.storage.erasure import USER_TABLES, erase_memories, fed_topics
from memsvc.storage.messages import StoredMessage, insert_messages
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import contents, ingest, msg, stored_fact
from tests.read_helpers import prefetch, recall

SECRET = "Zanzibar"


async def rows_mentioning(pool, tenant: str, word: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Rows of any user table, in this tenant, whose text mentions the word."""
    async with pool.acquire() as conn:
        return {
            table: await conn.fetchval(
                f"SELECT count(*) FROM {table} t WHERE tenant_id = $1"
                " AND position(lower($2) IN lower(t::text)) > 0",
                tenant,
                word,
            )
            for table in USER_TABLES
        }


async def everything_found(caller: Caller, query: str, user: str = "alice") -> list[str]:
    """What every read path returns for the query."""
    found: list[str] = []
    for types in ([pb.ITEM_TYPE_FACT], [pb.ITEM_TYPE_EPISODE], [pb.ITEM_TYPE_MESSAGE]):
        reply = await recall(caller, query, scope=pb.Scope(user_id=user), types=types, top_k=50)
        found += [item.text for item in reply.items]
    packet = await prefetch(caller, scope=pb.Scope(user_id=user), hint=query)
    found.append(packet.text)
    return found


async def test_forgetting_one_memory_removes_every_derived_copy(
    caller: Caller, drain, pool
) -> None:  # type: ignore[no-untyped-def]
    await ingest(caller, [msg("alice", f"I live in {SECRET}."), msg("alice", "I love chess.")])
    await ingest(caller, [msg("alice", f"I'm from {SECRET}.")], session="s2")
    await drain()
    listed = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=pb.Scope(user_id="alice")))
    targets = [m.memory_id for m in listed.memories if SECRET in m.content]
    assert len(targets) == 2
    assert any(SECRET in t for t in await everything_found(caller, SECRET))
    before = await prefetch(caller, hint=SECRET)
    assert SECRET in before.text

    await caller.stub.Forget(pb.ForgetRequest(scope=pb.Scope(user_id="alice"), memory_ids=targets))

    assert await rows_mentioning(pool, caller.tenant_id, SECRET) == {t: 0 for t in USER_TABLES}
    assert not any(SECRET in t for t in await everything_found(caller, SECRET))
    # The other fact and its episode remain, rewritten without the erased fact and re-embedded.
    assert await contents(caller) == ["The user loves chess."]
    async with pool.acquire() as conn:
        episodes = await conn.fetch(
            "SELECT summary, embedding_state FROM episodes WHERE tenant_id = $1", caller.tenant_id
        )
        topics = await conn.fetch("SELECT name FROM topics WHERE tenant_id = $1", caller.tenant_id)
    assert [(e["summary"], e["embedding_state"]) for e in episodes] == [
        ("The user loves chess.", "missing")
    ]
    # The topic only the erased facts fed (Zanzibar) is gone too; the one the kept fact
    # names stays.
    assert [t["name"] for t in topics] == ["chess"]

    # No tombstone: the same content is stored normally afterwards.
    await ingest(caller, [msg("alice", f"I live in {SECRET}.")], session="s3")
    await drain()
    assert f"The user lives in {SECRET}." in await contents(caller)


async def test_forgetting_a_whole_scope_leaves_other_scopes(caller: Caller, drain, pool) -> None:  # type: ignore[no-untyped-def]
    await ingest(caller, [msg("alice", f"I live in {SECRET}.")], agent="bot-1")
    await ingest(caller, [msg("alice", "I live in Oslo.")])
    await drain()
    reply = await caller.stub.Forget(
        pb.ForgetRequest(scope=pb.Scope(user_id="alice", agent_id="bot-1"), all_in_scope=True)
    )
    assert reply.deleted == 1
    assert await rows_mentioning(pool, caller.tenant_id, SECRET) == {t: 0 for t in USER_TABLES}
    async with pool.acquire() as conn:
        left = {
            table: await conn.fetchval(
                f"SELECT count(*) FROM {table} WHERE tenant_id = $1 AND agent_id = 'bot-1'",
                caller.tenant_id,
            )
            for table in (
                "memories",
                "episodes",
                "topics",
                "messages",
                "ingest_outbox",
                "extraction_runs",
            )
        }
    assert set(left.values()) == {0}
    assert await contents(caller) == ["The user lives in Oslo."]


async def test_erasing_a_user_reaches_their_turns_in_others_sessions(
    caller: Caller, drain, pool
) -> None:  # type: ignore[no-untyped-def]
    await ingest(caller, [msg("alice", "I love tea."), msg("bob", f"I live in {SECRET}.")])
    await drain()
    assert await contents(caller, "bob") == [f"The user lives in {SECRET}."]
    await caller.stub.Forget(pb.ForgetRequest(scope=pb.Scope(user_id="bob"), erase_user=True))
    assert await rows_mentioning(pool, caller.tenant_id, SECRET) == {t: 0 for t in USER_TABLES}
    async with pool.acquire() as conn:
        bobs = {
            table: await conn.fetchval(
                f"SELECT count(*) FROM {table} WHERE tenant_id = $1 AND user_id = 'bob'",
                caller.tenant_id,
            )
            for table in USER_TABLES
        }
        said_by_bob = await conn.fetchval(
            "SELECT count(*) FROM messages WHERE tenant_id = $1 AND sender_id = 'bob'",
            caller.tenant_id,
        )
    assert set(bobs.values()) == {0} and said_by_bob == 0
    assert await contents(caller, "alice") == ["The user loves tea."]


async def test_pending_work_is_erased_too(caller: Caller, drain, pool) -> None:  # type: ignore[no-untyped-def]
    reply = await ingest(caller, [msg("alice", f"I live in {SECRET}.")])
    await caller.stub.Forget(pb.ForgetRequest(scope=pb.Scope(user_id="alice"), erase_user=True))
    await drain()
    assert await rows_mentioning(pool, caller.tenant_id, SECRET) == {t: 0 for t in USER_TABLES}
    assert await contents(caller) == []
    async with pool.acquire() as conn:
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM ingest_outbox WHERE tenant_id = $1", caller.tenant_id
            )
            == 0
        )
    del reply


class Gated(RulesExtractor):
    """Real rules extraction that waits for a signal: the job is in flight until released."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def extract(self, data: ExtractionInput) -> Extraction:
        self.entered.set()
        await self.release.wait()
        return await super().extract(data)


async def test_a_job_in_flight_never_writes_back_what_was_erased(
    caller: Caller, server, pool
) -> None:  # type: ignore[no-untyped-def]
    reply = await ingest(caller, [msg("alice", f"I live in {SECRET}.")])
    gated = Gated()
    runtime = server.runtime
    pipeline = ExtractionPipeline(
        runtime.pool,
        runtime.embedder,
        gated,
        runtime.invalidator,
        pipeline_settings(server.settings),
    )
    assert server.settings.pg_dsn is not None
    worker = OutboxWorker(
        runtime.pool,
        pipeline,
        dataclasses.replace(worker_settings(server.settings)),
        listener=runtime.listener,
    )
    running = asyncio.create_task(worker.drain())
    await asyncio.wait_for(gated.entered.wait(), timeout=10)
    # The worker has read the messages and is extracting; the user is erased meanwhile.
    await caller.stub.Forget(pb.ForgetRequest(scope=pb.Scope(user_id="alice"), erase_user=True))
    gated.release.set()
    await asyncio.wait_for(running, timeout=20)
    assert await rows_mentioning(pool, caller.tenant_id, SECRET) == {t: 0 for t in USER_TABLES}
    assert await contents(caller) == []
    del reply


async def test_forgetting_a_memory_reaches_its_source_lines_in_another_users_session(
    pool,  # type: ignore[no-untyped-def]
) -> None:
    """The source lines are looked for in the user's own sessions first (one shard on Citus)
    and, when some are not there, in the sessions other users own: both are erased."""
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    owner, speaker = Scope(tenant, "alice", "", ""), Scope(tenant, "bob", "", "")
    sent = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    lines = [
        StoredMessage("meet-1", "m1", "bob", "user", f"I flew to {SECRET}", sent),
        StoredMessage("bob-own", "m2", "bob", "user", f"{SECRET} was hot", sent),
    ]
    async with pool.acquire() as conn, conn.transaction():
        await insert_messages(conn, owner, uuid.uuid4(), lines[:1])  # alice's meeting
        await insert_messages(conn, speaker, uuid.uuid4(), lines[1:])  # bob's own session
        kept = []
        for session, line in (("meet-1", "m1"), ("bob-own", "m2")):
            text = f"Bob went to {SECRET} ({line})"
            record = await stored_fact(conn, speaker, text, session_id=session, message_id=line)
            kept.append(record.lineage_id)
        assert await erase_memories(conn, speaker, kept) == 2
        assert (
            await conn.fetchval("SELECT count(*) FROM messages WHERE tenant_id = $1", tenant) == 0
        )


def test_a_topic_stays_linked_only_while_a_remaining_fact_names_it() -> None:
    remaining = ["The user got a new job at Stripe.", "The user loves chess."]
    names = ["Stripe job", "Luna", "chess", "Santa Maria hospital", "CHESS"]
    assert fed_topics(names, remaining) == ["Stripe job", "chess", "CHESS"]
    assert fed_topics(names, []) == []
