"""Packets ready before the call: rebuild a user's hint-less packets right after a change.

A hint-less Prefetch (call setup) records its shape per user (cache/warm_shapes.py, kept
``ttl_s``). Every committed change notifies the change channel from whichever process wrote
it (storage/notifications.py); this process's warmer then waits ``delay_s`` after the user's
last notification (a burst of writes rebuilds once; a notification during a rebuild reruns it
once more afterwards), reads the user's content version, takes a Redis lock per (user,
version) so one serving process does the work, and builds and caches each recorded shape at
that version, with its own budget, at most ``concurrency`` users at once, after live reads:
while ``busy()`` says the read slots are taken it waits up to ``busy_wait_s``, then skips.
Nothing here is needed for correctness: a packet not warmed is built by the next Prefetch.
Failures are logged and counted (``memsvc_prefetch_warm_total``), never raised.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg
from redis.exceptions import RedisError

from memsvc.cache.warm_shapes import WarmShapes
from memsvc.concurrency.deadline import Budget
from memsvc.config import from_setting
from memsvc.observability import metrics
from memsvc.prefetch.model import PrefetchQuery
from memsvc.prefetch.service import PrefetchService
from memsvc.storage import versions
from memsvc.storage.errors import DATABASE_DOWN
from memsvc.storage.model import Scope
from memsvc.storage.notifications import ChangeListener
from memsvc.storage.pool import acquire

log = logging.getLogger(__name__)

BUILT, SKIPPED, FAILED = "built", "skipped", "failed"
_SEP = "\x1f"
_BUSY_POLL_S = 0.05
# What a database or Redis failure raises (logged without a trace, counted as failed).
_UNAVAILABLE: tuple[type[BaseException], ...] = (*DATABASE_DOWN, RedisError)

UserKey = tuple[str, str]


@dataclass(frozen=True)
class WarmConfig:
    delay_s: float = field(metadata=from_setting("prefetch_warm_delay_ms"))
    budget_s: float = field(metadata=from_setting("prefetch_warm_budget_ms"))
    concurrency: int = field(metadata=from_setting("prefetch_warm_concurrency"))
    acquire_timeout_s: float = field(metadata=from_setting("pg_acquire_timeout_ms"))
    busy_wait_s: float = 1.0


def encode_shape(query: PrefetchQuery) -> str:
    """What identifies a hint-less packet of a user (the session id is not part of it)."""
    scope = query.scope
    return _SEP.join((scope.persona_id, scope.agent_id, str(query.chars), str(query.tokens)))


def decode_shape(tenant_id: str, user_id: str, shape: str) -> PrefetchQuery | None:
    parts = shape.split(_SEP)
    if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
        return None
    persona, agent, chars, tokens = parts
    return PrefetchQuery(
        scope=Scope(tenant_id, user_id, persona, agent),
        session_id="",
        hint="",
        chars=int(chars),
        tokens=int(tokens),
    )


class PacketWarmer:
    def __init__(
        self,
        pool: asyncpg.Pool,
        service: PrefetchService,
        shapes: WarmShapes,
        listener: ChangeListener,
        config: WarmConfig,
    ) -> None:
        self._pool = pool
        self._service = service
        self._shapes = shapes
        self._listener = listener
        self._config = config
        self._slots = asyncio.Semaphore(config.concurrency)
        self._timers: dict[UserKey, asyncio.TimerHandle] = {}
        self._running: dict[UserKey, asyncio.Task[None]] = {}
        self._again: set[UserKey] = set()
        self._recording: set[asyncio.Task[None]] = set()
        self._unsubscribe: Callable[[], None] | None = None
        self._stopped = False
        #: Whether live reads hold the read slots now (set by the server; default: never).
        self.busy: Callable[[], bool] = lambda: False

    def start(self) -> None:
        self._unsubscribe = self._listener.subscribe(self._notified)
        self._service.on_hintless = self._requested
        self._listener.start()

    async def stop(self) -> None:
        self._stopped = True
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._service.on_hintless = None
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        tasks = [*self._running.values(), *self._recording]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    @property
    def pending(self) -> int:
        """Users waiting for or in a rebuild (tests wait for 0)."""
        return len(self._timers) + len(self._running)

    # -- what to warm ----------------------------------------------------------------------

    def _requested(self, query: PrefetchQuery) -> None:
        task = asyncio.ensure_future(self._record(query))
        self._recording.add(task)
        task.add_done_callback(self._recording.discard)

    async def _record(self, query: PrefetchQuery) -> None:
        scope = query.scope
        try:
            await self._shapes.record(scope.tenant_id, scope.user_id, encode_shape(query))
        except (RedisError, OSError, TimeoutError) as exc:
            log.info("packet warmer could not record a shape: %s", type(exc).__name__)

    # -- when ----------------------------------------------------------------------------------

    def _notified(self, tenant_id: str, user_id: str) -> None:
        key = (tenant_id, user_id)
        if self._stopped:
            return
        if key in self._running:
            self._again.add(key)
            return
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(self._config.delay_s, self._due, key)

    def _due(self, key: UserKey) -> None:
        self._timers.pop(key, None)
        task = asyncio.ensure_future(self._run(key))
        self._running[key] = task
        task.add_done_callback(functools.partial(self._finished, key))

    def _finished(self, key: UserKey, _task: object) -> None:
        self._running.pop(key, None)
        if key in self._again:
            self._again.discard(key)
            self._notified(*key)

    # -- the work --------------------------------------------------------------------------

    async def _run(self, key: UserKey) -> None:
        tenant_id, user_id = key
        try:
            async with self._slots:
                await self._warm(tenant_id, user_id)
        except asyncio.CancelledError:
            raise
        except _UNAVAILABLE as exc:
            metrics.PREFETCH_WARM.labels(FAILED).inc()
            log.info("packet warming skipped, a backing store failed: %s", type(exc).__name__)
        except Exception:
            metrics.PREFETCH_WARM.labels(FAILED).inc()
            log.exception("packet warming failed")

    async def _idle(self) -> bool:
        """Wait (bounded) until live reads leave room; False when they never did."""
        loop = asyncio.get_running_loop()
        until = loop.time() + self._config.busy_wait_s
        while self.busy():
            if loop.time() >= until:
                return False
            await asyncio.sleep(_BUSY_POLL_S)
        return True

    async def _warm(self, tenant_id: str, user_id: str) -> None:
        try:
            shapes = await self._shapes.recent(tenant_id, user_id)
        except (RedisError, OSError, TimeoutError) as exc:
            metrics.PREFETCH_WARM.labels(FAILED).inc()
            log.info("packet warmer cannot read shapes: %s", type(exc).__name__)
            return
        queries = [q for q in (decode_shape(tenant_id, user_id, s) for s in shapes) if q]
        if not queries:
            return  # never prefetched lately: nothing to warm
        if not await self._idle():
            metrics.PREFETCH_WARM.labels(SKIPPED).inc(len(queries))
            return
        budget = Budget(self._config.budget_s)
        async with acquire(self._pool, budget, timeout_s=self._config.acquire_timeout_s) as conn:
            version = await versions.current_version(conn, tenant_id, user_id)
        if version == 0:
            # Nothing stored, or erased: nothing to warm now or later.
            await self._shapes.forget(tenant_id, user_id)
            return
        if not await self._shapes.claim(
            tenant_id, user_id, version, hold_s=self._config.budget_s * 2
        ):
            metrics.PREFETCH_WARM.labels(SKIPPED).inc(len(queries))
            return
        for query in queries:
            try:
                result = await self._service.warm(query, version, budget)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                result = FAILED
                log.info("packet warming of one shape failed: %s", type(exc).__name__)
            metrics.PREFETCH_WARM.labels(result).inc()
            if budget.expired:
                break
