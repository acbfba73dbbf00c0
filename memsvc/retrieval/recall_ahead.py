"""Recall ahead of the final transcript: work on a stream's interims, answer its final from it.

A voice gateway hears the user's words as interim transcripts long before the final one. Each
interim is recalled ahead (embedding and both legs, the same read as Recall's), so that when
the final transcript arrives it is usually the text of an answer already computed: the answer
is then that one, and equal to a Recall of the final text. Only the newest work can be used
(the final must be the same text), so at most one attempt runs per stream: a newer interim
cancels it (its text is no longer what was heard: a prefix of it, or a word the transcriber
revised), while the last finished answer is kept as long as its text is still a prefix of
what was heard, since the final often stops right there. Vectors already computed stay in the
query embedder's cache, so a text heard twice is embedded once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from memsvc.concurrency.deadline import Budget
from memsvc.observability import metrics
from memsvc.retrieval.query import RecallQuery
from memsvc.retrieval.recall import RecallResult, RecallService

log = logging.getLogger(__name__)

# An answer computed ahead is used for a final arriving at most this long after it was
# computed; older, the final is recalled afresh (writes since then would be missing). Finals
# come a few hundred ms after the last interim (the transcriber's end-of-speech wait).
MAX_REUSE_AGE_S = 5.0

# Runs one attempt ahead under the server's gates; None when they refuse (or it fails): work
# ahead is optional and never fails the stream.
RunAhead = Callable[[RecallQuery, Budget], Coroutine[Any, Any, RecallResult | None]]


@dataclass
class _Attempt:
    query: RecallQuery
    task: asyncio.Task[RecallResult | None]


@dataclass(frozen=True)
class _Done:
    text: str
    result: RecallResult
    at: float


class RecallAhead:
    """One stream's work ahead. Not shared between streams; lives on the event loop.

    ``budget_s``: each attempt's budget, the one a final gets, so that an attempt makes the
    choices a Recall of the same text under the same deadline makes (the voice leg policy
    depends on it) and its answer is that Recall's answer.
    """

    def __init__(self, service: RecallService, run_ahead: RunAhead, *, budget_s: float) -> None:
        self._service = service
        self._run_ahead = run_ahead
        self._budget_s = budget_s
        self._running: _Attempt | None = None
        self._done: _Done | None = None

    def interim(self, query: RecallQuery) -> None:
        """Work ahead on ``query`` (an interim transcript), dropping work it made useless."""
        if self._done is not None and not query.text.startswith(self._done.text):
            self._done = None
        running = self._running
        if running is None and self._done is not None and self._done.text == query.text:
            # The same words again (a transcriber repeats an unchanged interim): answered.
            return
        if running is not None and not running.task.done():
            if running.query.text == query.text:
                return
            running.task.cancel()
            metrics.RECALL_AHEAD.labels("cancelled").inc()
        self._start(query)

    def _start(self, query: RecallQuery) -> None:
        task = asyncio.create_task(
            self._run_ahead(query, Budget(self._budget_s)), name="recall-ahead"
        )
        attempt = _Attempt(query, task)
        self._running = attempt
        task.add_done_callback(lambda t: self._finished(attempt, t))

    def _finished(self, attempt: _Attempt, task: asyncio.Task[RecallResult | None]) -> None:
        if self._running is attempt:
            self._running = None
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.warning("recall ahead failed: %s", type(error).__name__)
            return
        result = task.result()
        if result is not None and not result.degraded:
            self._done = _Done(attempt.query.text, result, time.monotonic())

    async def final(self, query: RecallQuery, budget: Budget) -> RecallResult:
        """The answer to the final transcript ``query``, within ``budget``: the answer
        computed ahead for this very text when there is one (awaited if still running),
        otherwise a Recall now. Work for other texts is cancelled either way."""
        done = self._done
        self._done = None
        running = self._running
        if (
            done is not None
            and done.text == query.text
            and time.monotonic() - done.at <= MAX_REUSE_AGE_S
        ):
            await self._cancel_running()
            return self._reused(query, done.result, "ready")
        if running is not None and running.query.text == query.text:
            # Begun earlier with the same budget, it ends before a Recall begun now would.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(budget.remaining()):
                    result = await asyncio.shield(running.task)
                    if result is not None and not result.degraded:
                        return self._reused(query, result, "awaited")
        await self._cancel_running()
        metrics.RECALL_AHEAD.labels("missed").inc()
        return await self._service.recall(query, budget)

    def _reused(self, query: RecallQuery, result: RecallResult, how: str) -> RecallResult:
        metrics.RECALL_AHEAD.labels(how).inc()
        self._service.record_references(query, result)
        return result

    async def _cancel_running(self) -> None:
        running, self._running = self._running, None
        if running is not None and not running.task.done():
            running.task.cancel()
            metrics.RECALL_AHEAD.labels("cancelled").inc()
            # wait(), not the task itself: a cancellation of this caller still propagates.
            await asyncio.wait({running.task})

    async def aclose(self) -> None:
        """Stop whatever still runs (the stream ended)."""
        self._done = None
        await self._cancel_running()
