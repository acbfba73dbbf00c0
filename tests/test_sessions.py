"""ListSessions, ListEpisodes and ForgetSession over real ingested conversations: counts,
order and pages; the forgetting of one session's messages, episode, pending work and the
facts only it taught, while a fact also stated elsewhere stays with its other provenance."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
import pytest

from memsvc.client import MemoryClient
from memsvc.server.app import MemsvcServer
from memsvc.storage.messages import StoredMessage, insert_messages
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import contents, ingest, msg, status
from tests.read_helpers import prefetch, pscope, recall

Drain = Callable[[], Awaitable[int]]
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND


async def sessions(caller: Caller, **fields: object) -> pb.ListSessionsResponse:
    fields.setdefault("scope", pscope())
    reply: pb.ListSessionsResponse = await caller.stub.ListSessions(
        pb.ListSessionsRequest(**fields)  # type: ignore[arg-type]
    )
    return reply


async def episodes(caller: Caller, **fields: object) -> pb.ListEpisodesResponse:
    fields.setdefault("scope", pscope())
    reply: pb.ListEpisodesResponse = await caller.stub.ListEpisodes(
        pb.ListEpisodesRequest(**fields)  # type: ignore[arg-type]
    )
    return reply


async def forget(caller: Caller, session: str, **scope: str) -> pb.ForgetSessionResponse:
    reply: pb.ForgetSessionResponse = await caller.stub.ForgetSession(
        pb.ForgetSessionRequest(scope=pscope(**scope), session_id=session)
    )
    return reply


async def memories(caller: Caller) -> dict[str, pb.Memory]:
    reply = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=pscope(), page_size=500))
    return {m.content: m for m in reply.memories}


async def footprint(pool: asyncpg.Pool, tenant: str) -> dict[str, int]:
    """Rows of the tenant in every table ForgetSession may touch, and the content version."""
    async with pool.acquire() as conn:
        counts = {
            t: await conn.fetchval(f"SELECT count(*) FROM {t} WHERE tenant_id = $1", tenant)
            for t in ("messages", "episodes", "memories", "topics", "ingest_outbox")
        }
        counts["version"] = await conn.fetchval(
            "SELECT coalesce(max(version), 0) FROM scope_versions WHERE tenant_id = $1", tenant
        )
    return counts


async def test_list_sessions_counts_order_and_pages(caller: Caller, drain: Drain) -> None:
    old = [msg("alice", "I live in Lisbon."), msg("alice", "I love chess.")]
    await ingest(caller, old, session="s-old", end_of_session=True)
    await ingest(caller, [msg("alice", "I am allergic to peanuts.")], session="s-new")
    # Another agent's session is another scope's: never listed here.
    await ingest(caller, [msg("alice", "I live in Oslo.")], session="s-bot", agent="bot")
    await drain()

    reply = await sessions(caller)
    assert [s.session_id for s in reply.sessions] == ["s-new", "s-old"]
    assert reply.next_page_token == ""
    new, older = reply.sessions
    assert (older.message_count, older.fact_count, older.episode_count, older.ended) == (
        2,
        2,
        1,
        True,
    )
    assert (new.message_count, new.fact_count, new.episode_count, new.ended) == (1, 1, 1, False)
    assert older.first_message_at.ToDatetime() == old[0].sent_at.ToDatetime()
    assert older.last_message_at.ToDatetime() == old[1].sent_at.ToDatetime()
    assert older.first_message_at.ToDatetime() < older.last_message_at.ToDatetime()

    first = await sessions(caller, page_size=1)
    assert [s.session_id for s in first.sessions] == ["s-new"] and first.next_page_token
    second = await sessions(caller, page_size=1, page_token=first.next_page_token)
    assert [s.session_id for s in second.sessions] == ["s-old"]
    assert second.next_page_token == ""

    bot = await sessions(caller, scope=pscope(agent="bot"))
    assert [(s.session_id, s.fact_count) for s in bot.sessions] == [("s-bot", 1)]
    assert (await sessions(caller, scope=pscope(user="bob"))).sessions == []

    listed = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=pscope(), page_size=1))
    for bad in (
        {"page_token": "not-a-token"},
        {"page_token": listed.next_page_token},  # another listing's token
        # Issue 31: this listing's token, sent with another scope.
        {"page_token": first.next_page_token, "scope": pscope(agent="bot")},
        {"page_size": 501},
        {"page_size": -1},
        {"scope": None},
        {"scope": pscope(user="")},
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await sessions(caller, **bad)
        assert err.value.code() == INVALID, bad
        assert next(iter(bad)) in (err.value.details() or ""), err.value.details()


async def test_list_episodes_most_recent_first_by_session_and_pages(
    caller: Caller, drain: Drain
) -> None:
    await ingest(caller, [msg("alice", "I live in Lisbon.")], session="e1")
    await ingest(caller, [msg("alice", "I love chess.")], session="e2")
    await drain()

    reply = await episodes(caller)
    assert [e.session_id for e in reply.episodes] == ["e2", "e1"]
    assert all(e.scope.user_id == "alice" and e.episode_id and e.title for e in reply.episodes)
    assert reply.episodes[0].ended_at.ToDatetime() > reply.episodes[1].ended_at.ToDatetime()
    assert len(reply.episodes[1].source_message_ids) == 1

    only = await episodes(caller, session_id="e1")
    assert [e.session_id for e in only.episodes] == ["e1"]
    assert (await episodes(caller, session_id="nope")).episodes == []

    first = await episodes(caller, page_size=1)
    assert [e.session_id for e in first.episodes] == ["e2"] and first.next_page_token
    second = await episodes(caller, page_size=1, page_token=first.next_page_token)
    assert [e.session_id for e in second.episodes] == ["e1"] and not second.next_page_token

    assert (await episodes(caller, scope=pscope(agent="bot"))).episodes == []
    session_token = (await sessions(caller, page_size=1)).next_page_token
    for bad in (
        {"page_token": session_token},
        {"page_token": "%%%"},
        {"page_size": 501},
        {"session_id": " padded"},
        {"session_id": "x" * 129},
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await episodes(caller, **bad)
        assert err.value.code() == INVALID, bad
        assert next(iter(bad)) in (err.value.details() or "")


async def test_forget_session_removes_what_only_it_taught(
    caller: Caller, drain: Drain, pool: asyncpg.Pool
) -> None:
    await ingest(
        caller,
        [msg("alice", "I live in Zanzibar.", message_id="a1"), msg("alice", "I love chess.")],
        session="A",
        end_of_session=True,
    )
    # Stated again in another session: reinforced, with that session's message as a source.
    await ingest(caller, [msg("alice", "I love chess.", message_id="b1")], session="B")
    # An explicit Remember of a fact learned in A (outside any session): it stays too.
    await ingest(caller, [msg("alice", "I am allergic to peanuts.")], session="A")
    # The same session id in another agent's scope is another session.
    await ingest(caller, [msg("alice", "I live in Zanzibar.")], session="A", agent="bot")
    await drain()
    facts = await memories(caller)
    assert set(facts) == {
        "The user lives in Zanzibar.",
        "The user loves chess.",
        "The user is allergic to peanuts.",
    }, set(facts)
    chess = facts["The user loves chess."]
    assert "b1" in chess.source_message_ids and len(chess.source_message_ids) == 2
    await caller.stub.Remember(
        pb.RememberRequest(scope=pscope(), content="The user is allergic to peanuts.")
    )
    job = (await ingest(caller, [msg("alice", "I like tea.")], session="A")).ingest_id
    assert (await recall(caller, "Zanzibar", types=[pb.ITEM_TYPE_MESSAGE])).items
    warm = await prefetch(caller, hint="Zanzibar")
    assert "Zanzibar" in warm.text
    assert (await prefetch(caller, hint="Zanzibar")).cache == pb.CACHE_STATUS_HIT

    reply = await forget(caller, "A")

    assert (
        reply.messages_deleted,
        reply.episodes_deleted,
        reply.memories_deleted,
        reply.memories_kept,
    ) == (4, 1, 1, 2)
    after = await memories(caller)
    assert set(after) == {"The user loves chess.", "The user is allergic to peanuts."}
    kept = after["The user loves chess."]
    # Its other provenance stays; A's message ids and name are gone from it.
    assert list(kept.source_message_ids) == ["b1"] and kept.session_id == "B"
    assert kept.memory_id == chess.memory_id
    assert list(after["The user is allergic to peanuts."].source_message_ids) == []
    # Messages (and their search index), episode, session and pending work are gone.
    assert (await recall(caller, "Zanzibar", types=[pb.ITEM_TYPE_MESSAGE])).items == []
    assert (await recall(caller, "tea", types=[pb.ITEM_TYPE_MESSAGE])).items == []
    assert (await episodes(caller, session_id="A")).episodes == []
    assert [s.session_id for s in (await sessions(caller)).sessions] == ["B"]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await status(caller, job)
    assert err.value.code() == NOT_FOUND
    await drain()
    assert set(await memories(caller)) == set(after)  # the queued turn was not extracted
    # The Prefetch cache was dropped: a fresh packet, without the forgotten fact.
    fresh = await prefetch(caller, hint="Zanzibar")
    assert fresh.cache != pb.CACHE_STATUS_HIT and "Zanzibar" not in fresh.text
    assert fresh.version > warm.version
    # The other agent's session "A" is untouched.
    bot = await sessions(caller, scope=pscope(agent="bot"))
    assert [(s.session_id, s.message_count, s.fact_count) for s in bot.sessions] == [("A", 1, 1)]
    assert await contents(caller, agent="bot") == ["The user lives in Zanzibar."]
    async with pool.acquire() as conn:
        left = await conn.fetchval(
            "SELECT count(*) FROM messages WHERE tenant_id = $1 AND session_id = 'A'"
            " AND agent_id = ''",
            caller.tenant_id,
        )
    assert left == 0
    # Forgotten: a second call finds nothing.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await forget(caller, "A")
    assert err.value.code() == NOT_FOUND


async def test_forget_session_deletes_every_version_of_a_chain_only_it_taught(
    caller: Caller, drain: Drain
) -> None:
    await ingest(caller, [msg("alice", "I live in Lisbon.")], session="C")
    await drain()
    await ingest(caller, [msg("alice", "I just moved to Porto!")], session="C")
    await ingest(caller, [msg("alice", "I love chess.")], session="D")
    await drain()
    # One chain: Lisbon, superseded by Porto, both learned in C.
    assert await contents(caller, include_superseded=True) == [
        "The user just moved to Porto.",
        "The user lives in Lisbon.",
        "The user loves chess.",
    ]
    reply = await forget(caller, "C")
    assert (reply.memories_deleted, reply.memories_kept) == (2, 0)
    assert await contents(caller, include_superseded=True) == ["The user loves chess."]

    # A chain updated in another session is stated elsewhere: it stays, history included.
    await ingest(
        caller, [msg("bob", "I live in Lisbon.", message_id="e1")], user="bob", session="E"
    )
    await drain()
    await ingest(
        caller, [msg("bob", "I just moved to Porto!", message_id="f1")], user="bob", session="F"
    )
    await drain()
    reply = await forget(caller, "E", user="bob")
    assert (reply.memories_deleted, reply.memories_kept) == (0, 1)
    listed = await caller.stub.ListMemories(
        pb.ListMemoriesRequest(scope=pscope(user="bob"), include_superseded=True)
    )
    by_content = {m.content: m for m in listed.memories}
    assert set(by_content) == {"The user just moved to Porto.", "The user lives in Lisbon."}
    old = by_content["The user lives in Lisbon."]
    assert list(old.source_message_ids) == [] and old.session_id == ""
    assert list(by_content["The user just moved to Porto."].source_message_ids) == ["f1"]


async def test_unknown_session_and_bad_input_delete_nothing(
    caller: Caller, drain: Drain, pool: asyncpg.Pool
) -> None:
    await ingest(caller, [msg("alice", "I live in Lisbon.")], session="keep")
    await drain()
    before = await footprint(pool, caller.tenant_id)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await forget(caller, "unknown")
    assert err.value.code() == NOT_FOUND
    # The session exists, but not in these scopes.
    for other in ({"agent": "bot"}, {"user": "bob"}, {"persona": "p1"}):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await forget(caller, "keep", **other)
        assert err.value.code() == NOT_FOUND, other
    for request, field in (
        (pb.ForgetSessionRequest(scope=pscope()), "session_id"),
        (pb.ForgetSessionRequest(scope=pscope(), session_id="x" * 129), "session_id"),
        (pb.ForgetSessionRequest(scope=pscope(), session_id="a\x00b"), "session_id"),
        (pb.ForgetSessionRequest(scope=pscope(), session_id=" keep"), "session_id"),
        (pb.ForgetSessionRequest(session_id="keep"), "scope"),
        (pb.ForgetSessionRequest(scope=pscope(user=""), session_id="keep"), "scope.user_id"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await caller.stub.ForgetSession(request)
        assert err.value.code() == INVALID
        assert field in (err.value.details() or ""), err.value.details()
    assert await footprint(pool, caller.tenant_id) == before


async def test_forget_session_with_a_persona_reaches_its_facts(
    caller: Caller, drain: Drain
) -> None:
    """A session with a persona (counterpart_persona_id) stores its facts and episode in the
    persona's scope: forgetting the session in the owner's scope removes them too."""
    await ingest(
        caller, [msg("alice", "I live in Lisbon.")], session="P", counterpart_persona_id="p1"
    )
    await drain()
    assert await contents(caller, persona="p1") == ["The user lives in Lisbon."]
    listed = await sessions(caller)
    assert [(s.session_id, s.fact_count, s.episode_count) for s in listed.sessions] == [("P", 1, 1)]
    reply = await forget(caller, "P")
    assert (reply.memories_deleted, reply.episodes_deleted) == (1, 1)
    assert await contents(caller, persona="p1") == []


async def test_list_sessions_stays_fast_for_thousands_of_sessions(
    caller: Caller, pool: asyncpg.Pool
) -> None:
    scope = Scope(caller.tenant_id, "alice")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    stored = [
        StoredMessage(f"s{i:05d}", f"m{j}", "alice", "user", "hello", start + timedelta(i, j))
        for i in range(3_000)
        for j in range(3)
    ]
    async with pool.acquire() as conn:
        await insert_messages(conn, scope, uuid.uuid4(), stored)
        await conn.execute("ANALYZE messages")
    began = time.perf_counter()
    first = await sessions(caller, page_size=50)
    elapsed = time.perf_counter() - began
    assert [s.session_id for s in first.sessions][:2] == ["s02999", "s02998"]
    assert first.sessions[0].message_count == 3
    assert elapsed < 1.0, elapsed
    # Walking every page visits each session once, in order.
    seen: list[str] = [s.session_id for s in first.sessions]
    token = first.next_page_token
    while token:
        page = await sessions(caller, page_size=500, page_token=token)
        seen += [s.session_id for s in page.sessions]
        token = page.next_page_token
    assert seen == [f"s{i:05d}" for i in reversed(range(3_000))]


async def test_client_helpers(caller: Caller, server: MemsvcServer, drain: Drain) -> None:
    await ingest(caller, [msg("alice", "I love chess.")], session="c1")
    await drain()
    async with MemoryClient(f"127.0.0.1:{server.port}", api_key=caller.key) as client:
        listed = await client.list_sessions(pb.ListSessionsRequest(scope=pscope()))
        assert [s.session_id for s in listed.sessions] == ["c1"]
        eps = await client.list_episodes(pb.ListEpisodesRequest(scope=pscope()))
        assert [e.session_id for e in eps.episodes] == ["c1"]
        done = await client.forget_session(pb.ForgetSessionRequest(scope=pscope(), session_id="c1"))
        assert (done.messages_deleted, done.memories_deleted) == (1, 1)


async def test_a_batch_remember_outside_the_session_keeps_the_fact(
    caller: Caller, drain: Drain
) -> None:
    await ingest(caller, [msg("alice", "I love chess.")], session="G")
    await ingest(caller, [msg("alice", "I live in Lisbon.")], session="G")
    await drain()
    await caller.stub.RememberBatch(
        pb.RememberBatchRequest(
            scope=pscope(), items=[pb.RememberRequest(content="The user loves chess.")]
        )
    )
    reply = await forget(caller, "G")
    assert (reply.memories_deleted, reply.memories_kept) == (1, 1)
    assert await contents(caller) == ["The user loves chess."]
