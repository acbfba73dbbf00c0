"""The process's one LISTEN connection, shared by its subscribers, on the change channel and
on any other channel a subscriber names (the API keys' channel: server/auth.py).

Every committed change to a memory or core block notifies channel ``memsvc_changes`` with
the user it concerns (migration 0011's commit trigger; on Citus the writer itself, from the
coordinator: storage.changes.Waker), from any process: servers and workers alike. One
dedicated connection per process LISTENs and calls each subscriber's ``on_user(tenant,
user)``; it reconnects with backoff when it drops and then calls each ``on_reconnect()``
(changes may have committed while nobody listened). Subscribers: WatchMemories' change
stream (memories/watch.py) and the packet warmer (prefetch/warmer.py); ``subscribe_channel``
takes the raw payloads of another channel (the outbox worker's new jobs: ingest/worker.py).
Callbacks run on the event loop and must not block.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from memsvc.concurrency.backoff import backoff_delay
from memsvc.observability import metrics
from memsvc.storage import changes
from memsvc.storage.errors import DATABASE_DOWN

log = logging.getLogger(__name__)

# The connection's name in pg_stat_activity (an operator, or a test, can find it by it).
APPLICATION_NAME = "memsvc-listener"
_BACKOFF_BASE_S = 0.5
_BACKOFF_MAX_S = 30.0

OnUser = Callable[[str, str], None]
OnPayload = Callable[[str], None]
OnReconnect = Callable[[], None]


@dataclass(frozen=True, eq=False)
class _Subscriber:
    channel: str
    on_payload: OnPayload
    on_reconnect: OnReconnect | None


def _on_change(on_user: OnUser) -> OnPayload:
    def on_payload(payload: str) -> None:
        tenant, _, user = payload.partition(changes.SEPARATOR)
        on_user(tenant, user)

    return on_payload


class ChangeListener:
    """``subscribe`` callbacks, ``start`` listening (idempotent), ``stop`` at shutdown."""

    def __init__(self, dsn: str, *, connect_timeout_s: float, command_timeout_s: float) -> None:
        self._dsn = dsn
        self._connect_timeout_s = connect_timeout_s
        self._command_timeout_s = command_timeout_s
        self._subscribers: list[_Subscriber] = []
        self._task: asyncio.Task[None] | None = None
        self._channels_listened: frozenset[str] = frozenset()
        self._conn: asyncpg.Connection[asyncpg.Record] | None = None
        self._stopping = asyncio.Event()
        self._rng = random.Random()
        # Set while the LISTEN connection is up; `dropped` from its loss to the reconnect.
        self.listening = asyncio.Event()
        self.dropped = asyncio.Event()

    def subscribe(
        self, on_user: OnUser, on_reconnect: OnReconnect | None = None
    ) -> Callable[[], None]:
        """Add a subscriber to the change channel; returns the function that removes it."""
        return self.subscribe_channel(changes.CHANNEL, _on_change(on_user), on_reconnect)

    def subscribe_channel(
        self, channel: str, on_payload: OnPayload, on_reconnect: OnReconnect | None = None
    ) -> Callable[[], None]:
        """Add a subscriber to ``channel``'s payloads; returns the function that removes it.
        A channel new to a live connection makes it reconnect (every subscriber then hears
        ``on_reconnect``): LISTEN is set up in one place, the connect."""
        subscriber = _Subscriber(channel, on_payload, on_reconnect)
        self._subscribers.append(subscriber)
        if channel not in self._channels_listened and self._conn is not None:
            # Not listening to everything until the reconnect: say so at once.
            self.listening.clear()
            self._conn.terminate()

        def unsubscribe() -> None:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

        return unsubscribe

    def start(self) -> None:
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.ensure_future(self._listen())

    async def stop(self) -> None:
        self._stopping.set()
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.wait([task])

    def _notified(self, _conn: object, _pid: int, channel: str, payload: object) -> None:
        for subscriber in list(self._subscribers):
            if subscriber.channel != channel:
                continue
            try:
                subscriber.on_payload(str(payload))
            except Exception:
                log.exception("a change subscriber failed")

    def _reconnected(self) -> None:
        for subscriber in list(self._subscribers):
            if subscriber.on_reconnect is not None:
                try:
                    subscriber.on_reconnect()
                except Exception:
                    log.exception("a change subscriber failed")

    async def _listen(self) -> None:
        """LISTEN on a dedicated connection; reconnect with backoff when it drops."""
        failures = 0
        while not self._stopping.is_set():
            conn: asyncpg.Connection[asyncpg.Record] | None = None
            try:
                conn = await asyncpg.connect(
                    self._dsn,
                    timeout=self._connect_timeout_s,
                    command_timeout=self._command_timeout_s,
                    server_settings={"application_name": APPLICATION_NAME},
                )
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                channels = frozenset({changes.CHANNEL, *(s.channel for s in self._subscribers)})
                for channel in sorted(channels):
                    await conn.add_listener(channel, self._notified)
                self._channels_listened = channels
                self._conn = conn
                if failures:
                    metrics.WATCH_LISTENER_RECONNECTS.inc()
                failures = 0
                self.dropped.clear()
                self.listening.set()
                # Changes may have committed while nobody listened.
                self._reconnected()
                await lost.wait()
            except DATABASE_DOWN as exc:
                log.info("change listener unavailable (%s); retrying", type(exc).__name__)
            finally:
                self._conn = None
                self._channels_listened = frozenset()
                self.listening.clear()
                self.dropped.set()
                if conn is not None and not conn.is_closed():
                    await conn.close(timeout=2)
            failures += 1
            await asyncio.sleep(
                backoff_delay(
                    failures,
                    base=_BACKOFF_BASE_S,
                    cap=_BACKOFF_MAX_S,
                    random_unit=self._rng.random(),
                )
            )
