"""Bad Recall and Prefetch requests are INVALID_ARGUMENT naming the field and write nothing;
the on_read hook fires on good reads only and never delays them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from memsvc.config import Settings
from memsvc.server.app import MemsvcServer
from memsvc.server.auth import Authenticator
from memsvc.server.servicer import MemoryServicer
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import Caller, _KeyedStub
from tests.read_helpers import pscope
from tests.test_explicit_memory import list_all

VECTOR = [0.1] * 384

BAD_RECALL = [
    ({"query": "no scope"}, "scope"),
    ({"scope": pscope()}, "query"),
    ({"scope": pscope(), "query": "   "}, "query"),
    ({"scope": pscope(), "query": "x" * 2001}, "query"),
    ({"scope": pscope(), "query": "bell \x07 inside"}, "query"),
    ({"scope": pscope(user=""), "query": "q"}, "scope.user_id"),
    ({"scope": pscope(), "query_vector": [0.1] * 10}, "query_vector"),
    ({"scope": pscope(), "query_vector": [float("nan")] * 384}, "query_vector"),
    ({"scope": pscope(), "query_vector": [0.0] * 384}, "query_vector"),
    ({"scope": pscope(), "query": "q", "top_k": -1}, "top_k"),
    ({"scope": pscope(), "query": "q", "top_k": 101}, "top_k"),
    ({"scope": pscope(), "query": "q", "types": [pb.ITEM_TYPE_UNSPECIFIED]}, "types[0]"),
    ({"scope": pscope(), "query": "q", "types": [pb.ITEM_TYPE_FACT, 42]}, "types[1]"),
    ({"scope": pscope(), "query": "q", "mode": 9}, "mode"),
    ({"scope": pscope(), "query_vector": VECTOR, "mode": pb.RECALL_MODE_LEXICAL}, "query"),
    ({"scope": pscope(), "query": "q", "as_of": Timestamp(seconds=-(10**11))}, "as_of"),
]

BAD_PREFETCH = [
    ({}, "scope"),
    ({"scope": pscope(user=" alice")}, "scope.user_id"),
    ({"scope": pscope(), "budget": pb.PacketBudget(chars=10)}, "budget.chars"),
    ({"scope": pscope(), "budget": pb.PacketBudget(chars=40_000)}, "budget.chars"),
    ({"scope": pscope(), "budget": pb.PacketBudget(chars=-5)}, "budget.chars"),
    ({"scope": pscope(), "budget": pb.PacketBudget(tokens=5)}, "budget.tokens"),
    ({"scope": pscope(), "hint": "h" * 2001}, "hint"),
    ({"scope": pscope(), "session_id": "s" * 129}, "session_id"),
    ({"scope": pscope(), "session_id": "tab\there"}, "session_id"),
]


async def _nothing_written(pool: asyncpg.Pool, caller: Caller) -> None:
    assert await list_all(caller) == []
    async with pool.acquire() as conn:
        versions = await conn.fetchval(
            "SELECT count(*) FROM scope_versions WHERE tenant_id = $1", caller.tenant_id
        )
    assert versions == 0


@pytest.mark.parametrize(("fields", "field_name"), BAD_RECALL)
async def test_bad_recall(
    caller: Caller, pool: asyncpg.Pool, fields: dict[str, object], field_name: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Recall(pb.RecallRequest(**fields))  # type: ignore[arg-type]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(field_name + ":")
    await _nothing_written(pool, caller)


@pytest.mark.parametrize(("fields", "field_name"), BAD_PREFETCH)
async def test_bad_prefetch(
    caller: Caller, pool: asyncpg.Pool, fields: dict[str, object], field_name: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Prefetch(pb.PrefetchRequest(**fields))  # type: ignore[arg-type]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(field_name + ":")
    await _nothing_written(pool, caller)


# -- the on_read hook -----------------------------------------------------------------------


class Hook:
    """Records scopes; an async call blocks until released (a slow drain)."""

    def __init__(self) -> None:
        self.scopes: list[Scope] = []
        self.release = asyncio.Event()
        self.finished = 0

    async def __call__(self, scope: Scope) -> None:
        self.scopes.append(scope)
        await self.release.wait()
        self.finished += 1


@pytest.fixture
async def hooked(
    server: MemsvcServer, settings: Settings
) -> AsyncIterator[tuple[grpc.aio.Channel, list[object]]]:
    """A gRPC server over the shared runtime whose servicer calls the given hooks in turn."""
    hooks: list[object] = []

    def on_read(scope: Scope) -> object:
        hook = hooks[0]
        return hook(scope)  # type: ignore[operator]

    runtime = server.runtime
    servicer = MemoryServicer(
        settings,
        Authenticator(runtime.pool, enabled=True, default_tenant="dev"),
        runtime.services,
        on_read=on_read,
    )
    grpc_server = grpc.aio.server()
    memory_pb2_grpc.add_MemoryServiceServicer_to_server(servicer, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    await grpc_server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel, hooks
    finally:
        await channel.close()
        await grpc_server.stop(1)


async def test_on_read_fires_without_delaying_the_read(
    caller: Caller, hooked: tuple[grpc.aio.Channel, list[object]]
) -> None:
    channel, hooks = hooked
    hook = Hook()
    hooks.append(hook)
    stub = _KeyedStub(memory_pb2_grpc.MemoryServiceStub(channel), caller.key)
    # The hook is still blocked when both reads have answered.
    await stub.Recall(pb.RecallRequest(scope=pscope(agent="bot"), query="q"), timeout=5)
    await stub.Prefetch(pb.PrefetchRequest(scope=pscope()), timeout=5)
    assert hook.scopes == [
        Scope(caller.tenant_id, "alice", "", "bot"),
        Scope(caller.tenant_id, "alice"),
    ]
    assert hook.finished == 0
    # Bad input reads nothing and kicks nothing.
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.Recall(pb.RecallRequest(scope=pscope()), timeout=5)
    assert len(hook.scopes) == 2
    hook.release.set()
    for _ in range(100):
        if hook.finished == 2:
            break
        await asyncio.sleep(0.01)
    assert hook.finished == 2


async def test_a_failing_on_read_never_fails_the_read(
    caller: Caller, hooked: tuple[grpc.aio.Channel, list[object]]
) -> None:
    channel, hooks = hooked

    def broken(scope: Scope) -> None:
        raise RuntimeError("the drain is down")

    hooks.append(broken)
    stub = _KeyedStub(memory_pb2_grpc.MemoryServiceStub(channel), caller.key)
    reply = await stub.Recall(pb.RecallRequest(scope=pscope(), query="q"), timeout=5)
    assert not reply.degraded
