"""last_referenced_at, off the hot path: reads record ids in memory, a task flushes them.

``record`` is synchronous and O(ids) on the request's path: a dict assignment per memory, no
I/O, never raises. When the buffer holds ``max_pending`` ids, new ones are dropped and
counted (memsvc_references_dropped_total{reason="full"}). Every ``interval_s`` the buffer is
swapped out and written in upserts of FLUSH_CHUNK ids (storage.references); a failed flush is
logged and counted (reason="flush_failed") and its ids are dropped: the field is a hint, and a read
never waits for or fails because of it. ``stop`` flushes what is left.

An id queued in the last ``min_interval_s`` (60 s by default) is not queued again: a voice
agent's turns return the same facts over and over, and rewriting their rows every second cost
PostgreSQL CPU that the reads beside the flush paid for (every second, the slowest cached
Prefetch answers of bench/recall.py were the ones next to a flush). The value is then at most
that much behind the latest read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import UTC, datetime

import asyncpg

from memsvc.observability import metrics
from memsvc.storage.citus import has_citus
from memsvc.storage.errors import DATABASE_DOWN
from memsvc.storage.references import mark_referenced, mark_referenced_by_user

log = logging.getLogger(__name__)

_Key = tuple[str, str, uuid.UUID]
# Ids written per statement (each in its own short transaction). Small enough that encoding
# one chunk (on the event loop that also answers reads) is a fraction of a millisecond: the
# loop is free again while PostgreSQL works on it.
FLUSH_CHUNK = 250


class ReferenceRecorder:
    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        interval_s: float,
        max_pending: int,
        statement_timeout_s: float = 5.0,
        min_interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool = pool
        # One statement per user on Citus (found out at the first flush): the one-statement
        # upsert joins many users' memories, which Citus cannot push down.
        self._by_user: bool | None = None
        self._min_interval_s = min_interval_s
        self._clock = clock
        # When each id was last queued (clock time); cleared when it outgrows the buffer
        # (an id is then simply written again). Keyed by the id's integer (ids are unique
        # across tenants): a dict of ints and floats holds no object the garbage collector
        # tracks, so tens of thousands of entries add nothing to a full collection, where
        # (tenant, user, UUID) keys would add two tracked objects each.
        self._queued_at: dict[int, float] = {}
        self._interval_s = interval_s
        self._max_pending = max_pending
        self._timeout_s = statement_timeout_s
        self._pending: dict[_Key, datetime] = {}
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def record(self, tenant_id: str, user_id: str, memory_ids: Iterable[uuid.UUID]) -> None:
        """Note that a read returned these memories of one user now (never raises)."""
        try:
            now = datetime.now(UTC)
            tick = self._clock()
            pending, queued_at = self._pending, self._queued_at
            if len(queued_at) > 2 * self._max_pending:
                queued_at.clear()
            dropped = 0
            for memory_id in memory_ids:
                last = queued_at.get(memory_id.int)
                if last is not None and tick - last < self._min_interval_s:
                    continue  # written (or about to be) a moment ago
                key = (tenant_id, user_id, memory_id)
                if key in pending or len(pending) < self._max_pending:
                    pending[key] = now
                    queued_at[memory_id.int] = tick
                else:
                    dropped += 1
            if dropped:
                metrics.REFERENCES_DROPPED.labels("full").inc(dropped)
        except Exception:  # a hint must never fail the read that gives it
            log.exception("recording referenced memories failed")

    async def flush(self) -> int:
        """Write everything recorded so far in one UPDATE; returns the rows updated (0 on a
        failure, which is logged and counted, never raised)."""
        async with self._lock:
            if not self._pending:
                return 0
            batch, self._pending = self._pending, {}
            # One order for every writer, so two processes flushing overlapping ids never
            # deadlock (sorted by the ids' integers: no UUID.__lt__ call per comparison).
            rows = sorted(
                ((t, u, m, at) for (t, u, m), at in batch.items()),
                key=lambda r: (r[0], r[1], r[2].int),
            )
            try:
                updated = 0
                async with self._pool.acquire(timeout=self._timeout_s) as conn:
                    if self._by_user is None:
                        self._by_user = await has_citus(conn)
                    mark = mark_referenced_by_user if self._by_user else mark_referenced
                    # Short statements: one flush never holds a backend for long.
                    for start in range(0, len(rows), FLUSH_CHUNK):
                        chunk = rows[start : start + FLUSH_CHUNK]
                        updated += await mark(conn, chunk, timeout_s=self._timeout_s)
            except Exception as exc:
                # Never raised (a flush runs beside reads and at stop), but a bug is logged
                # with its stack, not as a database hiccup.
                if isinstance(exc, DATABASE_DOWN):
                    log.warning(
                        "could not write last_referenced_at for %d memories: %s",
                        len(rows),
                        type(exc).__name__,
                    )
                else:
                    log.error("flushing last_referenced_at failed unexpectedly", exc_info=True)
                metrics.REFERENCES_DROPPED.labels("flush_failed").inc(len(rows))
                # Not written: the next read of these ids queues them again.
                for _tenant, _user, memory_id in batch:
                    self._queued_at.pop(memory_id.int, None)
                return 0
            metrics.REFERENCES_FLUSHED.inc(len(rows))
            return updated

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """No flush writes while inside (a consistent look at the rows, e.g. comparing them
        before and after a call); do not call ``flush`` in it."""
        async with self._lock:
            yield

    async def _run(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval_s)
            await self.flush()

    def start(self) -> None:
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self._run(), name="memsvc-references")

    async def stop(self) -> None:
        """Let the periodic task finish its flush, then flush what is left (call before the
        pool closes)."""
        task, self._task = self._task, None
        self._stopping.set()
        if task is not None:
            await task
        await self.flush()
