"""Extraction's CPU-bound parse in a process of its own, off the serving process's GIL.

spaCy holds the GIL for most of the ~10 ms it spends on an utterance. Run in a thread of the
serving process, it starved the event loop: with in-process workers busy, Ingest's
acknowledgement took p50 245 ms and p99 785 ms (bench/ingest.py, "workers on") against 17 and
36 ms with the regex extractor. One child process, started on first use with `spawn` (the
serving process has threads, so it must not fork), loads the model once and parses every job
of this process; the parent keeps only futures.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from memsvc.extraction.base import ExtractionError

_In = TypeVar("_In")
_Out = TypeVar("_Out")

_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


def _leave_interrupts_to_the_parent() -> None:
    """Ctrl-C reaches the whole process group: the serving process shuts down and ends its
    pool; the parser would only print a KeyboardInterrupt traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _parser_pool() -> ProcessPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_leave_interrupts_to_the_parent,
            )
        return _pool


def _discard(broken: ProcessPoolExecutor) -> None:
    global _pool
    with _pool_lock:
        if _pool is broken:
            _pool = None
    broken.shutdown(wait=False, cancel_futures=True)


async def parse_elsewhere(fn: Callable[[_In], _Out], arg: _In) -> _Out:
    """`fn(arg)` in the parser process (a module-level function and picklable values). A
    parser process that died is replaced for the next call; this one fails as ExtractionError
    (the job is retried)."""
    pool = _parser_pool()
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, arg)
    except BrokenProcessPool as exc:
        _discard(pool)
        raise ExtractionError("the parser process died") from exc


def stop() -> None:
    """End the parser process now, for a process that is exiting: what it is parsing is
    abandoned (the job's lease ends and another worker retries it). Without this the
    interpreter's exit waits for the parse in hand, and for the parser's start (the spaCy model
    and lemminflect's tables, seconds on a busy machine), past the shutdown's grace."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is None:
        return
    # The pool's processes: Python 3.14 has ProcessPoolExecutor.terminate_workers() for this.
    processes = list((pool._processes or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
