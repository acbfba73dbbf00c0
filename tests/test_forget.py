"""Forget: hard deletion of memories, their whole chain, a scope, or everything about a user."""

from __future__ import annotations

import uuid

import grpc
import pytest

from memsvc.cache.keys import packet_key, user_index_key
from memsvc.storage.erasure import USER_TABLES
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.test_explicit_memory import list_all, remember, scope


async def count_rows(pool, tenant: str, user: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    async with pool.acquire() as conn:
        return {
            t: await conn.fetchval(
                f"SELECT count(*) FROM {t} WHERE tenant_id = $1 AND user_id = $2", tenant, user
            )
            for t in USER_TABLES
        }


async def test_forget_one_memory_removes_its_whole_chain(caller: Caller, pool) -> None:  # type: ignore[no-untyped-def]
    keep = (await remember(caller, "Keeps bees")).memory
    old = (await remember(caller, "Drives a red car")).memory
    new = await caller.stub.Correct(
        pb.CorrectRequest(scope=scope(), memory_id=old.memory_id, new_content="Drives a blue car")
    )
    reply = await caller.stub.Forget(pb.ForgetRequest(scope=scope(), memory_ids=[new.memory_id]))
    assert reply.deleted == 2
    remaining = await list_all(caller, include_superseded=True)
    assert [m.memory_id for m in remaining] == [keep.memory_id]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.GetMemoryHistory(
            pb.GetMemoryHistoryRequest(scope=scope(), memory_id=old.memory_id)
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    # Nothing blocks storing the same content again.
    again = await remember(caller, "Drives a blue car")
    assert not again.reinforced


async def test_forget_with_an_unknown_id_deletes_nothing(caller: Caller) -> None:
    m = (await remember(caller, "Plays chess")).memory
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Forget(
            pb.ForgetRequest(scope=scope(), memory_ids=[m.memory_id, str(uuid.uuid4())])
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "nothing was deleted" in (err.value.details() or "")
    assert len(await list_all(caller)) == 1


async def test_forget_all_in_scope_leaves_other_scopes(caller: Caller) -> None:
    await remember(caller, "human fact 1")
    await remember(caller, "human fact 2")
    other = (await remember(caller, "persona fact", scope=scope(persona="nova"))).memory
    reply = await caller.stub.Forget(pb.ForgetRequest(scope=scope(), all_in_scope=True))
    assert reply.deleted == 2
    assert await list_all(caller) == []
    assert [m.memory_id for m in await list_all(caller, scope(persona="nova"))] == [other.memory_id]


async def test_erase_user_leaves_no_trace_in_any_table_or_cache(  # type: ignore[no-untyped-def]
    caller: Caller, pool, redis_client
) -> None:
    await remember(caller, "I am a vegetarian", pinned=True)
    await remember(caller, "persona fact", scope=scope(persona="nova"))
    await remember(caller, "agent fact", scope=scope(agent="bot-1"))
    await remember(caller, "bob's fact", scope=scope(user="bob"))
    # A cached packet of alice's, registered the way the packet cache does it.
    cached = packet_key(caller.tenant_id, "alice", "shape")
    index = user_index_key(caller.tenant_id, "alice")
    await redis_client.set(cached, b"packet")
    await redis_client.sadd(index, cached)
    before = await count_rows(pool, caller.tenant_id, "alice")
    assert before["memories"] == 3 and before["scope_versions"] == 1

    reply = await caller.stub.Forget(pb.ForgetRequest(scope=scope(), erase_user=True))
    assert reply.deleted == 3
    after = await count_rows(pool, caller.tenant_id, "alice")
    assert after == {t: 0 for t in USER_TABLES}
    assert await redis_client.exists(cached, index) == 0
    assert (await count_rows(pool, caller.tenant_id, "bob"))["memories"] == 1


async def test_every_write_drops_cached_packets(caller: Caller, redis_client) -> None:  # type: ignore[no-untyped-def]
    cached = packet_key(caller.tenant_id, "alice", "shape")
    await redis_client.set(cached, b"stale packet")
    await redis_client.sadd(user_index_key(caller.tenant_id, "alice"), cached)
    await remember(caller, "New fact that makes the packet stale")
    assert await redis_client.exists(cached) == 0


async def test_writes_bump_the_user_version(caller: Caller, pool) -> None:  # type: ignore[no-untyped-def]
    async def version() -> int:
        async with pool.acquire() as conn:
            return await conn.fetchval(  # type: ignore[no-any-return]
                "SELECT version FROM scope_versions WHERE tenant_id = $1 AND user_id = 'alice'",
                caller.tenant_id,
            )

    m = (await remember(caller, "v1")).memory
    v1 = await version()
    await caller.stub.Correct(
        pb.CorrectRequest(scope=scope(), memory_id=m.memory_id, new_content="v2")
    )
    v2 = await version()
    await caller.stub.Forget(pb.ForgetRequest(scope=scope(), all_in_scope=True))
    v3 = await version()
    assert v1 < v2 < v3


@pytest.mark.parametrize(
    "request_fields",
    [
        {},
        {"memory_ids": ["x"], "all_in_scope": True},
        {"all_in_scope": True, "erase_user": True},
    ],
)
async def test_forget_needs_exactly_one_target(
    caller: Caller, request_fields: dict[str, object]
) -> None:
    await remember(caller, "still here")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Forget(pb.ForgetRequest(scope=scope(), **request_fields))  # type: ignore[arg-type]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(await list_all(caller)) == 1


async def test_erase_user_refuses_a_narrowed_scope(caller: Caller) -> None:
    await remember(caller, "still here")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Forget(pb.ForgetRequest(scope=scope(agent="a"), erase_user=True))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(await list_all(caller)) == 1
