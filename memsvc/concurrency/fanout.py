"""Run named legs concurrently until a budget runs out; stragglers are cancelled, not awaited."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class LegResult(Generic[T]):
    """What one leg produced: a value, an error, or nothing in time (``timed_out``)."""

    name: str
    value: T | None
    error: BaseException | None
    timed_out: bool
    elapsed_ms: float
    # Not waited for: another leg's result made it unnecessary (``settle``).
    skipped: bool = False

    @property
    def ok(self) -> bool:
        return not self.timed_out and not self.skipped and self.error is None


def _stamp(finished_at: dict[str, float], name: str, _task: asyncio.Task[Any]) -> None:
    finished_at.setdefault(name, time.perf_counter())


def late(result: LegResult[Any], also: tuple[type[BaseException], ...] = ()) -> bool:
    """Out of time: cancelled at the budget, or a timeout raised inside the leg (a statement
    or pool timeout, or one of ``also``, e.g. the embedder's own timeout error)."""
    return result.timed_out or isinstance(result.error, (TimeoutError, *also))


class LegRunner:
    """Fans legs out as tasks and keeps a reference to every leg it cancelled.

    A plain ``gather`` (or a TaskGroup) would wait for cancelled legs to wind down: an asyncpg
    query answers its cancellation only after the server acknowledged the cancel request and
    the connection went back to the pool. The answer must not wait for that, so cancelled legs
    finish in the background; the runner holds them so they are never garbage-collected
    mid-flight and their errors are retrieved (an unretrieved one is an event-loop warning).
    """

    # Weight of the newest lateness observation in the moving average.
    LATENESS_ALPHA = 0.2
    # The reserve never takes more than this share of a budget.
    MAX_RESERVE_SHARE = 0.25

    def __init__(self) -> None:
        self._stragglers: set[asyncio.Task[Any]] = set()
        # How late the event loop woke this runner at a budget's end, on average. On a
        # saturated loop every timer fires late, and so does everything after it (fusing,
        # serializing, sending): runs then stop their legs that much earlier, so answers
        # still leave before the caller's deadline.
        self._lateness_s = 0.0

    @property
    def reserve_s(self) -> float:
        """Time kept back from each budget for a late-waking loop (twice the average)."""
        return 2 * self._lateness_s

    @property
    def stragglers(self) -> int:
        """Cancelled legs still winding down (releasing their connection)."""
        return len(self._stragglers)

    async def run(
        self,
        legs: Mapping[str, Coroutine[Any, Any, T]],
        *,
        budget_s: float,
        settle: Callable[[str, T], Collection[str]] | None = None,
    ) -> dict[str, LegResult[T]]:
        """Run every leg; return each one's result once all finished or the budget ran out.

        ``settle(name, value)`` is called as each leg succeeds and names the legs no longer
        worth waiting for: those still running are cancelled and reported ``skipped``."""
        started = time.perf_counter()
        wait_s = max(0.0, budget_s - min(self.reserve_s, budget_s * self.MAX_RESERVE_SHARE))
        finished_at: dict[str, float] = {}
        tasks: dict[str, asyncio.Task[T]] = {}
        for name, coro in legs.items():
            task = asyncio.create_task(coro, name=f"leg:{name}")
            task.add_done_callback(functools.partial(_stamp, finished_at, name))
            tasks[name] = task
        skipped: set[str] = set()
        try:
            if tasks and settle is not None:
                skipped = await self._wait_settling(tasks, started + wait_s, settle)
            elif tasks:
                await asyncio.wait(tasks.values(), timeout=wait_s)
        except asyncio.CancelledError:
            # The call itself was cancelled: take every leg down with it, then re-raise
            # (legs already done too: their errors are retrieved there).
            self._abandon(tasks.values())
            raise
        now = time.perf_counter()
        if any(not t.done() and name not in skipped for name, t in tasks.items()):
            # Woken by the timeout: how late was the loop?
            late_s = max(0.0, now - started - wait_s)
            self._lateness_s += self.LATENESS_ALPHA * (late_s - self._lateness_s)
        else:
            # Nothing to measure; let the estimate fade once the loop is no longer late.
            self._lateness_s *= 1 - self.LATENESS_ALPHA
        results: dict[str, LegResult[T]] = {}
        for name, task in tasks.items():
            elapsed_ms = (finished_at.get(name, now) - started) * 1000
            if name in skipped and not task.done():
                results[name] = LegResult(name, None, None, False, elapsed_ms, skipped=True)
                continue
            if not task.done() or task.cancelled():
                results[name] = LegResult(name, None, None, True, elapsed_ms)
                continue
            error = task.exception()
            if error is None:
                results[name] = LegResult(name, task.result(), None, False, elapsed_ms)
            else:
                results[name] = LegResult(name, None, error, False, elapsed_ms)
        self._abandon(t for t in tasks.values() if not t.done())
        return results

    @staticmethod
    async def _wait_settling(
        tasks: Mapping[str, asyncio.Task[T]],
        deadline: float,
        settle: Callable[[str, T], Collection[str]],
    ) -> set[str]:
        """Wait leg by leg until every leg finished, or is no longer needed, or the deadline;
        the names of the legs found unnecessary."""
        names = {task: name for name, task in tasks.items()}
        pending = set(tasks.values())
        skipped: set[str] = set()
        while pending:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            done, pending = await asyncio.wait(
                pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                break
            for task in done:
                if not task.cancelled() and task.exception() is None:
                    skipped.update(settle(names[task], task.result()))
            pending = {task for task in pending if names[task] not in skipped}
        return skipped

    def _abandon(self, tasks: Iterable[asyncio.Task[Any]]) -> None:
        """Cancel ``tasks`` and hold them until they end; every error is retrieved (an error
        nobody retrieves is logged by asyncio as "Task exception was never retrieved")."""
        for task in tasks:
            if task.done():
                self._reap(task)
                continue
            task.cancel()
            self._stragglers.add(task)
            task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._stragglers.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("a cancelled leg ended with %s", type(task.exception()).__name__)

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for cancelled legs to give their connections back; for shutdown."""
        if self._stragglers:
            await asyncio.wait(list(self._stragglers), timeout=timeout_s)
