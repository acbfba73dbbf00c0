"""Slowing a read stage from the outside: its statements wait in a real server-side pg_sleep.

A started server's read services are handed a pool whose connections run a marked
``pg_sleep`` before the first statement of a slowed stage (recognised by the tag every read
statement carries, e.g. ``/* memsvc:recall:dense */``). The sleep is a query like any other:
a cancelled leg must stop it on the server, which the deadline tests look for in
pg_stat_activity by MARKER and stage. Production code carries no test parameter for this.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

import asyncpg

from memsvc.server.app import MemsvcServer

MARKER = "memsvc:test-delay"
# Stage -> the statement tags that belong to it.
STAGE_TAGS = {
    "dense": ("memsvc:recall:dense",),
    "lexical": ("memsvc:recall:lexical",),
    "prefetch_core": ("memsvc:prefetch:core", "memsvc:prefetch:persona"),
    "prefetch_relevant": (
        "memsvc:prefetch:topics",
        "memsvc:prefetch:episodes",
        "memsvc:prefetch:facts",
    ),
}


class _SlowedConnection:
    """A pooled connection whose slowed stages sleep once before their first statement."""

    def __init__(self, conn: asyncpg.Connection, delays_s: Mapping[str, float]) -> None:
        self._conn = conn
        self._delays_s = delays_s
        self._slept: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def _wait(self, sql: str) -> None:
        for stage, seconds in self._delays_s.items():
            if stage in self._slept or not any(tag in sql for tag in STAGE_TAGS[stage]):
                continue
            self._slept.add(stage)
            await self._conn.execute(f"SELECT pg_sleep($1) /* {MARKER}:{stage} */", seconds)

    async def fetch(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        await self._wait(sql)
        return await self._conn.fetch(sql, *args, **kwargs)

    async def fetchrow(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        await self._wait(sql)
        return await self._conn.fetchrow(sql, *args, **kwargs)

    async def fetchval(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        await self._wait(sql)
        return await self._conn.fetchval(sql, *args, **kwargs)

    async def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        await self._wait(sql)
        return await self._conn.execute(sql, *args, **kwargs)


class SlowedPool:
    """The server's own pool, lending connections that slow the given stages."""

    def __init__(self, pool: asyncpg.Pool, delays_s: Mapping[str, float]) -> None:
        unknown = set(delays_s) - set(STAGE_TAGS)
        assert not unknown, f"unknown stages {unknown}; known: {sorted(STAGE_TAGS)}"
        self._pool = pool
        self._delays_s = dict(delays_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def acquire(self, *, timeout: float | None = None) -> _Acquire:
        return _Acquire(self._pool, timeout, self._delays_s)

    async def release(self, conn: Any, **kwargs: Any) -> None:
        raw = conn._conn if isinstance(conn, _SlowedConnection) else conn
        await self._pool.release(raw, **kwargs)


class _Acquire:
    """Like asyncpg's PoolAcquireContext: awaited for a connection, or used with `async with`."""

    def __init__(
        self, pool: asyncpg.Pool, timeout: float | None, delays_s: Mapping[str, float]
    ) -> None:
        self._pool = pool
        self._timeout = timeout
        self._delays_s = delays_s
        self._lent: _SlowedConnection | None = None

    async def _get(self) -> _SlowedConnection:
        conn = await self._pool.acquire(timeout=self._timeout)
        return _SlowedConnection(conn, self._delays_s)

    def __await__(self) -> Generator[Any, None, _SlowedConnection]:
        return self._get().__await__()

    async def __aenter__(self) -> _SlowedConnection:
        self._lent = await self._get()
        return self._lent

    async def __aexit__(self, *exc: object) -> None:
        lent, self._lent = self._lent, None
        if lent is not None:
            await self._pool.release(lent._conn)


# Which service each stage belongs to: Prefetch also runs the dense and lexical statements
# (for its hint), and those stay fast there, as slowing "dense" means slowing Recall's leg.
RECALL_STAGES = frozenset({"dense", "lexical"})


def slow_stages(server: MemsvcServer, delays_ms: Mapping[str, float]) -> None:
    """From now on, the server's Recall and Prefetch sleep in PostgreSQL at the given stages."""
    delays_s = {stage: ms / 1000 for stage, ms in delays_ms.items()}
    recall = {k: v for k, v in delays_s.items() if k in RECALL_STAGES}
    prefetch = {k: v for k, v in delays_s.items() if k not in RECALL_STAGES}
    runtime = server.runtime
    # The services keep the pool they were built with; the test swaps in a slowed one.
    if recall:
        runtime.recall._pool = SlowedPool(runtime.pool, recall)  # type: ignore[assignment]
    if prefetch:
        runtime.prefetch._pool = SlowedPool(runtime.pool, prefetch)  # type: ignore[assignment]
