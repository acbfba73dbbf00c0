"""Scope isolation: tenant, user, persona and agent are matched exactly on every read and write."""

from __future__ import annotations

import uuid

import grpc
import pytest

from memsvc.observability import metrics
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.read_helpers import prefetch, recall
from tests.test_explicit_memory import list_all, remember, scope
from tests.test_export import export, ids

SCOPES = [
    scope("alice"),
    scope("alice", persona="nova"),
    scope("alice", agent="bot-1"),
    scope("alice", persona="nova", agent="bot-1"),
    scope("bob"),
]


async def test_each_scope_sees_only_its_own(caller: Caller) -> None:
    ids = {}
    for sc in SCOPES:
        ids[sc.SerializeToString()] = (
            await remember(caller, "same words everywhere", scope=sc)
        ).memory.memory_id
    assert len(set(ids.values())) == len(SCOPES)
    for sc in SCOPES:
        seen = [m.memory_id for m in await list_all(caller, sc)]
        assert seen == [ids[sc.SerializeToString()]], sc


async def test_foreign_ids_are_not_found_and_unchanged(caller: Caller) -> None:
    mine = (await remember(caller, "alice's secret", scope=scope("alice"))).memory
    for other in SCOPES[1:]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await caller.stub.GetMemoryHistory(
                pb.GetMemoryHistoryRequest(scope=other, memory_id=mine.memory_id)
            )
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await caller.stub.Correct(
                pb.CorrectRequest(scope=other, memory_id=mine.memory_id, new_content="hijacked")
            )
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await caller.stub.Forget(pb.ForgetRequest(scope=other, memory_ids=[mine.memory_id]))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    [still] = await list_all(caller, scope("alice"))
    assert still.content == "alice's secret" and still.memory_id == mine.memory_id


async def test_other_tenant_never_sees_the_memory(new_caller) -> None:  # type: ignore[no-untyped-def]
    a: Caller = await new_caller()
    b: Caller = await new_caller()
    mine = (await remember(a, "tenant A's fact")).memory
    assert await list_all(b) == []
    for call in (
        b.stub.GetMemoryHistory(
            pb.GetMemoryHistoryRequest(scope=scope(), memory_id=mine.memory_id)
        ),
        b.stub.Correct(pb.CorrectRequest(scope=scope(), memory_id=mine.memory_id, new_content="x")),
        b.stub.Forget(pb.ForgetRequest(scope=scope(), memory_ids=[mine.memory_id])),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    # Even erasing the same user id in tenant B leaves tenant A's memory alone.
    await b.stub.Forget(pb.ForgetRequest(scope=scope(), erase_user=True))
    assert [m.memory_id for m in await list_all(a)] == [mine.memory_id]


async def test_sharing_is_explicit(caller: Caller) -> None:
    shared = (
        await remember(
            caller,
            "Allergic to peanuts",
            scope=scope(agent="bot-1"),
            sharing=pb.Sharing(all_agents=True),
        )
    ).memory
    private = (await remember(caller, "Asked bot-1 about taxes", scope=scope(agent="bot-1"))).memory
    seen_by_bot2 = [m.memory_id for m in await list_all(caller, scope(agent="bot-2"))]
    assert seen_by_bot2 == [shared.memory_id]
    assert private.memory_id not in seen_by_bot2
    # Sharing across agents does not cross into a persona's memory.
    assert await list_all(caller, scope(persona="nova", agent="bot-2")) == []
    assert await list_all(caller, scope("bob", agent="bot-2")) == []


async def refused(call: object) -> str:
    """The details of a call that must answer NOT_FOUND."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    assert err.value.code() == grpc.StatusCode.NOT_FOUND, err.value.details()
    return str(err.value.details())


@pytest.mark.parametrize(
    ("owner", "other", "sharing"),
    [
        (scope(agent="bot-1"), scope(agent="bot-2"), pb.Sharing(all_agents=True)),
        (scope(persona="nova"), scope(persona="echo"), pb.Sharing(all_personas=True)),
    ],
)
async def test_sharing_grants_reads_never_changes_by_others(
    caller: Caller, owner: pb.Scope, other: pb.Scope, sharing: pb.Sharing
) -> None:
    shared = (await remember(caller, "Allergic to peanuts", scope=owner, sharing=sharing)).memory
    own = (await remember(caller, "Asked about taxes", scope=other)).memory
    assert shared.memory_id in [m.memory_id for m in await list_all(caller, other)]
    unknown = str(uuid.uuid4())

    def forget(*ids: str) -> object:
        return caller.stub.Forget(pb.ForgetRequest(scope=other, memory_ids=list(ids)))

    # The same answer as for an id that does not exist: nothing tells the two apart.
    assert (await refused(forget(shared.memory_id))).replace(shared.memory_id, "?") == (
        await refused(forget(unknown))
    ).replace(unknown, "?")
    # Named with the caller's own memory, the whole call still deletes nothing.
    await refused(forget(own.memory_id, shared.memory_id))
    await refused(
        caller.stub.Correct(
            pb.CorrectRequest(scope=other, memory_id=shared.memory_id, new_content="hijacked")
        )
    )
    [still] = [m for m in await list_all(caller, owner) if m.memory_id == shared.memory_id]
    assert still.content == "Allergic to peanuts"
    assert own.memory_id in [m.memory_id for m in await list_all(caller, other)]
    # The owner still can.
    reply = await caller.stub.Forget(pb.ForgetRequest(scope=owner, memory_ids=[shared.memory_id]))
    assert reply.deleted == 1
    assert await list_all(caller, owner) == []
    assert [m.memory_id for m in await list_all(caller, other)] == [own.memory_id]


async def seen_from(caller: Caller, sc: pb.Scope, query: str) -> dict[str, set[str]]:
    """The memory ids each read (ListMemories, Recall, Prefetch, Export) shows the scope."""
    listed = {m.memory_id for m in await list_all(caller, sc)}
    recalled = await recall(caller, query, scope=sc, types=[pb.ITEM_TYPE_FACT])
    packet = await prefetch(caller, scope=sc, session_id="s", hint=query)
    return {
        "list": listed,
        "recall": {i.id for i in recalled.items},
        "prefetch": {f.memory_id for f in packet.facts},
        "export": set(ids(await export(caller, sc), "memory")),
    }


async def assert_unseen(caller: Caller, sc: pb.Scope, query: str, word: str) -> None:
    """Nothing of the shared memory reaches `sc`: no list, recall, prefetch or export id, and
    not a word of it in the packet text."""
    assert await seen_from(caller, sc, query) == {
        "list": set(),
        "recall": set(),
        "prefetch": set(),
        "export": set(),
    }, sc
    packet = await prefetch(caller, scope=sc, session_id="s", hint=query)
    assert word not in packet.text


async def test_persona_sharing_never_reaches_the_humans_own_scope(caller: Caller) -> None:
    everywhere = pb.Sharing(all_personas=True, all_agents=True)
    nova = (
        await remember(
            caller,
            "Nova speaks with a soft Lisbon accent",
            scope=scope(persona="nova"),
            sharing=everywhere,
            pinned=True,
        )
    ).memory.memory_id
    query = "Lisbon accent"
    for sc in (scope(persona="echo"), scope(persona="echo", agent="bot-1")):
        assert all(nova in ids for ids in (await seen_from(caller, sc, query)).values()), sc
    for sc in (scope(), scope(agent="bot-1")):
        await assert_unseen(caller, sc, query, "Lisbon")


async def test_human_sharing_never_reaches_a_persona_scope(caller: Caller) -> None:
    everywhere = pb.Sharing(all_personas=True, all_agents=True)
    human = (
        await remember(
            caller,
            "Alice grew up near the Lisbon docks",
            scope=scope(),
            sharing=everywhere,
            pinned=True,
        )
    ).memory.memory_id
    query = "Lisbon docks"
    # all_agents still reaches the human's scope with another agent.
    assert all(
        human in ids for ids in (await seen_from(caller, scope(agent="bot-1"), query)).values()
    )
    for sc in (scope(persona="nova"), scope(persona="nova", agent="bot-1")):
        await assert_unseen(caller, sc, query, "Lisbon")


def _query_embeddings() -> float:
    """Texts the query embedder ran through the model (cache misses), all tenants."""
    return sum(
        sample.value
        for metric in metrics.EMBED_TEXTS.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels.get("where") == "query"
    )


async def test_the_query_embedding_cache_is_per_tenant(new_caller) -> None:  # type: ignore[no-untyped-def]
    """Issue 31: the cache was keyed by (model, text) for every tenant, so tenant A's query
    answered from it (embed_ms about 0.01 against 4-9 ms) told A that tenant B had asked
    the same text. Now A's first asking of B's text runs the model again."""
    a: Caller = await new_caller()
    b: Caller = await new_caller()
    text = f"is the divorce of patient {uuid.uuid4().hex[:6]} final yet"
    await recall(b, text)
    before = _query_embeddings()
    await recall(a, text)
    assert _query_embeddings() == before + 1  # embedded for A: no hit on B's entry
    await recall(a, text)
    assert _query_embeddings() == before + 1  # A's own entry: a hit
