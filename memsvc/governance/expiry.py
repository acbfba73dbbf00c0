"""The expiry task: delete expired memories, episodes and messages in bounded batches.

Runs in every worker process (every MEMSVC_EXPIRY_INTERVAL_S, jittered) and once from
``memsvc worker --once``. Each batch is one short statement over at most MEMSVC_EXPIRY_BATCH
rows taken with SKIP LOCKED, so any number of workers share the work without waiting on each
other. After a batch of memories or episodes, the affected users get a new content version
(cached Prefetch packets holding the deleted rows are never looked up again) and their cached
keys are dropped. Messages never appear in a packet, so their batches leave the cache alone
and instead rebuild the context index of the sessions they left.

Correctness does not wait for this task: every read filters ``expires_at > now()``.

Every acquire waits at most ``acquire_timeout_s``; every statement is bounded by the pool's
command_timeout. The loop outlives a database outage and logs a bug with its stack; its own
cancellation (``stop``) always propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import asyncpg

from memsvc.cache.invalidation import PacketInvalidator
from memsvc.config import WORKER_ACQUIRE_TIMEOUT_S, from_setting
from memsvc.observability import metrics
from memsvc.storage import changes, citus, retention
from memsvc.storage.errors import DATABASE_DOWN
from memsvc.storage.retention import User

log = logging.getLogger(__name__)

# Cached-key deletions in flight at once after a batch.
_INVALIDATE_CONCURRENCY = 32


@dataclass(frozen=True)
class ExpirySettings:
    interval_s: float = field(default=60.0, metadata=from_setting("expiry_interval_s"))
    batch: int = field(default=500, metadata=from_setting("expiry_batch"))
    # MEMSVC_WORKER_ACQUIRE_TIMEOUT_MS: longer than a call's wait for a connection.
    acquire_timeout_s: float = field(
        default=WORKER_ACQUIRE_TIMEOUT_S, metadata=from_setting("worker_acquire_timeout_ms")
    )
    # MEMSVC_CHANGES_RETENTION_S: how long the change stream keeps its entries.
    changes_retention_s: float = field(
        default=7 * 86400.0, metadata=from_setting("changes_retention_s")
    )


@dataclass
class ExpiryReport:
    """Rows one run deleted, by kind, and the batches it took."""

    memories: int = 0
    episodes: int = 0
    topics: int = 0
    messages: int = 0
    batches: int = 0
    # Change-stream entries pruned (not counted in total: they are not user data).
    changes: int = 0

    @property
    def total(self) -> int:
        return self.memories + self.episodes + self.topics + self.messages


class ExpiryTask:
    """Deletes what expired; ``run_once`` for one full pass, ``start``/``stop`` for the loop."""

    def __init__(
        self, pool: asyncpg.Pool, invalidator: PacketInvalidator, settings: ExpirySettings
    ) -> None:
        self._pool = pool
        self._invalidator = invalidator
        # Expired memories wake the users' change watchers where the trigger cannot (Citus).
        self._waker = changes.Waker()
        self._settings = settings
        self._rng = random.Random()
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        # Whether batches go one user at a time (a Citus database: FOR UPDATE SKIP LOCKED only
        # works in a single-shard statement there). Found out at the first pass.
        self._by_user: bool | None = None

    # -- one pass ------------------------------------------------------------------------------

    async def run_once(self) -> ExpiryReport:
        """Delete everything expired now, batch after batch, until a batch comes back short."""
        report = ExpiryReport()
        limit = self._settings.batch
        if self._by_user is None:
            async with self._acquire() as conn:
                self._by_user = await citus.has_citus(conn)
        if self._by_user:
            await self._run_by_user(report)
        else:
            while await self._memory_batch(report) >= limit:
                pass
            while await self._episode_batch(report) >= limit:
                pass
            while await self._message_batch(report) >= limit:
                pass
            while await self._changes_batch(report) >= limit:
                pass
        if report.total:
            log.info(
                "expired %d memories, %d episodes, %d topics, %d messages in %d batches",
                report.memories,
                report.episodes,
                report.topics,
                report.messages,
                report.batches,
            )
        return report

    async def _run_by_user(self, report: ExpiryReport) -> None:
        """The same batches, one user at a time: a lock-free look for users with expired
        rows (over every shard), then each user's batches as single-shard statements, until a
        look finds nobody, or only users whose rows other workers hold."""
        limit = self._settings.batch
        kinds: list[tuple[Callable[[], Awaitable[list[User]]], Callable[..., Awaitable[int]]]] = [
            (self._users_of("memories"), self._memory_batch),
            (self._users_of("episodes"), self._episode_batch),
            (self._users_of("messages"), self._message_batch),
            (self._users_with_old_changes, self._changes_batch),
        ]
        for find, batch in kinds:
            while users := await find():
                progressed = False
                for user in users:
                    while (n := await batch(report, user=user)) >= limit:
                        progressed = True
                    progressed = progressed or n > 0
                if not progressed:
                    break

    def _users_of(self, table: retention.ExpiringTable) -> Callable[[], Awaitable[list[User]]]:
        async def find() -> list[User]:
            async with self._acquire() as conn:
                return await retention.users_with_expired(conn, table, self._settings.batch)

        return find

    async def _users_with_old_changes(self) -> list[User]:
        async with self._acquire() as conn:
            return await changes.users_to_prune(
                conn, self._settings.changes_retention_s, self._settings.batch
            )

    async def _memory_batch(self, report: ExpiryReport, *, user: User | None = None) -> int:
        # One transaction: the change stream stamps these deletes with the new versions.
        async with self._acquire() as conn, conn.transaction():
            scopes = await retention.expire_memories(conn, self._settings.batch, user=user)
            users = {(s.tenant_id, s.user_id) for s in scopes}
            await retention.bump_versions(conn, users)
            await self._waker.users(conn, users)
        await self._invalidate(users)
        report.memories += len(scopes)
        report.batches += 1
        metrics.EXPIRED.labels("memory").inc(len(scopes))
        return len(scopes)

    async def _episode_batch(self, report: ExpiryReport, *, user: User | None = None) -> int:
        topics = 0
        async with self._acquire() as conn:
            scopes = await retention.expire_episodes(conn, self._settings.batch, user=user)
            users = {(s.tenant_id, s.user_id) for s in scopes}
            for tenant_id, user_id in sorted(users):
                async with conn.transaction():
                    topics += await retention.drop_orphan_topics(conn, tenant_id, user_id)
            await retention.bump_versions(conn, users)
        await self._invalidate(users)
        report.episodes += len(scopes)
        report.topics += topics
        report.batches += 1
        metrics.EXPIRED.labels("episode").inc(len(scopes))
        metrics.EXPIRED.labels("topic").inc(topics)
        return len(scopes)

    async def _message_batch(self, report: ExpiryReport, *, user: User | None = None) -> int:
        async with self._acquire() as conn:
            deleted = await retention.expire_messages(conn, self._settings.batch, user=user)
            # Sessions wholly expired need no index: the next batches delete the rest.
            touched = list(dict.fromkeys(deleted))
            for scope, session_id in await retention.live_sessions(conn, touched, user=user):
                try:
                    await retention.reindex_session(conn, scope, session_id)
                except asyncpg.DeadlockDetectedError:
                    # Raced an extraction job indexing the same session; it rebuilt the
                    # context of the turns it touched, and the next change rebuilds the rest.
                    log.info("context reindex after expiry skipped (deadlock with a job)")
        report.messages += len(deleted)
        report.batches += 1
        metrics.EXPIRED.labels("message").inc(len(deleted))
        return len(deleted)

    async def _changes_batch(self, report: ExpiryReport, *, user: User | None = None) -> int:
        """Change-stream entries older than MEMSVC_CHANGES_RETENTION_S (each user's pruned
        horizon is kept, so resuming below it is OUT_OF_RANGE, not a silent gap)."""
        async with self._acquire() as conn:
            pruned = await changes.prune(
                conn, self._settings.changes_retention_s, self._settings.batch, user=user
            )
        report.changes += pruned
        metrics.EXPIRED.labels("change").inc(pruned)
        return pruned

    def _acquire(self) -> asyncpg.pool.PoolAcquireContext:
        return self._pool.acquire(timeout=self._settings.acquire_timeout_s)

    async def _invalidate(self, users: Iterable[tuple[str, str]]) -> None:
        pending = sorted(users)
        for i in range(0, len(pending), _INVALIDATE_CONCURRENCY):
            chunk = pending[i : i + _INVALIDATE_CONCURRENCY]
            await asyncio.gather(*(self._invalidator.drop_user(t, u) for t, u in chunk))

    # -- the periodic loop -------------------------------------------------------------------

    def start(self) -> None:
        self._stopping.clear()
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        """Cancel the loop and wait for it to end. A cancellation of the caller meanwhile
        propagates: the loop's own CancelledError is not awaited as if it were ours."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.wait([task])

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            # Jittered, so the workers of a fleet started together do not all run at once.
            delay = self._settings.interval_s * self._rng.uniform(0.8, 1.2)
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # that lands as the event is set (stop() does both).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stopping.wait()
            if self._stopping.is_set():
                return
            try:
                await self.run_once()
            except DATABASE_DOWN as exc:
                log.warning("expiry pass failed (%s); retrying next interval", type(exc).__name__)
            except Exception:
                # A bug: said loudly, with its stack, at every interval; the loop lives on
                # (were it to die, nothing would expire again, and nothing would say so).
                log.error("expiry pass failed unexpectedly; retrying next interval", exc_info=True)
