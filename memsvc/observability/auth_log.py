"""Failed authentication: counted per call, logged as one summary line at most every 10 s.

A client looping with a wrong or revoked key, or a flood of made-up keys, would otherwise
write a line per call. The count goes to ``memsvc_auth_failures_total`` at once; the log
gets a WARNING on the first failure and then at most one line per ``INTERVAL_S`` with how
many calls were refused since the last line, by reason. Never the key, nor its digest.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from memsvc.observability import metrics

log = logging.getLogger(__name__)

INTERVAL_S = 10.0


class AuthFailureLog:
    """One per Authenticator: ``failed(reason)`` per refused call."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._since: Counter[str] = Counter()
        self._logged_at: float | None = None

    def failed(self, reason: str, *, clock: float | None = None) -> None:
        metrics.AUTH_FAILURES.labels(reason).inc()
        self._since[reason] += 1
        now = time.monotonic() if clock is None else clock
        if self._logged_at is not None and now - self._logged_at < self._interval_s:
            return
        counts = ", ".join(f"{n} {why}" for why, n in sorted(self._since.items()))
        if self._logged_at is None:
            log.warning("refused a call UNAUTHENTICATED (%s)", counts)
        else:
            log.warning(
                "refused %d calls UNAUTHENTICATED in the last %.0f s (%s)",
                sum(self._since.values()),
                now - self._logged_at,
                counts,
            )
        self._since.clear()
        self._logged_at = now
