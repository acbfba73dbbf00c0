"""Remember, Correct, ListMemories and GetMemoryHistory end to end over gRPC."""

from __future__ import annotations

import grpc
import pytest

from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller


def scope(user: str = "alice", persona: str = "", agent: str = "") -> pb.Scope:
    return pb.Scope(user_id=user, persona_id=persona, agent_id=agent)


async def remember(caller: Caller, content: str, **fields: object) -> pb.RememberResponse:
    fields.setdefault("scope", scope())
    reply: pb.RememberResponse = await caller.stub.Remember(
        pb.RememberRequest(content=content, **fields)  # type: ignore[arg-type]
    )
    return reply


async def list_all(caller: Caller, sc: pb.Scope | None = None, **fields: object) -> list[pb.Memory]:
    reply = await caller.stub.ListMemories(
        pb.ListMemoriesRequest(scope=sc or scope(), page_size=500, **fields)  # type: ignore[arg-type]
    )
    return list(reply.memories)


async def test_remember_stores_every_field(caller: Caller) -> None:
    reply = await remember(
        caller,
        "  I am a   vegetarian ",
        category="preference",
        role="core",
        confidence=0.8,
        pinned=True,
        source_message_ids=["m1", "m2"],
        session_id="s1",
        subject="user",
        predicate="diet",
        object="vegetarian",
    )
    m = reply.memory
    assert not reply.reinforced
    assert m.content == "I am a vegetarian"
    assert (m.category, m.role, m.pinned, m.session_id) == ("preference", "core", True, "s1")
    assert m.confidence == pytest.approx(0.8)
    assert list(m.source_message_ids) == ["m1", "m2"]
    assert (m.subject, m.predicate, m.object) == ("user", "diet", "vegetarian")
    assert m.status == pb.MEMORY_STATUS_ACTIVE
    assert m.origin == "explicit"
    assert m.HasField("valid_from") and m.HasField("recorded_at")
    assert not m.HasField("invalid_at")
    assert [x.memory_id for x in await list_all(caller)] == [m.memory_id]


async def test_remember_defaults(caller: Caller) -> None:
    m = (await remember(caller, "Lives in Singapore")).memory
    assert (m.category, m.role) == ("context", "context")
    assert m.confidence == pytest.approx(0.9)


async def test_exact_duplicate_reinforces_instead_of_adding(caller: Caller, pool) -> None:  # type: ignore[no-untyped-def]
    first = (await remember(caller, "My daughter is named Maya.", source_message_ids=["a"])).memory
    again = await remember(caller, "my daughter is  named maya", source_message_ids=["b"])
    assert again.reinforced
    assert again.memory.memory_id == first.memory_id
    assert again.memory.reinforced_count == 1
    assert list(again.memory.source_message_ids) == ["a", "b"]
    third = await remember(caller, "My daughter is named Maya")
    assert third.memory.reinforced_count == 2
    memories = await list_all(caller)
    assert len(memories) == 1
    async with pool.acquire() as conn:
        rows = await conn.fetchval(
            "SELECT count(*) FROM memories WHERE tenant_id = $1", caller.tenant_id
        )
    assert rows == 1


async def test_same_text_in_another_scope_is_a_new_memory(caller: Caller) -> None:
    a = (await remember(caller, "Prefers tea")).memory
    b = await remember(caller, "Prefers tea", scope=scope(agent="support-bot"))
    assert not b.reinforced
    assert b.memory.memory_id != a.memory_id


async def test_remember_is_embedded(caller: Caller, pool) -> None:  # type: ignore[no-untyped-def]
    m = (await remember(caller, "I work at a bakery")).memory
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT embedding_state, embedding_model, vector_dims(embedding) AS dims"
            " FROM memories WHERE tenant_id = $1 AND memory_id = $2::uuid",
            caller.tenant_id,
            m.memory_id,
        )
    assert row["embedding_state"] == "ok"
    assert row["embedding_model"] == "all-MiniLM-L6-v2-onnx-qint8"
    assert row["dims"] == 384


async def test_correct_supersedes_and_keeps_history(caller: Caller) -> None:
    old = (
        await remember(caller, "I take sugar in my coffee", category="preference", confidence=0.6)
    ).memory
    new = await caller.stub.Correct(
        pb.CorrectRequest(
            scope=scope(),
            memory_id=old.memory_id,
            new_content="I don't take sugar",
            reason="user said so",
        )
    )
    assert new.supersedes_id == old.memory_id
    assert new.confidence == pytest.approx(1.0)
    assert new.category == "preference"
    assert new.origin == "correction"
    assert new.correction_reason == "user said so"
    assert new.status == pb.MEMORY_STATUS_ACTIVE

    current = await list_all(caller)
    assert [m.memory_id for m in current] == [new.memory_id]
    everything = await list_all(caller, include_superseded=True)
    by_id = {m.memory_id: m for m in everything}
    assert set(by_id) == {old.memory_id, new.memory_id}
    closed = by_id[old.memory_id]
    assert closed.status == pb.MEMORY_STATUS_SUPERSEDED
    assert closed.HasField("invalid_at")
    assert closed.superseded_by_id == new.memory_id

    newer = await caller.stub.Correct(
        pb.CorrectRequest(
            scope=scope(), memory_id=new.memory_id, new_content="I take honey instead"
        )
    )
    for probe in (old.memory_id, new.memory_id, newer.memory_id):
        history = await caller.stub.GetMemoryHistory(
            pb.GetMemoryHistoryRequest(scope=scope(), memory_id=probe)
        )
        assert [v.content for v in history.versions] == [
            "I take sugar in my coffee",
            "I don't take sugar",
            "I take honey instead",
        ]


async def test_correcting_a_superseded_version_is_refused(caller: Caller) -> None:
    old = (await remember(caller, "Lives in Delhi")).memory
    await caller.stub.Correct(
        pb.CorrectRequest(scope=scope(), memory_id=old.memory_id, new_content="Lives in Singapore")
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Correct(
            pb.CorrectRequest(scope=scope(), memory_id=old.memory_id, new_content="Lives in Paris")
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert len(await list_all(caller, include_superseded=True)) == 2


async def test_correct_to_identical_content_is_invalid(caller: Caller) -> None:
    old = (await remember(caller, "Likes jazz")).memory
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Correct(
            pb.CorrectRequest(scope=scope(), memory_id=old.memory_id, new_content="likes jazz.")
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(await list_all(caller, include_superseded=True)) == 1


async def test_list_pages_and_filters(caller: Caller) -> None:
    ids = []
    for i in range(7):
        ids.append(
            (
                await remember(caller, f"fact number {i}", category="event" if i % 2 else "goal")
            ).memory.memory_id
        )
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        reply = await caller.stub.ListMemories(
            pb.ListMemoriesRequest(scope=scope(), page_size=3, page_token=token)
        )
        seen.extend(m.memory_id for m in reply.memories)
        pages += 1
        token = reply.next_page_token
        if not token:
            break
    assert pages == 3
    assert seen == list(reversed(ids))
    goals = await list_all(caller, filters=pb.MemoryFilters(categories=["goal"]))
    assert {m.content for m in goals} == {f"fact number {i}" for i in (0, 2, 4, 6)}


async def test_a_page_token_only_continues_its_own_listing(caller: Caller) -> None:
    """Issue 31: a token is bound to its scope and filters; with others it was a position in
    a listing it did not come from (rows skipped or repeated without a word)."""
    for i in range(3):
        await remember(caller, f"alice fact {i}", category="goal")
        await caller.stub.Remember(
            pb.RememberRequest(scope=scope(persona="nova"), content=f"nova fact {i}")
        )
    first = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=scope(), page_size=1))
    token = first.next_page_token
    assert token
    same = await caller.stub.ListMemories(
        pb.ListMemoriesRequest(scope=scope(), page_size=2, page_token=token)
    )
    assert len(same.memories) == 2
    for other in (
        {"scope": scope(persona="nova")},
        {"scope": scope(user="bob")},
        {"scope": scope(), "include_superseded": True},
        {"scope": scope(), "filters": pb.MemoryFilters(categories=["goal"])},
        {"scope": scope(), "filters": pb.MemoryFilters(pinned_only=True)},
        {"scope": scope(), "filters": pb.MemoryFilters(session_id="s1")},
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await caller.stub.ListMemories(
                pb.ListMemoriesRequest(page_size=1, page_token=token, **other)  # type: ignore[arg-type]
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, other
        details = err.value.details() or ""
        assert details.startswith("page_token: returned for another listing"), details
        assert token not in details


async def test_list_pinned_and_session_filters(caller: Caller) -> None:
    await remember(caller, "pinned one", pinned=True, session_id="s-a")
    await remember(caller, "loose one", session_id="s-b")
    pinned = await list_all(caller, filters=pb.MemoryFilters(pinned_only=True))
    assert [m.content for m in pinned] == ["pinned one"]
    in_b = await list_all(caller, filters=pb.MemoryFilters(session_id="s-b"))
    assert [m.content for m in in_b] == ["loose one"]
