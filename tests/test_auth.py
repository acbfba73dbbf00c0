"""Authentication: the tenant comes from the API key in metadata, never from a request field."""

from __future__ import annotations

import grpc
import pytest

from memsvc.storage import api_keys
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import Caller

REQUEST = pb.ListMemoriesRequest(scope=pb.Scope(user_id="alice"))


@pytest.mark.parametrize(
    "metadata",
    [
        (),
        (("x-api-key", "msk_not-a-real-key"),),
        (("authorization", "Bearer msk_wrong"),),
        (("authorization", "Basic abc"),),
        (("x-api-key", ""),),
    ],
)
async def test_missing_or_wrong_key_is_unauthenticated(channel, metadata) -> None:  # type: ignore[no-untyped-def]
    stub = memory_pb2_grpc.MemoryServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListMemories(REQUEST, metadata=metadata, timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Remember(
            pb.RememberRequest(scope=pb.Scope(user_id="alice"), content="x"),
            metadata=metadata,
            timeout=5,
        )
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_bearer_header_works(channel, caller: Caller) -> None:  # type: ignore[no-untyped-def]
    stub = memory_pb2_grpc.MemoryServiceStub(channel)
    reply = await stub.ListMemories(
        REQUEST, metadata=(("authorization", f"Bearer {caller.key}"),), timeout=5
    )
    assert list(reply.memories) == []


async def test_keys_are_stored_hashed(pool, caller: Caller) -> None:  # type: ignore[no-untyped-def]
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT key_hash FROM api_keys WHERE tenant_id = $1", caller.tenant_id
        )
    assert [bytes(r["key_hash"]) for r in rows] == [api_keys.hash_key(caller.key)]
    assert caller.key.encode() not in bytes(rows[0]["key_hash"])


async def test_revoked_key_is_refused_once_the_cache_expires(
    pool, channel, new_caller, server
) -> None:  # type: ignore[no-untyped-def]
    c: Caller = await new_caller()
    async with pool.acquire() as conn:
        assert await api_keys.revoke_key(conn, c.key)
    # A fresh authenticator (as after the short auth cache expires) refuses it.
    from memsvc.errors import Unauthenticated
    from memsvc.server.auth import Authenticator

    auth = Authenticator(pool, enabled=True, default_tenant="dev")
    with pytest.raises(Unauthenticated):
        await auth.tenant((("x-api-key", c.key),))
