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


class ShedLog:
    """The count since the last line, and when that line was written."""

    def __init__(self) -> None:
        self._since_logged = 0
        self._logged_at: float | None = None

    def shed(self, reason: str, *, clock: float | None = None) -> None:
        """Count one read refused at once (``reason``: the refusal's message)."""
        metrics.READS_SHED.inc()
        self._since_logged += 1
        now = time.monotonic() if clock is None else clock
        if self._logged_at is not None and now - self._logged_at < INTERVAL_S:
            return
        if self._logged_at is None:
            log.warning("shedding reads (RESOURCE_EXHAUSTED, retry hinted): %s", reason)
        else:
            log.warning(
                "shed %d reads in the last %.0f s (RESOURCE_EXHAUSTED, retry hinted); latest: %s",
                self._since_logged,
                now - self._logged_at,
                reason,
            )
        self._since_logged = 0
        self._logged_at = now


# The process's one log of shed reads (every gate of the process sheds into it).
_shed_log = ShedLog()


def shed(reason: str, *, clock: float | None = None) -> None:
    """Count one read refused at once, in the process's log (:class:`ShedLog`)."""
    _shed_log.shed(reason, clock=clock)


def refused(why: str, *, retry_after_s: float) -> Overloaded:
    """A read refused at once because of ``why``: counted (:func:`shed`), and the error to
    answer it with, with its retry hint."""
    shed(why)
    return Overloaded(f"{why}; retry shortly", retry_after_s=retry_after_s)
