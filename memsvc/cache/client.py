"""The cache's Redis client, from ``MEMSVC_REDIS_URL``: one server or a Redis/Valkey Cluster.

How the URL says "cluster": by default it does not have to. A user pastes the URL their
provider gives (a managed cluster's configuration endpoint looks exactly like a single
server's, ``redis://host:6379``), and expects it to work whichever it is; so the first use
asks the server (``INFO cluster``, one round trip) and builds a cluster client when it says
``cluster_enabled:1``. The question is asked lazily, not at start: memsvc starts and serves
with the cache down (every Prefetch says BYPASSED), and must not guess the mode for good just
because the server was unreachable then. ``?cluster=yes`` or ``?cluster=no`` in the URL skips
the question (a server that refuses INFO to this user, or a test that wants one mode); any
other value is a configuration error. With a cluster, the URL names one seed node: the
client reads the others from it, and after its first read every known node is a seed (so
only a seed down when memsvc first asks keeps the cache bypassed, until it answers; a managed
service's configuration endpoint, a DNS name over all nodes, avoids even that).

Every operation runs through ``run``, bounded by the caller's timeout and abandoned (cancelled
in the background, its outcome observed) when that runs out, rather than awaited. Bounding by
cancellation alone is not enough on Python 3.11: redis-py writes with ``asyncio.wait_for``,
which swallows a cancellation that arrives as the write completes, and the cluster client
then went on retrying for 0.3 to 3 s past a 50 ms bound (measured against a cluster with a
killed master).

Commands that must apply together are one Lua script (EVAL; their keys share the user's hash
tag, so one slot), never a MULTI pipeline: redis-py's asyncio cluster client queues each
command of a transactional pipeline by running it in a new thread with its own event loop
(``asyncio.run``) and joining that thread while the serving loop waits. Each stored packet (3
commands) then stalled the whole process, about 1 ms per command and past 10 ms when the
machine is busy (the thread waits to be scheduled): built Prefetch through a 3-master cluster
at 50 calls/s went to 0.3 to 0.5 s at p50 on a shared machine, and the stalls ran other calls'
cache operations past their bound (BYPASSED).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, ResponseError

from memsvc.cache.cluster import TOPOLOGY_TIMEOUT_S, RefreshingCluster, observe

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_CONNECTIONS_PER_NODE = 10_000

#: How late the event loop may keep an operation before a timeout is the loop's, not Redis's.
LOOP_SLACK_S = 0.01


class LoopStalled(TimeoutError):
    """The operation ran out of time because this process's event loop was busy elsewhere: it
    kept the operation waiting more than LOOP_SLACK_S in all, before its first step and past
    its bound. A saturated or blocked loop says nothing about Redis. Under load a burst of
    packet builds kept cache operations from even being sent for 50 ms, and each such timeout
    paused the cache for every call (BYPASSED for a second)."""


#: What cache operations receive: either client has every command the cache uses.
Redis = aioredis.Redis | RedisCluster


class Mode(enum.StrEnum):
    AUTO = "auto"
    SINGLE = "single"
    CLUSTER = "cluster"


_MODES = {
    "auto": Mode.AUTO,
    "yes": Mode.CLUSTER,
    "true": Mode.CLUSTER,
    "1": Mode.CLUSTER,
    "no": Mode.SINGLE,
    "false": Mode.SINGLE,
    "0": Mode.SINGLE,
}


class CacheURLError(ValueError):
    """The URL cannot configure the cache (the message never repeats it: it may hold a
    password)."""


def parse_url(url: str) -> tuple[str, Mode]:
    """The URL without our ``cluster`` parameter (redis-py refuses unknown ones), and the mode."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = [value for name, value in query if name == "cluster"]
    if len(given) > 1:
        raise CacheURLError("the cluster parameter is given more than once")
    mode = Mode.AUTO
    if given:
        try:
            mode = _MODES[given[0].strip().lower()]
        except KeyError:
            raise CacheURLError(
                f"cluster={given[0]!r}: expected yes, no or auto (the default)"
            ) from None
    rest = urlencode([(name, value) for name, value in query if name != "cluster"])
    return urlunsplit(parts._replace(query=rest)), mode


class CacheClient:
    """The one Redis client of a process, single server or cluster, decided as the module
    docstring says. ``timeout_s`` bounds each socket operation inside a command."""

    def __init__(self, url: str, *, timeout_s: float) -> None:
        self._url, self._mode = parse_url(url)
        self._options: dict[str, object] = {
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
        }
        self._client: Redis | None = None
        self._single: aioredis.Redis | None = None
        self._resolving: asyncio.Task[Redis] | None = None
        # Operations given up on but not finished yet (cancelled; awaited by aclose).
        self._abandoned: set[asyncio.Task[Any]] = set()
        if self._mode is Mode.CLUSTER:
            self._client = self._cluster()
        else:
            try:
                # redis-py 8's pool stops at 100 connections and then raises (a cache
                # failure: BYPASSED) instead of waiting: bounded like the cluster's nodes.
                options = {"max_connections": MAX_CONNECTIONS_PER_NODE, **self._options}
                self._single = aioredis.Redis.from_url(self._url, **options)  # type: ignore[arg-type]
            except ValueError as exc:  # a scheme or a parameter redis-py does not know
                raise CacheURLError(str(exc)) from None
            if self._mode is Mode.SINGLE:
                self._client = self._single

    @property
    def mode(self) -> Mode:
        """SINGLE or CLUSTER once known; AUTO until the server has been asked."""
        if isinstance(self._client, RedisCluster):
            return Mode.CLUSTER
        return Mode.SINGLE if self._client is not None else Mode.AUTO

    async def run(self, op: Callable[[Redis], Awaitable[T]], *, timeout_s: float) -> T:
        """``op`` on the client, within ``timeout_s``: TimeoutError when it does not answer in
        time (the operation is then abandoned, not awaited), LoopStalled when this process's
        event loop, not Redis, used up the time; its own errors otherwise."""
        loop = asyncio.get_running_loop()
        asked = loop.time()
        started: list[float] = []
        task = asyncio.ensure_future(self._call(op, started))
        try:
            done, _ = await asyncio.wait({task}, timeout=max(timeout_s, 0.0))
        except asyncio.CancelledError:
            self._abandon(task)
            raise
        if not done:
            self._abandon(task)
            now = loop.time()
            # Time the loop kept the operation waiting: before its first step (the command
            # not even sent), and past the bound (a reply may sit unread in the socket).
            late = (started[0] if started else now) - asked + max(0.0, now - asked - timeout_s)
            if late > LOOP_SLACK_S:
                raise LoopStalled(f"the event loop was {late * 1000:.0f} ms late")
            raise TimeoutError
        return task.result()

    def _abandon(self, task: asyncio.Task[T]) -> None:
        task.cancel()
        task.add_done_callback(observe)
        self._abandoned.add(task)
        task.add_done_callback(self._abandoned.discard)

    def shard_of(self, key: str) -> str:
        """Which server holds ``key`` as far as the client knows: the cluster node owning its
        slot, or "" (one server, or a cluster whose map is not read yet). Failures are
        counted per shard, so one master down does not bypass the cache for the others."""
        client = self._client
        if isinstance(client, RedisCluster):
            try:
                node = client.get_node_from_key(key)
            except RedisClusterException:  # the slot map is not read yet
                return ""
            return node.name if node is not None else ""
        return ""

    async def _call(self, op: Callable[[Redis], Awaitable[T]], started: list[float]) -> T:
        started.append(asyncio.get_running_loop().time())
        return await op(await self.client())

    async def client(self) -> Redis:
        """The client, asking the server which one it needs the first time (shared, bounded
        by TOPOLOGY_TIMEOUT_S, and not cancelled by a caller that stops waiting)."""
        if self._client is not None:
            return self._client
        resolving = self._resolving
        if resolving is None or resolving.done():
            resolving = self._resolving = asyncio.ensure_future(self._resolve())
            resolving.add_done_callback(observe)
        return await asyncio.shield(resolving)

    async def _resolve(self) -> Redis:
        single = self._single
        assert single is not None
        async with asyncio.timeout(TOPOLOGY_TIMEOUT_S):
            try:
                info = await single.info("cluster")
            except ResponseError as exc:
                # An ACL that refuses INFO: a cluster would answer MOVED, which the log shows.
                log.warning(
                    "the cache server refused INFO (%s); using it as a single server "
                    "(add cluster=yes to MEMSVC_REDIS_URL if it is a cluster)",
                    exc,
                )
                info = {}
            if str(info.get("cluster_enabled", "0")) != "1":
                self._client = single
                return single
            cluster = self._cluster()
            try:
                await cluster.initialize()
            except BaseException:
                await cluster.close_for_good()
                raise
        log.info("the cache server is a cluster node: using a cluster client")
        self._client, self._single = cluster, None
        await single.aclose()
        return cluster

    def _cluster(self) -> RefreshingCluster:
        try:
            # from_url builds ``cls``, typed as the base class.
            client = RefreshingCluster.from_url(
                self._url,
                # One retry, after a topology refresh: enough to follow a failover; a master
                # that is down fails the call (the cache then bypasses itself) at once.
                retry=Retry(NoBackoff(), 1),
                # Per node; past it redis-py raises instead of waiting, which would count as
                # a cache failure. A single-server client's pool has the same bound.
                max_connections=MAX_CONNECTIONS_PER_NODE,
                **self._options,
            )
        # TypeError: a URL parameter neither redis-py nor we know.
        except (RedisClusterException, ValueError, TypeError) as exc:
            raise CacheURLError(f"not usable for a cluster: {exc}") from None
        return cast(RefreshingCluster, client)

    async def aclose(self) -> None:
        """Close whichever clients exist; a detection still running is cancelled, abandoned
        operations get a moment to end (they were cancelled already)."""
        if self._abandoned:
            await asyncio.wait(self._abandoned, timeout=TOPOLOGY_TIMEOUT_S)
        if self._resolving is not None and not self._resolving.done():
            self._resolving.cancel()
            await asyncio.gather(self._resolving, return_exceptions=True)
        client, self._client = self._client, None
        if isinstance(client, RefreshingCluster):
            await client.close_for_good()
        if self._single is not None:
            await self._single.aclose()
            self._single = None
