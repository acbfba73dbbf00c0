"""Authentication: the tenant comes from the API key in metadata, never from a request field."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import subprocess
import sys
import time
import uuid

import grpc
import pytest
from prometheus_client import REGISTRY

from memsvc.config import Settings
from memsvc.storage import api_keys
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import Caller, started_server

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


# -- keys you can manage (issue 31, item 6) ------------------------------------------------

WAIT_S = 10.0  # a hang guard only: revocation is promised within 1 s (the old cache: 30 s)


def _lookups() -> float:
    return REGISTRY.get_sample_value("memsvc_auth_lookups_total") or 0.0


def _bogus_key(i: int) -> str:
    """Shaped like a real key (so the shape check alone cannot refuse it), unknown."""
    return api_keys.KEY_PREFIX + f"{i:043d}"


async def _keys_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """`memsvc keys ...` as an operator runs it: its own process, against the database."""
    env = {**os.environ, "MEMSVC_PG_DSN": settings.pg_dsn or ""}
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "memsvc.cli", "keys", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


async def _refused(stub: memory_pb2_grpc.MemoryServiceStub, key: str) -> bool:
    try:
        await stub.ListMemories(REQUEST, metadata=(("x-api-key", key),), timeout=5)
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        return True
    return False


async def _until_refused(stub: memory_pb2_grpc.MemoryServiceStub, key: str) -> None:
    step_s = 0.02
    for _ in range(int(WAIT_S / step_s)):
        if await _refused(stub, key):
            return
        await asyncio.sleep(step_s)
    raise AssertionError("the revoked key is still accepted")


async def test_keys_list_shows_ids_labels_tenants_and_last_use_never_the_key(
    settings: Settings, embedder, pool
) -> None:  # type: ignore[no-untyped-def]
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    async with pool.acquire() as conn:
        used = await api_keys.create_key(conn, tenant, "gateway-1")
        idle = await api_keys.create_key(conn, tenant, "")
    # Last use is stamped in the background (about once a minute) and when a server stops.
    async with (
        started_server(settings, embedder) as srv,
        grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as ch,
    ):
        stub = memory_pb2_grpc.MemoryServiceStub(ch)
        await stub.ListMemories(REQUEST, metadata=(("x-api-key", used),), timeout=5)
    done = await _keys_cli(settings, "list", "--tenant", tenant)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["id", "label", "tenant", "created", "last", "used", "revoked"]
    rows = {line.split()[0]: line for line in lines[1:]}
    used_id = api_keys.key_id_of(api_keys.hash_key(used))
    idle_id = api_keys.key_id_of(api_keys.hash_key(idle))
    assert set(rows) == {used_id, idle_id}
    assert rows[used_id].split()[1:3] == ["gateway-1", tenant]
    # created (date, time), last used (date, time), revoked "-".
    assert len(rows[used_id].split()) == 8 and rows[used_id].split()[-1] == "-"
    assert rows[idle_id].split()[1:3] == ["-", tenant]
    assert rows[idle_id].split()[-2:] == ["-", "-"]  # never used, not revoked
    for secret in (used, idle, api_keys.hash_key(used).hex(), api_keys.hash_key(idle).hex()):
        assert secret not in done.stdout


async def test_revoke_by_id_and_by_label_reaches_every_process_at_once(
    settings: Settings, embedder, server, channel, pool
) -> None:  # type: ignore[no-untyped-def]
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    async with pool.acquire() as conn:
        by_id = await api_keys.create_key(conn, tenant, "old")
        rotated = [await api_keys.create_key(conn, tenant, "rotate-me") for _ in range(2)]
        kept = await api_keys.create_key(conn, tenant, "keep")
        other_tenant = await api_keys.create_key(conn, f"{tenant}-b", "rotate-me")
    keys = [by_id, *rotated, kept, other_tenant]
    # Two serving processes' worth of authenticators: the session's server and one more.
    async with (
        started_server(settings, embedder) as second,
        grpc.aio.insecure_channel(f"127.0.0.1:{second.port}") as ch2,
    ):
        stubs = [memory_pb2_grpc.MemoryServiceStub(c) for c in (channel, ch2)]
        for stub in stubs:
            for key in keys:
                assert not await _refused(stub, key)  # known (and cached) everywhere

        done = await _keys_cli(
            settings, "revoke", "--id", api_keys.key_id_of(api_keys.hash_key(by_id))
        )
        assert done.returncode == 0, done.stderr
        done = await _keys_cli(settings, "revoke", "--label", "rotate-me", "--tenant", tenant)
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.split()[1::2]) == sorted(
            api_keys.key_id_of(api_keys.hash_key(k)) for k in rotated
        )
        for stub in stubs:
            for key in (by_id, *rotated):
                await _until_refused(stub, key)
            assert not await _refused(stub, kept)
            assert not await _refused(stub, other_tenant)  # same label, other tenant

    again = await _keys_cli(settings, "revoke", "--label", "rotate-me", "--tenant", tenant)
    assert again.returncode == 2 and "no active key matches" in again.stderr
    listed = await _keys_cli(settings, "list", "--tenant", tenant, "--all")
    revoked = [line for line in listed.stdout.splitlines()[1:] if line.split()[-1] != "-"]
    assert len(revoked) == 3


async def test_a_new_key_works_at_once(channel, pool) -> None:  # type: ignore[no-untyped-def]
    stub = memory_pb2_grpc.MemoryServiceStub(channel)
    for _ in range(5):
        async with pool.acquire() as conn:
            key = await api_keys.create_key(conn, f"t-{uuid.uuid4().hex[:12]}", "fresh")
        assert not await _refused(stub, key)


async def test_made_up_keys_cost_bounded_lookups_and_never_evict_good_keys(
    settings: Settings, embedder, pool
) -> None:  # type: ignore[no-untyped-def]
    async with pool.acquire() as conn:
        good = await api_keys.create_key(conn, f"t-{uuid.uuid4().hex[:12]}", "good")
    rate = 2.0
    async with (
        started_server(
            settings, embedder, auth_unknown_lookups_per_s=rate, auth_unknown_cache_size=50
        ) as srv,
        grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as ch,
    ):
        stub = memory_pb2_grpc.MemoryServiceStub(ch)
        assert not await _refused(stub, good)
        before = _lookups()
        started = time.monotonic()
        for i in range(400):
            assert await _refused(stub, _bogus_key(i))
        elapsed_s = time.monotonic() - started
        # At most the bucket's burst and what it refilled meanwhile: not one per key.
        assert _lookups() - before <= 1 + math.ceil(elapsed_s * rate)
        # 400 unknown keys through a 50-entry cache of unknown keys: the good key was
        # never in it, and is answered without a lookup.
        before = _lookups()
        assert not await _refused(stub, good)
        assert _lookups() == before
        # One wrong key repeated costs one lookup at most.
        for _ in range(50):
            assert await _refused(stub, _bogus_key(10_000))
        assert _lookups() - before <= 1


async def test_failed_authentication_is_logged_once_per_interval(
    channel, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO)
    stub = memory_pb2_grpc.MemoryServiceStub(channel)
    for i in range(40):
        assert await _refused(stub, _bogus_key(20_000 + i))
        assert await _refused(stub, "not-a-key")
    lines = [r for r in caplog.records if "UNAUTHENTICATED" in r.getMessage()]
    assert len(lines) <= 2, [r.getMessage() for r in lines]
    assert REGISTRY.get_sample_value("memsvc_auth_failures_total", {"reason": "malformed"})
