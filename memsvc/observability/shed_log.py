"""Reads shed under overload: counted per call, logged as one summary line at most every 10 s.

A saturated server refuses hundreds of reads a second (RESOURCE_EXHAUSTED with a retry hint).
A log line each would flood the log exactly when an operator reads it, and cost the event
loop a few tens of microseconds per refusal when it has none to spare. The count goes to
``memsvc_reads_shed_total`` at once; the log gets a WARNING when shedding starts and then at
most one line per ``INTERVAL_S`` with how many were shed since the last line and the latest
reason. Refusals about one tenant's own quota are not shed load and keep their line per call.
"""

from __future__ import annotations

import logging
import time

from memsvc.errors import Overloaded
from memsvc.observability import metrics

log = logging.getLogger(__name__)

INTERVAL_S = 10.0

_since_logged = 0
_logged_at: float | None = None


def shed(reason: str, *, clock: float | None = None) -> None:
    """Count one read refused at once (``reason``: the refusal's message)."""
    global _since_logged, _logged_at
    metrics.READS_SHED.inc()
    _since_logged += 1
    now = time.monotonic() if clock is None else clock
    if _logged_at is not None and now - _logged_at < INTERVAL_S:
        return
    if _logged_at is None:
        log.warning("shedding reads (RESOURCE_EXHAUSTED, retry hinted): %s", reason)
    else:
        log.warning(
            "shed %d reads in the last %.0f s (RESOURCE_EXHAUSTED, retry hinted); latest: %s",
            _since_logged,
            now - _logged_at,
            reason,
        )
    _since_logged = 0
    _logged_at = now


def refused(why: str, *, retry_after_s: float) -> Overloaded:
    """A read refused at once because of ``why``: counted (:func:`shed`), and the error to
    answer it with, with its retry hint."""
    shed(why)
    return Overloaded(f"{why}; retry shortly", retry_after_s=retry_after_s)


def reset() -> None:
    """Forget the last line (tests)."""
    global _since_logged, _logged_at
    _since_logged = 0
    _logged_at = None
