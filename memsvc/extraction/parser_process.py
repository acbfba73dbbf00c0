"""Extraction's CPU-bound parse in processes of their own, served fairly across tenants.

spaCy holds the GIL for most of the ~10 ms it spends on an utterance. Run in a thread of the
serving process, it starved the event loop: with in-process workers busy, Ingest's
acknowledgement took p50 245 ms and p99 785 ms (bench/ingest.py, "workers on") against 17 and
36 ms with the regex extractor. So parsing runs in child processes, started on first use with
`spawn` (the serving process has threads, so it must not fork); each loads the model once.

With one parser, one tenant's flood of large jobs kept it busy all the time, and another
tenant's one-line parse waited behind whatever was in hand: 3-6 s for one 8,000-character
turn on a busy 2-core machine (issue 31). Now there are ``processes`` parsers
(MEMSVC_PARSER_PROCESSES), each given one request at a time, and the requests waiting are
taken in a fair order (concurrency.fair_queue: the tenant with the fewest parses in hand
first, then its user likewise), never first come first served. A request's owner is the
job's (tenant, user) (concurrency.owner). The bound: a parse starts as soon as a parser is
free and no party ranking before it waits; a parser is held for one chunk at a time
(rules.PARSE_CHUNK_CHARS, or one turn). With the default worker settings a tenant has one
job, so one parse, in hand per process: another tenant's parse finds the second parser free.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import multiprocessing
import os
import signal
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

from memsvc.concurrency.fair_queue import FairQueue
from memsvc.concurrency.owner import Owner, current_owner
from memsvc.extraction.base import ExtractionError

_In = TypeVar("_In")
_Out = TypeVar("_Out")

DEFAULT_PROCESSES = 2
# Niceness of the parser processes: on a small machine the kernel gives the cores to the
# serving process (Recall, Ingest's acknowledgement) and the database first, as for the
# background embedder's threads.
PARSER_NICENESS = 10


def _start_parser() -> None:
    """Runs first in each parser process. Ctrl-C reaches the whole process group: the
    serving process shuts down and ends its parsers, which would only print a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):  # not permitted: it parses at the parent's priority
        os.nice(PARSER_NICENESS)


@dataclass(eq=False)
class _Request:
    fn: Callable[[Any], Any]
    arg: Any
    result: Future[Any] = field(default_factory=Future)


class ParserPool:
    """``processes`` parser processes, each with one request at most, fed from a FairQueue.

    Thread-safe: requests come from event loops, results land on the executors' threads.
    """

    def __init__(self, processes: int) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self._lock = threading.RLock()
        self._queue: FairQueue[_Request] = FairQueue()
        self._parsers: list[ProcessPoolExecutor | None] = [None] * processes
        # Free parsers, the one free longest first: sequential parses visit them all, so
        # every parser has loaded its model before a burst needs it.
        self._free: deque[int] = deque(range(processes))
        self._closed = False

    @property
    def processes(self) -> int:
        return len(self._parsers)

    def submit(self, fn: Callable[[_In], _Out], arg: _In, owner: Owner) -> Future[_Out]:
        request = _Request(fn, arg)
        with self._lock:
            if self._closed:
                raise ExtractionError("the parser processes are stopped")
            self._queue.push(request, *owner)
            self._dispatch()
        return request.result

    def _dispatch(self) -> None:
        """Give free parsers the next requests in the fair order (under the lock)."""
        while self._free:
            # A request whose caller gave up while it waited (its job cancelled) is dropped.
            taken = self._queue.pop(skip=lambda r: not r.result.set_running_or_notify_cancel())
            if taken is None:
                return
            request, tenant, user = taken
            slot = self._free.popleft()
            parser = self._parsers[slot]
            if parser is None:
                parser = self._parsers[slot] = ProcessPoolExecutor(
                    max_workers=1,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_parser,
                )
            try:
                running = parser.submit(request.fn, request.arg)
            except RuntimeError as exc:  # broken, or shut down by a death seen meanwhile
                self._finish(slot, parser, tenant, user, request, BrokenProcessPool(str(exc)))
                continue
            running.add_done_callback(
                functools.partial(self._ended, slot, parser, tenant, user, request)
            )

    def _ended(
        self,
        slot: int,
        parser: ProcessPoolExecutor,
        tenant: str,
        user: str,
        request: _Request,
        running: Future[Any],
    ) -> None:
        exc = running.exception()
        with self._lock:
            self._finish(slot, parser, tenant, user, request, exc)
            self._dispatch()
        if exc is None:
            request.result.set_result(running.result())

    def _finish(
        self,
        slot: int,
        parser: ProcessPoolExecutor,
        tenant: str,
        user: str,
        request: _Request,
        exc: BaseException | None,
    ) -> None:
        """The request is out of hand and its parser free again (under the lock); a parser
        that died is replaced at its next request."""
        self._queue.done(tenant, user)
        if isinstance(exc, BrokenProcessPool) and self._parsers[slot] is parser:
            self._parsers[slot] = None
            parser.shutdown(wait=False, cancel_futures=True)
        if not self._closed:
            self._free.append(slot)
        if exc is not None:
            request.result.set_exception(exc)

    def stop(self) -> None:
        """End every parser process now; what they parse and what waits fails."""
        with self._lock:
            self._closed = True
            parsers = [p for p in self._parsers if p is not None]
            self._parsers = [None] * len(self._parsers)
            self._free.clear()
            while (taken := self._queue.pop()) is not None:
                request, tenant, user = taken
                self._queue.done(tenant, user)
                if request.result.set_running_or_notify_cancel():
                    request.result.set_exception(ExtractionError("the parser stopped"))
        for parser in parsers:
            # The pool's processes: Python 3.14 has ProcessPoolExecutor.terminate_workers().
            processes = list((parser._processes or {}).values())
            parser.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                process.terminate()

    def running(self) -> list[BaseProcess]:
        """The parser processes started and not ended by stop() (tests)."""
        with self._lock:
            return [
                process
                for parser in self._parsers
                if parser is not None
                for process in (parser._processes or {}).values()
            ]


_pool: ParserPool | None = None
_processes = DEFAULT_PROCESSES
_pool_lock = threading.Lock()


def configure(processes: int) -> None:
    """The number of parser processes of this process (MEMSVC_PARSER_PROCESSES), from its
    next start; called once at start-up, before any parse."""
    global _processes
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    with _pool_lock:
        _processes = processes


def _parser_pool() -> ParserPool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ParserPool(_processes)
        return _pool


async def parse_elsewhere(fn: Callable[[_In], _Out], arg: _In) -> _Out:
    """`fn(arg)` in a parser process (a module-level function and picklable values), in its
    fair turn for the current job's owner (concurrency.owner). A parser process that died is
    replaced for the next call; this one fails as ExtractionError (the job is retried).
    Cancelled while it waits, the request is dropped; in hand, its chunk runs to its end."""
    future = _parser_pool().submit(fn, arg, current_owner())
    try:
        return await asyncio.wrap_future(future)
    except BrokenProcessPool as exc:
        raise ExtractionError("the parser process died") from exc


def stop() -> None:
    """End the parser processes now, for a process that is exiting: what they are parsing
    is abandoned (the job's lease ends and another worker retries it). Without this the
    interpreter's exit waits for the parse in hand, and for the parser's start (the spaCy
    model and lemminflect's tables, seconds on a busy machine), past the shutdown's grace."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.stop()
