"""RememberBatch end to end: 100 items in one call, per-item results and failures, atomic
all-or-nothing (validation and database errors), dedup within a batch, pins displacing
earlier ones, per-item scopes, and the item-count limits."""

from __future__ import annotations

import uuid

import asyncpg
import grpc
import pytest

from memsvc.client import MemoryClient
from memsvc.governance.policy import parse_pii_policy
from memsvc.server.app import MemsvcServer
from memsvc.storage import tenant_settings
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller

C = grpc.StatusCode
ALICE = pb.Scope(user_id="alice")


def item(content: str, **fields: object) -> pb.RememberRequest:
    return pb.RememberRequest(content=content, **fields)  # type: ignore[arg-type]


async def batch(
    caller: Caller, items: list[pb.RememberRequest], *, atomic: bool = False, **fields: object
) -> pb.RememberBatchResponse:
    fields.setdefault("scope", ALICE)
    reply: pb.RememberBatchResponse = await caller.stub.RememberBatch(
        pb.RememberBatchRequest(items=items, atomic=atomic, **fields)  # type: ignore[arg-type]
    )
    return reply


async def contents(caller: Caller, scope: pb.Scope = ALICE) -> list[str]:
    reply = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=scope, page_size=500))
    return sorted(m.content for m in reply.memories)


async def refused(caller: Caller, request: pb.RememberBatchRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await caller.stub.RememberBatch(request)
    return info.value


async def test_a_batch_of_100_stores_and_embeds_every_item(
    caller: Caller, pool: asyncpg.Pool
) -> None:
    texts = [f"Alice visited lighthouse number {i} on the northern coast" for i in range(100)]
    reply = await batch(caller, [item(t, category="event") for t in texts])
    assert (reply.succeeded, reply.failed) == (100, 0)
    assert [r.index for r in reply.results] == list(range(100))
    assert all(r.ok and not r.response.reinforced for r in reply.results)
    assert [r.response.memory.content for r in reply.results] == texts
    assert {r.response.memory.category for r in reply.results} == {"event"}
    assert await contents(caller) == sorted(texts)
    async with pool.acquire() as conn:
        states = await conn.fetch(
            "SELECT embedding_state, count(*) AS n FROM memories WHERE tenant_id = $1 GROUP BY 1",
            caller.tenant_id,
        )
    assert {r["embedding_state"]: r["n"] for r in states} == {"ok": 100}
    # Recall finds a batch item through the vector and the lexical legs.
    found = await caller.stub.Recall(
        pb.RecallRequest(scope=ALICE, query="lighthouse number 42 northern coast")
    )
    assert any(i.text == texts[42] for i in found.items)


async def test_per_item_failures_leave_the_others_written(caller: Caller) -> None:
    reply = await batch(
        caller,
        [
            item("Alice likes green tea"),
            item("   "),
            item("Alice plays the cello", category="no-such-category"),
            item("Alice lives in Lyon", subject="Alice"),
            item("Alice owns a bicycle", scope=pb.Scope(user_id="")),
            item("Alice speaks Basque"),
        ],
    )
    assert [r.ok for r in reply.results] == [True, False, False, False, False, True]
    assert (reply.succeeded, reply.failed) == (2, 4)
    failed = {r.index: r for r in reply.results if not r.ok}
    assert {r.error_code for r in failed.values()} == {"INVALID_ARGUMENT"}
    assert failed[1].error_message.startswith("items[1].content:")
    assert failed[2].error_message.startswith("items[2].category:")
    assert failed[3].error_message.startswith("items[3].predicate:")
    assert failed[4].error_message.startswith("items[4].scope.user_id:")
    assert not failed[1].HasField("response")
    assert await contents(caller) == ["Alice likes green tea", "Alice speaks Basque"]


async def test_atomic_batch_with_an_invalid_item_writes_nothing(caller: Caller) -> None:
    error = await refused(
        caller,
        pb.RememberBatchRequest(
            scope=ALICE,
            atomic=True,
            items=[item("Alice likes green tea"), item("Alice plays chess"), item("")],
        ),
    )
    assert error.code() == C.INVALID_ARGUMENT
    assert (error.details() or "").startswith("items[2].content:")
    assert await contents(caller) == []


async def test_atomic_batch_refused_by_the_pii_policy_writes_nothing(
    caller: Caller, pool: asyncpg.Pool, server: MemsvcServer
) -> None:
    await tenant_settings.save(pool, caller.tenant_id, pii_policy=parse_pii_policy("reject"))
    server.runtime.policies.forget(caller.tenant_id)
    card = "Alice's card is 4111 1111 1111 1111"
    error = await refused(
        caller,
        pb.RememberBatchRequest(
            scope=ALICE, atomic=True, items=[item("Alice likes tea"), item(card)]
        ),
    )
    assert error.code() == C.INVALID_ARGUMENT
    assert (error.details() or "").startswith("items[1].content")
    assert await contents(caller) == []
    # Not atomic: only that item fails.
    reply = await batch(caller, [item("Alice likes tea"), item(card)])
    assert [r.ok for r in reply.results] == [True, False]
    assert await contents(caller) == ["Alice likes tea"]


async def _install_trigger(pool: asyncpg.Pool, marker: str) -> str:
    name = marker.replace("-", "_")
    async with pool.acquire() as conn:
        await conn.execute(
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$"
            f" BEGIN IF NEW.content LIKE '%{marker}%' THEN"
            " RAISE check_violation USING MESSAGE = 'refused by the test';"
            " END IF; RETURN NEW; END $$"
        )
        await conn.execute(
            f"CREATE TRIGGER {name} BEFORE INSERT ON memories"
            f" FOR EACH ROW EXECUTE FUNCTION {name}()"
        )
    return name


async def _remove_trigger(pool: asyncpg.Pool, name: str) -> None:
    async with pool.acquire() as conn:
        await conn.execute(f"DROP TRIGGER IF EXISTS {name} ON memories")
        await conn.execute(f"DROP FUNCTION IF EXISTS {name}()")


async def test_a_database_error_rolls_back_an_atomic_batch_and_fails_one_item_otherwise(
    caller: Caller, pool: asyncpg.Pool
) -> None:
    marker = f"explode-{uuid.uuid4().hex[:10]}"
    name = await _install_trigger(pool, marker)
    try:
        items = [item("Alice likes tea"), item(f"Alice said {marker}"), item("Alice runs")]
        error = await refused(
            caller, pb.RememberBatchRequest(scope=ALICE, atomic=True, items=items)
        )
        assert error.code() == C.INVALID_ARGUMENT
        assert await contents(caller) == []
        reply = await batch(caller, items)
        assert [r.ok for r in reply.results] == [True, False, True]
        assert reply.results[1].error_code == "INVALID_ARGUMENT"
        assert reply.results[1].error_message.startswith("items[1].")
        assert await contents(caller) == ["Alice likes tea", "Alice runs"]
        # A core item (written one by one, with compaction) fails alone the same way.
        pinned = [item(f"Alice pinned {marker}", pinned=True), item("Alice swims", pinned=True)]
        reply = await batch(caller, pinned)
        assert [r.ok for r in reply.results] == [False, True]
    finally:
        await _remove_trigger(pool, name)


async def test_identical_content_in_one_batch_reinforces_the_first(caller: Caller) -> None:
    before = await caller.stub.Remember(pb.RememberRequest(scope=ALICE, content="Alice likes jazz"))
    reply = await batch(
        caller,
        [
            item("Alice likes tea"),
            item("Alice likes jazz"),
            item("Alice likes tea", confidence=1.0),
            item("Alice likes tea"),
        ],
    )
    r = reply.results
    assert [x.response.reinforced for x in r] == [False, True, True, True]
    assert r[1].response.memory.memory_id == before.memory.memory_id
    assert r[0].response.memory.memory_id == r[2].response.memory.memory_id
    assert r[0].response.memory.memory_id == r[3].response.memory.memory_id
    assert r[3].response.memory.reinforced_count == 2
    assert r[3].response.memory.confidence == pytest.approx(1.0)
    assert await contents(caller) == ["Alice likes jazz", "Alice likes tea"]


def pin_text(i: int) -> str:
    return (f"Pinned fact {i:02d} about Alice's life: " + "she keeps notes of it " * 20)[:200]


async def test_pins_past_the_core_limit_report_what_they_displaced(caller: Caller) -> None:
    reply = await batch(caller, [item(pin_text(i), pinned=True) for i in range(12)])
    assert reply.succeeded == 12
    displaced = [m for r in reply.results for m in r.response.displaced]
    # 12 x 200 characters in a 2,000-character block: at least two earlier pins go.
    assert len(displaced) >= 2
    assert all(not r.response.displaced for r in reply.results[:10])
    batch_ids = [r.response.memory.memory_id for r in reply.results]
    for i, r in enumerate(reply.results):
        # What an item displaced are earlier items, as if Remembered one after another.
        assert {m.memory_id for m in r.response.displaced} <= set(batch_ids[:i])
    assert all(not m.pinned and m.HasField("demoted_at") for m in displaced)
    listed = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=ALICE, page_size=100))
    still_pinned = [m for m in listed.memories if m.pinned]
    assert sum(len(m.content) for m in still_pinned) <= 2_000
    assert len(listed.memories) == 12, "nothing is lost: displaced pins stay as facts"


async def test_each_item_may_name_its_own_scope(caller: Caller) -> None:
    bob = pb.Scope(user_id="bob")
    persona = pb.Scope(user_id="alice", persona_id="p1")
    reply = await batch(
        caller,
        [
            item("Alice likes tea"),
            item("Bob likes coffee", scope=bob),
            item("Alice told the persona a secret", scope=persona),
        ],
    )
    assert reply.succeeded == 3
    assert await contents(caller) == ["Alice likes tea"]
    assert await contents(caller, bob) == ["Bob likes coffee"]
    assert await contents(caller, persona) == ["Alice told the persona a secret"]
    scopes = [r.response.memory.scope for r in reply.results]
    assert [s.user_id for s in scopes] == ["alice", "bob", "alice"]
    # Without a batch scope, an item without its own fails (alone).
    reply = await caller.stub.RememberBatch(
        pb.RememberBatchRequest(items=[item("Bob runs", scope=bob), item("No one")])
    )
    assert [r.ok for r in reply.results] == [True, False]
    assert reply.results[1].error_message.startswith("items[1].scope:")


@pytest.mark.parametrize("count", [0, 101])
async def test_item_count_outside_1_to_100_is_invalid(caller: Caller, count: int) -> None:
    error = await refused(
        caller,
        pb.RememberBatchRequest(scope=ALICE, items=[item(f"Alice fact {i}") for i in range(count)]),
    )
    assert error.code() == C.INVALID_ARGUMENT
    assert (error.details() or "").startswith("items:")
    assert await contents(caller) == []


async def test_a_bad_batch_scope_is_invalid(caller: Caller) -> None:
    error = await refused(
        caller, pb.RememberBatchRequest(scope=pb.Scope(user_id=" x"), items=[item("Alice")])
    )
    assert error.code() == C.INVALID_ARGUMENT
    assert (error.details() or "").startswith("scope.user_id:")


async def test_client_helper(caller: Caller, server: MemsvcServer) -> None:
    async with MemoryClient(f"127.0.0.1:{server.port}", api_key=caller.key) as client:
        reply = await client.remember_batch(
            pb.RememberBatchRequest(scope=ALICE, items=[item("Alice likes kites")], atomic=True)
        )
    assert reply.succeeded == 1 and reply.results[0].ok
    assert await contents(caller) == ["Alice likes kites"]
