"""ChangeStream: WatchMemories' subscribers, woken by one LISTEN connection per process.

The changes themselves are rows of memory_changes, written by triggers in the writing
transaction and numbered at commit in commit order per user (migration 0011). A subscriber
only ever reads ``position > last ORDER BY position``: a notification (channel
``memsvc_changes``, payload tenant + "\\x1f" + user) just says when to read. The process's
one LISTEN connection (storage/notifications.py) wakes the subscribers of the user named; it
reconnects with backoff when it drops, waking every subscriber once it is back (changes may
have committed meanwhile), and each subscriber also reads every ``poll_s`` whatever happens,
so a lost notification only delays a change, never loses it. A stream opens with a
heartbeat carrying its start position, and an idle one sends another every ``heartbeat_s``.

A stream holds no connection while it waits (each read borrows one from the pool for one
short statement), so open streams are bounded by ``max_streams`` per process and
``max_streams_per_tenant``, not by the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import asyncpg

from memsvc.concurrency.deadline import Budget
from memsvc.config import from_setting
from memsvc.errors import OutOfRange, ResourceExhausted
from memsvc.observability import metrics
from memsvc.storage import changes
from memsvc.storage.changes import Change
from memsvc.storage.model import Scope
from memsvc.storage.notifications import ChangeListener
from memsvc.storage.pool import acquire

log = logging.getLogger(__name__)

# A stream full of refusals frees up as soon as one closes.
BUSY_RETRY_AFTER_S = 5.0
HEARTBEAT = "heartbeat"

UserKey = tuple[str, str]


@dataclass(frozen=True)
class WatchConfig:
    max_streams: int = field(metadata=from_setting("watch_max_streams"))
    max_streams_per_tenant: int = field(metadata=from_setting("watch_max_streams_per_tenant"))
    poll_s: float = field(metadata=from_setting("watch_poll_s"))
    heartbeat_s: float = field(metadata=from_setting("watch_heartbeat_s"))
    acquire_timeout_s: float = field(metadata=from_setting("pg_acquire_timeout_ms"))
    statement_timeout_s: float = field(metadata=from_setting("pg_command_timeout_ms"))
    # Changes read per statement (a subscriber far behind reads batch after batch).
    batch: int = 500


@dataclass(frozen=True)
class WatchSubject:
    """Whose changes: the exact scope, or every scope of scope.user_id (whole_user)."""

    scope: Scope
    whole_user: bool = False

    def sees(self, change: Change) -> bool:
        # Erasure is about the whole user: every scope's watcher hears of it.
        return self.whole_user or change.kind == "erased" or change.scope == self.scope


class ChangeStream:
    """``start``/``stop`` the listener; ``watch`` one subject from a position."""

    def __init__(self, pool: asyncpg.Pool, listener: ChangeListener, config: WatchConfig) -> None:
        self._pool = pool
        self._listener = listener
        self._config = config
        self._subscribers: dict[UserKey, set[asyncio.Event]] = defaultdict(set)
        self._per_tenant: dict[str, int] = {}
        self._open = 0
        listener.subscribe(self._wake, self._wake_all)

    @property
    def open_streams(self) -> int:
        return self._open

    @property
    def listening(self) -> asyncio.Event:
        """Set while the LISTEN connection is up."""
        return self._listener.listening

    @property
    def dropped(self) -> asyncio.Event:
        """Set from the LISTEN connection's loss to its reconnect."""
        return self._listener.dropped

    # -- the listener --------------------------------------------------------------------------

    def start(self) -> None:
        """Start listening (``open`` does so on first use: a process that never serves a
        stream never holds the connection, unless another subscriber started it)."""
        self._listener.start()

    async def stop(self) -> None:
        await self._listener.stop()

    def _wake(self, tenant: str, user: str) -> None:
        for event in self._subscribers.get((tenant, user), ()):
            event.set()

    def _wake_all(self) -> None:
        for events in self._subscribers.values():
            for event in events:
                event.set()

    # -- one subscriber ------------------------------------------------------------------------

    def _admit(self, tenant: str) -> None:
        config = self._config
        if self._open >= config.max_streams:
            raise ResourceExhausted(
                f"{config.max_streams} WatchMemories streams are already open on this server;"
                " retry shortly",
                retry_after_s=BUSY_RETRY_AFTER_S,
            )
        held = self._per_tenant.get(tenant, 0)
        if config.max_streams_per_tenant and held >= config.max_streams_per_tenant:
            raise ResourceExhausted(
                f"this tenant already holds {config.max_streams_per_tenant} WatchMemories"
                " streams on this server; close one or retry shortly",
                retry_after_s=BUSY_RETRY_AFTER_S,
            )
        self._open += 1
        self._per_tenant[tenant] = held + 1
        metrics.WATCH_STREAMS.inc()

    def _release(self, tenant: str) -> None:
        self._open -= 1
        left = self._per_tenant[tenant] - 1
        if left:
            self._per_tenant[tenant] = left
        else:
            del self._per_tenant[tenant]
        metrics.WATCH_STREAMS.dec()

    async def open(
        self, subject: WatchSubject, after_position: int | None, budget: Budget
    ) -> Subscription:
        """Reserve a stream and find where it starts: after ``after_position`` (0: the oldest
        retained change; None: from now). OutOfRange when changes after that position were
        pruned, or when no change of the user has that position yet (a stream resumed there
        would wait for positions it already claims to have); ResourceExhausted when too many
        streams are open."""
        scope = subject.scope
        self.start()
        self._admit(scope.tenant_id)
        try:
            async with acquire(
                self._pool, budget, timeout_s=self._config.acquire_timeout_s
            ) as conn:
                if after_position is None:
                    start = await changes.head(conn, scope.tenant_id, scope.user_id)
                else:
                    start = after_position
                    batch = await changes.after(conn, scope.tenant_id, scope.user_id, start, 1)
                    if 0 < start < batch.pruned_through:
                        raise OutOfRange(_pruned(batch.pruned_through))
                    if start > 0 and not batch.changes:
                        head = await changes.head(conn, scope.tenant_id, scope.user_id)
                        if start > head:
                            raise OutOfRange(_BEYOND)
        except BaseException:
            self._release(scope.tenant_id)
            raise
        return Subscription(self, subject, start)

    async def _read(self, subject: WatchSubject, position: int) -> changes.Batch:
        scope = subject.scope
        budget = Budget(self._config.statement_timeout_s)
        async with acquire(self._pool, budget, timeout_s=self._config.acquire_timeout_s) as conn:
            return await changes.after(
                conn, scope.tenant_id, scope.user_id, position, self._config.batch
            )

    async def _version(self, scope: Scope) -> int:
        budget = Budget(self._config.statement_timeout_s)
        async with acquire(self._pool, budget, timeout_s=self._config.acquire_timeout_s) as conn:
            return await changes.current_version(conn, scope.tenant_id, scope.user_id)


def _pruned(horizon: int) -> str:
    return (
        f"after_position: older than the retained changes (pruned through {horizon}); re-read"
        " with ListMemories and watch from now (leave after_position unset)"
    )


_BEYOND = (
    "after_position: beyond this user's current position (no change has it yet); resume"
    " from a position this stream sent, or leave after_position unset to watch from now"
)


class Subscription:
    """One open stream: iterate it for changes (and heartbeats); ``aclose`` frees its slot.
    Iterate it once only."""

    def __init__(self, stream: ChangeStream, subject: WatchSubject, start: int) -> None:
        self._stream = stream
        self._subject = subject
        self.position = start
        self._wake = asyncio.Event()
        self._closed = False
        key = (subject.scope.tenant_id, subject.scope.user_id)
        stream._subscribers[key].add(self._wake)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        scope = self._subject.scope
        key = (scope.tenant_id, scope.user_id)
        events = self._stream._subscribers.get(key)
        if events is not None:
            events.discard(self._wake)
            if not events:
                del self._stream._subscribers[key]
        self._stream._release(scope.tenant_id)

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncIterator[Change]:
        return self._changes()

    async def _heartbeat(self) -> Change:
        metrics.WATCH_CHANGES.labels(HEARTBEAT).inc()
        scope = self._subject.scope
        return Change(
            position=self.position,
            kind=HEARTBEAT,
            scope=scope,
            version=await self._stream._version(scope),
            changed_at=datetime.now(UTC),
        )

    async def _changes(self) -> AsyncIterator[Change]:
        config = self._stream._config
        subject = self._subject
        loop = asyncio.get_running_loop()
        # First a heartbeat with the start position: the caller knows the stream is open
        # and where to resume, even if it breaks before the first change.
        yield await self._heartbeat()
        heartbeat_at = loop.time() + config.heartbeat_s
        while True:
            self._wake.clear()
            batch = await self._stream._read(subject, self.position)
            if self.position > 0 and self.position < batch.pruned_through:
                # Retention pruned changes this stream had not read yet.
                raise OutOfRange(_pruned(batch.pruned_through))
            sent = False
            for change in batch.changes:
                self.position = change.position
                if subject.sees(change):
                    sent = True
                    metrics.WATCH_CHANGES.labels(change.kind).inc()
                    yield change
            if sent:
                heartbeat_at = loop.time() + config.heartbeat_s
            if len(batch.changes) >= config.batch:
                continue
            now = loop.time()
            if now >= heartbeat_at:
                heartbeat_at = now + config.heartbeat_s
                yield await self._heartbeat()
                continue
            wait_s = min(config.poll_s, heartbeat_at - now)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._wake.wait()
