"""Recall end to end over gRPC: both legs, fusion, kinds, modes, as_of, CJK, scope filters."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from memsvc.embedding import Embedder
from memsvc.storage.messages import index_session_context
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.read_helpers import (
    StartServer,
    days_ago,
    dscope,
    pscope,
    recall,
    seed_episode,
    seed_messages,
    stub_for,
)
from tests.read_helpers import start_server as start_server  # fixture
from tests.test_explicit_memory import remember

FACT, EPISODE, MESSAGE = pb.ITEM_TYPE_FACT, pb.ITEM_TYPE_EPISODE, pb.ITEM_TYPE_MESSAGE
HYBRID, DENSE, LEXICAL = pb.RECALL_MODE_HYBRID, pb.RECALL_MODE_DENSE, pb.RECALL_MODE_LEXICAL


def ts(value: datetime) -> Timestamp:
    t = Timestamp()
    t.FromDatetime(value)
    return t


async def test_hybrid_finds_by_meaning_and_by_word(caller: Caller) -> None:
    coffee = (await remember(caller, "Takes no sugar in coffee")).memory
    await remember(caller, "Daughter is named Maya")
    await remember(caller, "Works as a nurse in Lisbon")
    reply = await recall(caller, "what does she drink in the morning")
    assert not reply.degraded and list(reply.missing_legs) == []
    top = reply.items[0]
    assert top.id == coffee.memory_id and top.type == FACT
    assert top.memory.content == "Takes no sugar in coffee" and top.text == top.memory.content
    assert top.dense_rank == 1 and top.fused_score > 0 and top.score >= top.fused_score
    assert top.HasField("occurred_at")
    assert reply.timings.total_ms > 0 and reply.timings.embed_ms > 0
    assert reply.timings.dense_ms > 0 and reply.timings.lexical_ms > 0

    by_word = await recall(caller, "is Maya her daughter")
    assert by_word.items[0].memory.content == "Daughter is named Maya"
    assert by_word.items[0].lexical_rank == 1 and by_word.items[0].dense_rank == 1
    assert by_word.route == "relationship"


async def test_any_term_semantics(caller: Caller) -> None:
    await remember(caller, "Allergic to peanuts")
    await remember(caller, "Plays the cello on Sundays")
    # An AND of every word would match nothing; any word is enough.
    reply = await recall(caller, "which instrument, cello or piano, does she play", mode=LEXICAL)
    assert [i.text for i in reply.items] == ["Plays the cello on Sundays"]
    assert reply.items[0].lexical_rank == 1 and reply.items[0].dense_rank == 0


async def test_kinds_messages_and_episodes(
    caller: Caller, pool: asyncpg.Pool, embedder: Embedder
) -> None:
    scope = dscope(caller)
    await remember(caller, "Planning a trip to Kyoto in April")
    await seed_messages(
        pool,
        embedder,
        scope,
        ["I booked the ryokan in Kyoto for April", "The weather has been awful"],
        session_id="chat-7",
        sender="alice",
    )
    await seed_episode(
        pool,
        embedder,
        scope,
        session_id="chat-7",
        title="Kyoto trip",
        summary="Alice booked a ryokan in Kyoto for her April trip.",
        ended_at=days_ago(1),
    )
    default = await recall(caller, "kyoto ryokan booking")
    assert {i.type for i in default.items} == {FACT, EPISODE}

    msgs = await recall(caller, "kyoto ryokan booking", types=[MESSAGE])
    top = msgs.items[0]
    assert top.type == MESSAGE and top.id == "m0" and top.session_id == "chat-7"
    assert top.sender_id == "alice" and top.role == pb.MESSAGE_ROLE_USER
    assert top.text == "I booked the ryokan in Kyoto for April"
    assert not top.HasField("memory")

    eps = await recall(caller, "kyoto ryokan booking", types=[EPISODE])
    assert [i.type for i in eps.items] == [EPISODE]
    assert eps.items[0].text.startswith("Kyoto trip: ") and eps.items[0].session_id == "chat-7"

    everything = await recall(caller, "kyoto", types=[MESSAGE, EPISODE, FACT, MESSAGE])
    assert {i.type for i in everything.items} == {FACT, EPISODE, MESSAGE}


async def test_modes_run_one_leg(caller: Caller) -> None:
    await remember(caller, "Grows tomatoes on the balcony")
    await remember(caller, "Drives a red bicycle to work")
    dense = await recall(caller, "gardening vegetables", mode=DENSE)
    assert dense.items[0].text == "Grows tomatoes on the balcony"
    assert all(i.lexical_rank == 0 and i.dense_rank > 0 for i in dense.items)
    assert dense.timings.lexical_ms == 0
    lexical = await recall(caller, "bicycle", mode=LEXICAL)
    assert [i.text for i in lexical.items] == ["Drives a red bicycle to work"]
    assert lexical.items[0].dense_rank == 0 and lexical.timings.embed_ms == 0
    assert not dense.degraded and not lexical.degraded


async def test_caller_vector_skips_the_embedder(caller: Caller, embedder: Embedder) -> None:
    target = (await remember(caller, "Favourite colour is green")).memory
    await remember(caller, "Owns two cats")
    [vector] = await embedder.embed(["what colour does she like"])
    reply = await recall(caller, query_vector=[float(x) for x in vector])
    assert reply.items[0].id == target.memory_id
    assert reply.timings.embed_ms == 0 and reply.route == "vector"
    assert all(i.lexical_rank == 0 for i in reply.items) and not reply.degraded
    # Text and vector together: the vector feeds the dense leg, the text the lexical one.
    # Relevance is measured against the vector (it says what the caller means), so the
    # word match comes back only with no minimum relevance.
    both = await recall(
        caller,
        "cats",
        query_vector=[float(x) for x in vector],
        filters=pb.RecallFilters(min_score=0.0),
    )
    assert {i.text for i in both.items[:2]} == {"Favourite colour is green", "Owns two cats"}
    assert both.timings.embed_ms == 0


async def test_top_k(caller: Caller) -> None:
    for i in range(15):
        await remember(caller, f"Visited museum number {i} in Paris")
    assert len((await recall(caller, "museum in Paris")).items) == 10
    assert len((await recall(caller, "museum in Paris", top_k=3)).items) == 3
    assert len((await recall(caller, "museum in Paris", top_k=100)).items) == 15


async def test_current_only_by_default_and_as_of_reads_the_past(caller: Caller) -> None:
    old = (
        await remember(caller, "Lives in Berlin", valid_from=ts(datetime(2020, 1, 1, tzinfo=UTC)))
    ).memory
    new = await caller.stub.Correct(
        pb.CorrectRequest(scope=pscope(), memory_id=old.memory_id, new_content="Lives in Singapore")
    )
    now = await recall(caller, "where does she live")
    assert [i.id for i in now.items] == [new.memory_id]
    then = await recall(caller, "where does she live", as_of=ts(datetime(2021, 6, 1, tzinfo=UTC)))
    assert [i.id for i in then.items] == [old.memory_id]
    assert then.items[0].memory.status == pb.MEMORY_STATUS_SUPERSEDED
    before = await recall(caller, "where does she live", as_of=ts(datetime(2019, 1, 1, tzinfo=UTC)))
    assert list(before.items) == []


async def test_as_of_for_messages_and_episodes(
    caller: Caller, pool: asyncpg.Pool, embedder: Embedder
) -> None:
    scope = dscope(caller)
    await seed_messages(
        pool, embedder, scope, ["We adopted a dog"], session_id="old", start=days_ago(10)
    )
    await seed_messages(
        pool, embedder, scope, ["The dog learned to sit"], session_id="new", start=days_ago(1)
    )
    await seed_episode(
        pool,
        embedder,
        scope,
        session_id="old",
        title="Dog adoption",
        summary="They adopted a dog.",
        ended_at=days_ago(10),
    )
    await seed_episode(
        pool,
        embedder,
        scope,
        session_id="new",
        title="Dog training",
        summary="The dog learned to sit.",
        ended_at=days_ago(1),
    )
    midway = ts(days_ago(5))
    msgs = await recall(caller, "dog", types=[MESSAGE], as_of=midway)
    assert [i.session_id for i in msgs.items] == ["old"]
    eps = await recall(caller, "dog", types=[EPISODE], as_of=midway)
    assert [i.session_id for i in eps.items] == ["old"]
    assert len((await recall(caller, "dog", types=[MESSAGE, EPISODE])).items) == 4


@pytest.mark.parametrize("mode", [LEXICAL, HYBRID])
async def test_cjk_text_is_found_by_the_lexical_leg(caller: Caller, mode: int) -> None:
    zh = (await remember(caller, "我每天早上都喝咖啡")).memory
    ja = (await remember(caller, "私はベジタリアンです")).memory
    await remember(caller, "Runs every morning")
    reply = await recall(caller, "咖啡", mode=mode)
    assert reply.items[0].id == zh.memory_id and reply.items[0].lexical_rank == 1
    reply = await recall(caller, "你喝咖啡吗", mode=LEXICAL)
    assert [i.id for i in reply.items] == [zh.memory_id]
    reply = await recall(caller, "ベジタリアン", mode=mode)
    assert reply.items[0].id == ja.memory_id and reply.items[0].lexical_rank == 1


# Same words in every scope: only the caller's own rows (and rows explicitly shared with it)
# may come back, from either leg, for every kind.
OTHER_SCOPES = [
    pscope("alice", persona="nova"),
    pscope("alice", agent="bot-1"),
    pscope("alice", persona="nova", agent="bot-1"),
    pscope("bob"),
]
SECRET = "The blue submarine leaves at dawn"


@pytest.mark.parametrize("mode", [HYBRID, DENSE, LEXICAL])
async def test_scope_filters_on_every_leg_and_kind(
    new_caller,
    pool: asyncpg.Pool,
    embedder: Embedder,
    mode: int,  # type: ignore[no-untyped-def]
) -> None:
    me: Caller = await new_caller()
    stranger: Caller = await new_caller()
    mine = (await remember(me, SECRET)).memory.memory_id
    shared = (
        await remember(
            me,
            SECRET + " (shared)",
            scope=pscope("alice", agent="bot-2"),
            sharing=pb.Sharing(all_agents=True),
        )
    ).memory.memory_id
    for sc in OTHER_SCOPES:
        await remember(me, SECRET, scope=sc)
    await remember(stranger, SECRET)
    for owner, sc in [(me, pscope()), *[(me, s) for s in OTHER_SCOPES], (stranger, pscope())]:
        scope = dscope(owner, sc.user_id, sc.persona_id, sc.agent_id)
        await seed_messages(pool, embedder, scope, [SECRET], session_id="s-secret")
        await seed_episode(
            pool,
            embedder,
            scope,
            session_id="s-secret",
            title="Secret",
            summary=SECRET,
            ended_at=days_ago(1),
        )

    reply = await recall(me, "blue submarine dawn", mode=mode, types=[FACT, EPISODE, MESSAGE])
    facts = {i.id for i in reply.items if i.type == FACT}
    assert facts == {mine, shared}
    assert sum(i.type == EPISODE for i in reply.items) == 1
    assert sum(i.type == MESSAGE for i in reply.items) == 1
    for item in reply.items:
        if item.type == FACT:
            assert item.memory.scope.user_id == "alice"
            assert item.memory.scope.persona_id == ""
    # From the persona's scope, only the persona's own rows (the agent-shared one is not
    # shared across personas).
    nova = await recall(me, "blue submarine dawn", mode=mode, scope=pscope("alice", persona="nova"))
    assert len([i for i in nova.items if i.type == FACT]) == 1
    assert all(i.memory.scope.persona_id == "nova" for i in nova.items if i.type == FACT)
    # The other tenant's alice sees only its own.
    theirs = await recall(
        stranger, "blue submarine dawn", mode=mode, types=[FACT, EPISODE, MESSAGE]
    )
    assert len(theirs.items) == 3


async def test_messages_match_through_their_session_context(
    caller: Caller, pool: asyncpg.Pool, embedder: Embedder
) -> None:
    scope = dscope(caller)
    ids = await seed_messages(
        pool,
        embedder,
        scope,
        ["Where should we go for dinner?", "The new ramen place!", "Sounds great", "Bye"],
        session_id="c",
    )
    async with pool.acquire() as conn:
        await index_session_context(conn, scope, "c", ids)
    reply = await recall(caller, "dinner", types=[MESSAGE], mode=LEXICAL)
    # The turn that says it ranks first; its neighbours match through their context.
    assert [i.id for i in reply.items] == ["m0", "m1", "m2"]


async def test_large_scopes_use_the_indexes_and_still_answer(
    caller: Caller, start_server: StartServer
) -> None:
    coffee = (await remember(caller, "Takes no sugar in coffee")).memory
    await remember(caller, "Daughter is named Maya")
    # Every scope counts as large here: dense via HNSW (iterative scan), lexical via GIN.
    _srv, channel = await start_server(dense_exact_max_rows=1)
    reply = await stub_for(channel, caller).Recall(
        pb.RecallRequest(scope=pscope(), query="coffee with sugar"), timeout=5
    )
    assert not reply.degraded
    assert reply.items[0].id == coffee.memory_id
    assert reply.items[0].dense_rank == 1 and reply.items[0].lexical_rank == 1
