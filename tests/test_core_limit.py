"""The core-memory limit: compaction keeps each scope's core block within its characters,
demotes in priority order, never loses a fact, and refuses a single memory that cannot fit."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import grpc
import pytest

from memsvc.extraction.openai_chat import OpenAIChatExtractor
from memsvc.governance import trust
from memsvc.governance.compaction import CoreCompactor, CoreLimits, block_chars
from memsvc.server.app import MemsvcServer
from memsvc.storage import core as core_store
from memsvc.storage import memories as store
from memsvc.storage.model import NewMemory, Scope
from memsvc.storage.normalize import content_hash
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import ingest, msg
from tests.read_helpers import StartServer, stub_for
from tests.read_helpers import start_server as start_server  # fixture
from tests.test_openai_extractor import FakeChat, chat, fake_chat  # noqa: F401

LIMIT = 2_000  # the default for both blocks
SCOPE = pb.Scope(user_id="alice")


def fact(word: str, length: int) -> str:
    body = f"Remembers {word} from the trip" + " with friends and family" * 200
    return body[:length]


async def remember(
    caller: Caller, content: str, sc: pb.Scope = SCOPE, **fields: object
) -> pb.Memory:
    reply: pb.RememberResponse = await caller.stub.Remember(
        pb.RememberRequest(scope=sc, content=content, **fields)  # type: ignore[arg-type]
    )
    return reply.memory


async def listed(caller: Caller, sc: pb.Scope = SCOPE) -> dict[str, pb.Memory]:
    reply = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=sc, page_size=500))
    return {m.memory_id: m for m in reply.memories}


def stable(memories: dict[str, pb.Memory]) -> dict[str, tuple[object, ...]]:
    return {
        i: (m.content, m.role, m.pinned, m.status, m.superseded_by_id, m.HasField("demoted_at"))
        for i, m in memories.items()
    }


def block_of(memories: dict[str, pb.Memory]) -> int:
    return sum(len(m.content) for m in memories.values() if m.pinned or m.role == "core")


async def found_by_recall(caller: Caller, word: str) -> list[str]:
    reply = await caller.stub.Recall(
        pb.RecallRequest(scope=SCOPE, query=word, top_k=5, mode=pb.RECALL_MODE_LEXICAL)
    )
    return [i.memory.memory_id for i in reply.items if i.HasField("memory")]


async def test_remember_compacts_in_priority_order_and_loses_nothing(
    caller: Caller, pool: asyncpg.Pool
) -> None:
    core = await remember(caller, fact("aardvark", 500), role="core", confidence=0.95)
    weak_pin = await remember(caller, fact("bison", 500), pinned=True, confidence=0.6)
    strong_pin = await remember(caller, fact("caribou", 500), pinned=True)
    assert block_of(await listed(caller)) == 1_500
    # 2,100 > 2,000: the core-role fact goes first, however sure (pinned ones outrank it).
    fourth = await remember(caller, fact("dingo", 600), pinned=True)
    after = await listed(caller)
    assert block_of(after) == 1_600 <= LIMIT
    demoted = after[core.memory_id]
    assert (demoted.role, demoted.pinned) == ("context", False)
    assert demoted.HasField("demoted_at")
    assert all(not after[m.memory_id].HasField("demoted_at") for m in (weak_pin, strong_pin))
    # Next overflow: among pinned ones, the least confident goes; the new one is kept.
    fifth = await remember(caller, fact("emu", 500), pinned=True)
    after = await listed(caller)
    assert block_of(after) == 1_600 <= LIMIT
    assert after[weak_pin.memory_id].HasField("demoted_at")
    assert not after[weak_pin.memory_id].pinned
    for kept in (strong_pin, fourth, fifth):
        assert after[kept.memory_id].pinned and not after[kept.memory_id].HasField("demoted_at")
    # Nothing was deleted: every id is listed, and Recall still finds the demoted ones.
    originals = [core, weak_pin, strong_pin, fourth, fifth]
    assert {m.memory_id for m in originals} <= set(after)
    for m, word in zip(originals, ("aardvark", "bison", "caribou", "dingo", "emu"), strict=True):
        assert m.memory_id in await found_by_recall(caller, word)
    # The former role and pinning are kept in the row.
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT memory_id::text AS id, demoted_role, demoted_pinned FROM memories"
            " WHERE tenant_id = $1 AND demoted_at IS NOT NULL",
            caller.tenant_id,
        )
    assert {r["id"]: (r["demoted_role"], r["demoted_pinned"]) for r in rows} == {
        core.memory_id: ("core", False),
        weak_pin.memory_id: ("context", True),
    }
    # Prefetch's core section shows only what is left in the block.
    packet = await caller.stub.Prefetch(pb.PrefetchRequest(scope=SCOPE, session_id="s"))
    assert packet.counts.core.total == 3


async def test_larger_than_the_limit_is_refused_and_writes_nothing(
    caller: Caller, start_server: StartServer
) -> None:
    _, channel = await start_server(human_block_max_chars=1_000, persona_block_max_chars=800)
    stub = stub_for(channel, caller)

    async def put(content: str, sc: pb.Scope = SCOPE, **fields: object) -> pb.Memory:
        reply = await stub.Remember(pb.RememberRequest(scope=sc, content=content, **fields))
        memory: pb.Memory = reply.memory
        return memory

    pinned = await put(fact("fox", 300), pinned=True)
    before = await listed(caller)
    for fields in ({"pinned": True}, {"role": "core"}):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await put(fact("giraffe", 1_001), **fields)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "core-memory limit of 1,000" in (err.value.details() or "")
        assert "MEMSVC_HUMAN_BLOCK_MAX_CHARS" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Correct(
            pb.CorrectRequest(scope=SCOPE, memory_id=pinned.memory_id, new_content="y" * 1_001)
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "new_content" in (err.value.details() or "")
    # Nothing written, nothing superseded (read-time fields aside).
    assert stable(await listed(caller)) == stable(before)
    # A persona scope's core facts belong to its human block too (the persona block is
    # written text only): the human limit applies; unpinned, the same text is ordinary.
    persona_scope = pb.Scope(user_id="alice", persona_id="p1")
    assert (await put(fact("hyena", 801), persona_scope, pinned=True)).pinned
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await put(fact("iguana", 1_001), persona_scope, pinned=True)
    assert "MEMSVC_HUMAN_BLOCK_MAX_CHARS" in (err.value.details() or "")
    plain = await put(fact("ibis", 1_500))
    assert plain.role == "context" and not plain.pinned


async def test_correct_of_a_core_memory_compacts(caller: Caller) -> None:
    other = await remember(caller, fact("jackal", 900), pinned=True, confidence=0.7)
    target = await remember(caller, fact("koala", 900), pinned=True)
    corrected: pb.Memory = await caller.stub.Correct(
        pb.CorrectRequest(
            scope=SCOPE, memory_id=target.memory_id, new_content=fact("koala, corrected", 1_500)
        )
    )
    after = await listed(caller)
    assert corrected.pinned and not corrected.HasField("demoted_at")
    assert after[other.memory_id].HasField("demoted_at")
    assert block_of(after) == 1_500


async def test_remember_says_which_pins_it_displaced(caller: Caller, server: MemsvcServer) -> None:
    # "Least recently referenced" orders demotion: ListMemories below records references
    # and the server flushes them on its own clock, so a flush between two pins changed
    # which pin went first. None is flushed during the test: all are never referenced,
    # and the oldest goes first.
    async with server.runtime.references.held():

        async def pin(word: str, length: int) -> pb.RememberResponse:
            reply: pb.RememberResponse = await caller.stub.Remember(
                pb.RememberRequest(scope=SCOPE, content=fact(word, length), pinned=True)
            )
            return reply

        def unpinned(memories: dict[str, pb.Memory]) -> list[str]:
            return [i for i, m in memories.items() if m.HasField("demoted_at")]

        # Ten pins of 200 characters fill the 2,000-character block exactly: nothing displaced.
        replies = [await pin(f"pin{i}", 200) for i in range(10)]
        assert all(not r.displaced for r in replies)
        assert unpinned(await listed(caller)) == []
        ids = [r.memory.memory_id for r in replies]
        # The eleventh and twelfth each displace the oldest explicit pin, and say so.
        for n, word in ((0, "pin10"), (1, "pin11")):
            reply = await pin(word, 200)
            assert [m.memory_id for m in reply.displaced] == [ids[n]]
            gone = reply.displaced[0]
            assert (gone.pinned, gone.role, gone.HasField("demoted_at")) == (False, "context", True)
            after = await listed(caller)
            assert sorted(unpinned(after)) == sorted(ids[: n + 1])
            assert after[ids[n]].demoted_at == gone.demoted_at
        # One write displacing several lists them in the order they were displaced.
        reply = await pin("pin12", 400)
        assert [m.memory_id for m in reply.displaced] == ids[2:4]
        assert sorted(unpinned(await listed(caller))) == sorted(ids[:4])
        assert block_of(await listed(caller)) == LIMIT
        # An unpinned, non-core memory never displaces anything.
        plain = await caller.stub.Remember(
            pb.RememberRequest(scope=SCOPE, content=fact("owl", 900))
        )
        assert not plain.displaced and not plain.memory.pinned


async def test_extraction_promoting_a_core_fact_counts_demotions(
    caller: Caller, drain: Callable[[], Awaitable[int]]
) -> None:
    filler = await remember(caller, fact("lemur", 1_000), role="core", confidence=0.6)
    kept = await remember(caller, fact("marmot", 990), pinned=True)
    # Session goals become core facts of the owner ("Goal: ...").
    reply = await ingest(
        caller,
        [msg("alice", "Hi, I need help planning my week.")],
        goals=["finish the quarterly report"],
    )
    assert await drain() >= 1
    status: pb.IngestStatus = await caller.stub.GetIngestStatus(
        pb.GetIngestStatusRequest(ingest_id=reply.ingest_id)
    )
    assert status.state == pb.INGEST_STATE_DONE
    assert status.outcome.core_demoted == 1
    after = await listed(caller)
    assert after[filler.memory_id].HasField("demoted_at")
    assert not after[kept.memory_id].HasField("demoted_at")
    goal = [m for m in after.values() if m.content.startswith("Goal:")]
    assert len(goal) == 1 and goal[0].role == "core"
    assert block_of(after) <= LIMIT


async def _fill_block(pool: asyncpg.Pool, scope: Scope, sizes: list[int]) -> list[uuid.UUID]:
    ids = []
    async with pool.acquire() as conn:
        for i, size in enumerate(sizes):
            content = fact(f"item{i}", size)
            record, _ = await store.insert_or_reinforce(
                conn,
                scope,
                NewMemory(
                    content=content,
                    category="profile",
                    role="core",
                    confidence=0.5 + i / 100,
                    source_message_ids=(f"m{i}",),
                ),
                content_hash=content_hash(content),
                embedding=None,
                embedding_model="",
            )
            ids.append(record.memory_id)
    return ids


def _compactor(summarizer: OpenAIChatExtractor | None, limit: int = 1_000) -> CoreCompactor:
    return CoreCompactor(
        CoreLimits(human_chars=limit, persona_chars=limit, core_role="core"),
        trust.TrustPolicy(),
        summarizer=summarizer,
        summarize_timeout_s=5.0,
    )


async def test_model_compaction_folds_items_into_one_summary(
    fake_chat: FakeChat,  # noqa: F811
    pool: asyncpg.Pool,
) -> None:
    scope = Scope(f"t-{uuid.uuid4().hex[:12]}", "alice")
    ids = await _fill_block(pool, scope, [300, 300, 300, 300])  # 1,200 > 1,000
    fake_chat.script(chat({"summary": "Remembers item0 and item1 from trips with family."}))
    extractor = OpenAIChatExtractor(base_url=fake_chat.base_url, model="m", timeout_s=5.0)
    try:
        async with pool.acquire() as conn, conn.transaction():
            result = await _compactor(extractor).enforce(conn, scope, path="test")
            block = await core_store.block(conn, scope, "core")
    finally:
        await extractor.aclose()
    # A quarter of the limit is freed: the two least confident go into one summary.
    assert set(result.demoted) == {ids[0], ids[1]}
    assert result.summary_id is not None
    asked = fake_chat.question()
    assert asked["max_chars"] <= 1_000 - 600 and len(asked["facts"]) == 2
    assert block_chars(block) <= 1_000
    summary = next(r for r in block if r.memory_id == result.summary_id)
    assert summary.origin == "compaction" and summary.role == "core"
    assert summary.source_message_ids == ("m0", "m1")
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT memory_id, demoted_into FROM memories WHERE tenant_id = $1"
            " AND demoted_at IS NOT NULL",
            scope.tenant_id,
        )
        total = await conn.fetchval(
            "SELECT count(*) FROM memories WHERE tenant_id = $1", scope.tenant_id
        )
    assert {r["memory_id"]: r["demoted_into"] for r in rows} == {
        ids[0]: result.summary_id,
        ids[1]: result.summary_id,
    }
    assert total == 5  # the four originals and the summary: nothing deleted


async def test_model_failure_falls_back_to_demotion(
    fake_chat: FakeChat,  # noqa: F811
    pool: asyncpg.Pool,
) -> None:
    scope = Scope(f"t-{uuid.uuid4().hex[:12]}", "alice")
    ids = await _fill_block(pool, scope, [300, 300, 300, 300])
    fake_chat.script((500, b'{"error": "overloaded"}'))
    extractor = OpenAIChatExtractor(base_url=fake_chat.base_url, model="m", timeout_s=5.0)
    try:
        async with pool.acquire() as conn, conn.transaction():
            result = await _compactor(extractor).enforce(conn, scope, path="test")
            block = await core_store.block(conn, scope, "core")
    finally:
        await extractor.aclose()
    assert result.summary_id is None
    assert list(result.demoted) == [ids[0]]  # only what is needed, least confident first
    assert block_chars(block) == 900
