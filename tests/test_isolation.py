"""Scope isolation: tenant, user, persona and agent are matched exactly on every read and write."""

from __future__ import annotations

import grpc
import pytest

from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.test_explicit_memory import list_all, remember, scope

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
