"""The outbox worker: claim due jobs (SKIP LOCKED + lease), run them, end each one.

Woken by NOTIFY on new jobs (heard on the process's one LISTEN connection, subscribed to its
outbox channel: storage/notifications.py), by a periodic sweep (inactive users' sessions,
expired leases, due retries), and by `kick(tenant, user)` when a user with pending work
reads (so an active user's memories exist before the next turn). All three go through the
same claim, so no job is ever processed twice at once.

Every attempt ends one of three ways (ingest.failures): done; retry, due again after an
exponential backoff with full jitter (a transient failure); or abort, dead at once (a
permanent failure or a bug) or after the last attempt. A job runs under its deadline, every
acquire and statement here under its own timeout, and the final state write is shielded
from cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg

from memsvc.concurrency.backoff import backoff_delay
from memsvc.concurrency.owner import working_for
from memsvc.config import WORKER_ACQUIRE_TIMEOUT_S, from_setting
from memsvc.ingest.failures import Failure, Verdict, classify
from memsvc.ingest.payload import traceparent_of
from memsvc.ingest.pipeline import ExtractionPipeline, Outcome
from memsvc.observability import metrics, tracing
from memsvc.storage import outbox
from memsvc.storage.connection import Connection
from memsvc.storage.errors import DATABASE_DOWN
from memsvc.storage.notifications import ChangeListener
from memsvc.storage.outbox import Job

log = logging.getLogger(__name__)

CHANNEL = "memsvc_outbox"

# Users with announced work a worker remembers for its read kicks (a set of short strings).
MAX_ANNOUNCED = 100_000
# Users a worker remembers having claimed for, so a tenant's users take turns (sent with
# every fair claim: small). One forgotten counts as never served, which puts it first.
MAX_SERVED = 256


class JobGone(Exception):
    """The running job was deleted or taken over by another worker."""


@dataclass(frozen=True)
class WorkerSettings:
    concurrency: int = field(default=3, metadata=from_setting("worker_concurrency"))
    lease_s: float = field(default=120.0, metadata=from_setting("worker_lease_s"))
    # Well under the lease, so a live worker never loses a job it is still running.
    job_timeout_s: float = field(default=90.0, metadata=from_setting("worker_job_timeout_s"))
    max_attempts: int = field(default=5, metadata=from_setting("worker_max_attempts"))
    backoff_base_s: float = field(default=2.0, metadata=from_setting("worker_backoff_base_s"))
    backoff_max_s: float = 300.0
    # Share of each retry delay drawn at random (1.0: full jitter, anywhere below it).
    backoff_jitter: float = 1.0
    sweep_interval_s: float = field(default=15.0, metadata=from_setting("worker_sweep_interval_s"))
    reconcile_interval_s: float = field(default=60.0, metadata=from_setting("reconcile_interval_s"))
    # Claims, final states and the listener (MEMSVC_WORKER_ACQUIRE_TIMEOUT_MS): longer than
    # a call's wait for a connection.
    acquire_timeout_s: float = field(
        default=WORKER_ACQUIRE_TIMEOUT_S, metadata=from_setting("worker_acquire_timeout_ms")
    )
    statement_timeout_s: float = field(default=5.0, metadata=from_setting("pg_command_timeout_ms"))
    # Jobs one tenant may have running at once over every worker (0: no cap); claims go to
    # tenants turn by turn, fewest running first (outbox.claim_fairly).
    max_jobs_per_tenant: int = field(default=0, metadata=from_setting("worker_max_jobs_per_tenant"))
    # Slots of this worker kept for tenants with no job running (at most concurrency - 1).
    reserved_slots: int = field(default=0, metadata=from_setting("worker_reserved_slots"))
    # How often a running job checks that it is still wanted (not deleted, not taken over):
    # when it is not, its work is cancelled, parsing included (0: never checks).
    job_check_s: float = 2.0


class OutboxWorker:
    """Runs extraction jobs with bounded concurrency; stop() drains gracefully."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        pipeline: ExtractionPipeline,
        settings: WorkerSettings,
        *,
        listener: ChangeListener,
        worker_id: str | None = None,
        periodic: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self._pool = pool
        self._pipeline = pipeline
        self._settings = settings
        self._listener = listener
        self._unsubscribe: Callable[[], None] | None = None
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self._periodic = periodic
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._stopped: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._jobs: set[asyncio.Task[object]] = set()
        self._kicked: set[tuple[str, str]] = set()
        # Users with work announced on the outbox channel ("tenant:user", the NOTIFY payload)
        # and not yet found drained by a kick: while the listener is connected, a read of
        # anyone else kicks nothing (a claim statement per read, for nobody's work, doubled
        # the database's load under a burst of reads). Unknown while it is not connected.
        self._announced: set[str] = set()
        # When the set last overflowed (it is then cleared): kicks are not selective for a
        # sweep interval, after which the loop has claimed whatever was due then.
        self._overflowed_at = -math.inf
        # Claims in flight: a job being claimed is not yet in _jobs, but is work in progress.
        self._claiming = 0
        self._rng = random.Random()
        # (tenant, user) -> when this worker last claimed a job of theirs (a counter).
        self._served: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._claims = 0
        self._last_periodic = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        # Jobs may have arrived while nobody listened: a reconnect wakes the loop.
        self._unsubscribe = self._listener.subscribe_channel(
            CHANNEL, self._on_announced, on_reconnect=self._wake.set
        )
        self._listener.start()
        self._spawn(self._loop(), self._tasks)

    @property
    def _listening(self) -> bool:
        """Whether announcements are heard now (the process's listener is connected)."""
        return self._unsubscribe is not None and self._listener.listening.is_set()

    async def stop(self, grace_s: float) -> None:
        """Stop claiming; let running jobs finish within the grace period; give back the rest.

        A second call waits for the first one's drain (the server begins it on SIGTERM, beside
        the calls' own grace, and its runtime's close calls it again)."""
        if self._stopped is None:
            self._stopped = asyncio.ensure_future(self._drain(grace_s))
        await asyncio.shield(self._stopped)

    async def _drain(self, grace_s: float) -> None:
        self._stopping.set()
        self._wake.set()
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
        if self._jobs:
            _, pending = await asyncio.wait(set(self._jobs), timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)

    def _spawn_job(self, job: Job) -> None:
        task: asyncio.Task[object] = asyncio.ensure_future(self._run(job))
        self._jobs.add(task)

        def finished(t: asyncio.Task[object]) -> None:
            self._jobs.discard(t)
            if not t.cancelled() and (exc := t.exception()) is not None:
                # Its final state could not be written (the database went away): the job stays
                # leased, and is claimed again when the lease ends. Retrieved here, as nobody
                # awaits the task.
                log.warning("ingest %s ended unrecorded: %s", job.ingest_id, type(exc).__name__)
            # The job's final state is written and its slot is free: claim the next due job
            # now (possibly the same user's next one), not at the next sweep.
            self._wake.set()

        task.add_done_callback(finished)

    def _spawn(self, coro: Awaitable[object], into: set[asyncio.Task[object]]) -> None:
        task: asyncio.Task[object] = asyncio.ensure_future(coro)
        into.add(task)
        task.add_done_callback(into.discard)

    # -- triggers ----------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def kick(self, tenant_id: str, user_id: str) -> None:
        """Drain this user's due jobs now (fire and forget; concurrent kicks coalesce). Only
        for a user whose work was announced, while the listener hears announcements."""
        key = (tenant_id, user_id)
        announced = f"{tenant_id}:{user_id}"
        if self._stopping.is_set() or key in self._kicked:
            return
        if self._selective() and announced not in self._announced:
            return
        self._kicked.add(key)

        async def drain() -> None:
            try:
                if not await self._claim_and_run(tenant_id=tenant_id, user_id=user_id):
                    # Nothing due now (a job not due yet is the sweep's to claim).
                    self._announced.discard(announced)
            except DATABASE_DOWN as exc:
                # Best effort, and nobody awaits this task: an escaping error would only be
                # logged as never retrieved, once per read while the database is down. The
                # sweep claims the user's work when it is back.
                log.info("drain for a reading user skipped: %s", type(exc).__name__)
            finally:
                self._kicked.discard(key)

        self._spawn(drain(), self._tasks)

    async def drain(self) -> int:
        """Run every due job now and wait for them (tests, `memsvc worker --once`)."""
        total = 0
        while True:
            claimed = await self._claim_and_run()
            # Jobs the background loop of this worker took meanwhile count as work in
            # progress: their user's next job becomes claimable only once they finish.
            busy = bool(self._jobs) or self._claiming > 0
            await self._wait_jobs()
            if claimed == 0 and not busy:
                return total
            total += claimed

    async def _wait_jobs(self) -> None:
        while self._jobs:
            await asyncio.wait(set(self._jobs))

    # -- loops -------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                await self._claim_and_run()
                await self._maybe_periodic()
            except DATABASE_DOWN as exc:
                log.warning("worker loop: %s; retrying", type(exc).__name__)
            except Exception:
                # A bug in claiming or periodic work: said loudly, with its stack, at every
                # sweep; the loop itself lives on (were it to die, nothing would be claimed
                # again, and nothing would say so).
                log.error("worker loop failed unexpectedly; retrying", exc_info=True)
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # that lands as the event is set (stop() does both).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.sweep_interval_s):
                    await self._wake.wait()

    async def _maybe_periodic(self) -> None:
        now = time.monotonic()
        if (
            self._periodic is None
            or now - self._last_periodic < self._settings.reconcile_interval_s
        ):
            return
        self._last_periodic = now
        await self._periodic()
        async with self._acquire() as conn:
            depth, age = await outbox.depth(conn, timeout_s=self._settings.statement_timeout_s)
        metrics.OUTBOX_DEPTH.set(depth)
        metrics.OUTBOX_AGE.set(age)

    def _selective(self) -> bool:
        """Whether the announced set says who has work: the listener is connected and the
        set has not overflowed within the last sweep interval."""
        recent = time.monotonic() - self._overflowed_at < self._settings.sweep_interval_s
        return self._listening and not recent

    def _on_announced(self, payload: str) -> None:
        if len(self._announced) >= MAX_ANNOUNCED:
            # Never unbounded: start again from nothing, kicking every reader for a while.
            self._announced.clear()
            self._overflowed_at = time.monotonic()
        self._announced.add(payload)
        self._wake.set()

    # -- claiming and running ------------------------------------------------------------------

    async def _claim_and_run(
        self, *, tenant_id: str | None = None, user_id: str | None = None
    ) -> int:
        claimed = 0
        while not self._stopping.is_set():
            free = self._settings.concurrency - (len(self._jobs))
            if free <= 0:
                if user_id is None:
                    return claimed
                await asyncio.wait(set(self._jobs), return_when=asyncio.FIRST_COMPLETED)
                continue
            self._claiming += 1
            try:
                async with self._acquire() as conn:
                    jobs = await self._claim(conn, free, tenant_id, user_id)
                for job in jobs:
                    self._note_served(job)
                    self._spawn_job(job)
            finally:
                self._claiming -= 1
            if not jobs:
                return claimed
            claimed += len(jobs)
            if user_id is not None:
                # One user's jobs run oldest first, one at a time: wait before claiming more.
                await self._wait_jobs()
        return claimed

    async def _claim(
        self, conn: Connection, free: int, tenant_id: str | None, user_id: str | None
    ) -> list[Job]:
        """Up to ``free`` due jobs (one user's, when given). The last ``reserved_slots`` free
        slots go only to tenants with no job running: however busy one tenant keeps the
        workers, another's job starts at once."""
        s = self._settings
        reserved = min(s.reserved_slots, s.concurrency - 1)
        anyone = max(0, free - reserved)
        if user_id is not None and tenant_id is not None:
            cap = s.max_jobs_per_tenant if anyone else 1
            if (
                cap
                and await outbox.running_jobs(conn, tenant_id, timeout_s=s.statement_timeout_s)
                >= cap
            ):
                return []  # a read's kick does not get a tenant past its cap either
            return await outbox.claim(
                conn,
                worker_id=self.worker_id,
                lease_s=s.lease_s,
                limit=free,
                tenant_id=tenant_id,
                user_id=user_id,
                timeout_s=s.statement_timeout_s,
            )
        jobs: list[Job] = []
        if anyone:
            jobs = await outbox.claim_fairly(
                conn,
                worker_id=self.worker_id,
                lease_s=s.lease_s,
                limit=anyone,
                max_per_tenant=s.max_jobs_per_tenant,
                served=self._served,
                timeout_s=s.statement_timeout_s,
            )
        if free > len(jobs):
            jobs += await outbox.claim_fairly(
                conn,
                worker_id=self.worker_id,
                lease_s=s.lease_s,
                limit=free - len(jobs),
                max_per_tenant=1,
                served=self._served,
                timeout_s=s.statement_timeout_s,
            )
        return jobs

    def _note_served(self, job: Job) -> None:
        """The job's user was served now: it goes after its tenant's other users next time."""
        self._claims += 1
        key = (job.scope.tenant_id, job.scope.user_id)
        self._served[key] = self._claims
        self._served.move_to_end(key)
        while len(self._served) > MAX_SERVED:
            self._served.popitem(last=False)

    def _acquire(self) -> asyncpg.pool.PoolAcquireContext:
        return self._pool.acquire(timeout=self._settings.acquire_timeout_s)

    async def _run(self, job: Job) -> None:
        started = time.perf_counter()
        if job.attempts > self._settings.max_attempts:
            # Claimed again after its last attempt's lease expired (that worker died mid-job).
            await asyncio.shield(self._dead(job, "lease expired"))
            return
        try:
            async with asyncio.timeout(self._settings.job_timeout_s):
                # Its own trace (the Ingest call ended long ago), linked to that call's.
                with tracing.linked_span(
                    "memsvc.extraction_job",
                    traceparent_of(job.payload),
                    ingest_id=str(job.ingest_id),
                    attempt=job.attempts,
                ):
                    outcome = await self._watched(job)
        except JobGone:
            # Deleted (ForgetSession, erasure) or taken over: nothing to record, and its
            # parsing already stopped.
            metrics.INGEST_JOBS.labels("gone").inc()
            log.info("ingest %s stopped: the job was deleted or taken over", job.ingest_id)
            return
        except asyncio.CancelledError:
            # Shutdown: hand the job back at once rather than waiting for the lease to expire
            # (if the database is gone too, the lease does it). The cancellation goes on.
            with contextlib.suppress(*DATABASE_DOWN):
                await asyncio.shield(self._give_back(job, "shutdown", 0.0))
            raise
        except Exception as exc:  # every failure is classified: retried, or dead with a reason
            failure = classify(exc)
            if failure.unexpected:
                # The log formatter renders the class and frames, never the message.
                log.error(
                    "ingest %s failed on an unexpected error; the job is dead",
                    job.ingest_id,
                    exc_info=exc,
                )
            await asyncio.shield(self._failed(job, failure))
            return
        finally:
            metrics.JOB_SECONDS.observe(time.perf_counter() - started)
        await asyncio.shield(self._done(job, outcome))

    async def _watched(self, job: Job) -> Outcome:
        """The pipeline's run of the job, checked every ``job_check_s`` to still be this
        worker's: when the job was deleted or taken over meanwhile, the run is cancelled
        (JobGone). Cancelled itself (the job's deadline, a shutdown), it cancels the run."""
        # The run's parses and embeddings wait their turns as this tenant's and user's.
        working_for(job.scope.tenant_id, job.scope.user_id)
        work = asyncio.ensure_future(self._pipeline.run(job))
        try:
            while True:
                check_s = self._settings.job_check_s
                done, _ = await asyncio.wait({work}, timeout=check_s if check_s > 0 else None)
                if done:
                    return work.result()
                try:
                    async with self._acquire() as conn:
                        wanted = await outbox.still_leased(
                            conn, job, timeout_s=self._settings.statement_timeout_s
                        )
                except DATABASE_DOWN:
                    continue  # unknown: run on (the final state write decides)
                if not wanted:
                    raise JobGone
        finally:
            if not work.done():
                work.cancel()
                await asyncio.wait({work})
            if not work.cancelled():
                work.exception()  # retrieved, also when it failed after we stopped waiting

    async def _done(self, job: Job, outcome: Outcome) -> None:
        async with self._acquire() as conn:
            kept = await outbox.complete(
                conn, job, outcome.as_dict(), timeout_s=self._settings.statement_timeout_s
            )
        metrics.INGEST_JOBS.labels("done" if kept else "lease_lost").inc()
        for kind, value in outcome.as_dict().items():
            if value:
                metrics.EXTRACTION_OUTCOMES.labels(kind).inc(value)

    async def _give_back(self, job: Job, kind: str, delay_s: float) -> None:
        async with self._acquire() as conn:
            await outbox.retry_later(
                conn, job, kind, delay_s, timeout_s=self._settings.statement_timeout_s
            )

    async def _dead(self, job: Job, reason: str) -> None:
        async with self._acquire() as conn:
            await outbox.mark_dead(conn, job, reason, timeout_s=self._settings.statement_timeout_s)
        metrics.INGEST_DEAD.inc()
        metrics.INGEST_JOBS.labels("dead").inc()
        log.error("ingest %s is dead after %d attempt(s): %s", job.ingest_id, job.attempts, reason)

    async def _failed(self, job: Job, failure: Failure) -> None:
        if failure.verdict is Verdict.ABORT or job.attempts >= self._settings.max_attempts:
            await self._dead(job, failure.reason)
            return
        s = self._settings
        delay = backoff_delay(
            job.attempts,
            base=s.backoff_base_s,
            cap=s.backoff_max_s,
            jitter=s.backoff_jitter,
            random_unit=self._rng.random(),
        )
        await self._give_back(job, failure.reason, delay)
        metrics.INGEST_JOBS.labels("retry").inc()
        log.warning(
            "ingest %s attempt %d failed (%s); retry in %.1fs",
            job.ingest_id,
            job.attempts,
            failure.reason,
            delay,
        )
