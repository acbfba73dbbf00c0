"""Admission control: refuse at once, with a retry hint, instead of queueing past a deadline.

Two gates. Per tenant, after authentication: a token bucket and a cap on calls in flight, so
one tenant cannot take every slot of the server. Per process, for reads: a cap on Recall +
Prefetch in flight, past which a read is shed rather than left to answer late.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from memsvc import metrics
from memsvc.errors import ResourceExhausted

# Retry hint when a cap on calls in flight is reached: a slot frees as soon as one of those
# calls ends (reads within their deadline, typically tens of ms), so a short pause is enough
# and still spreads retries out.
IN_FLIGHT_RETRY_AFTER_S = 0.1
# Idle tenants' buckets are dropped past this many (a full bucket is the same as none).
MAX_TRACKED_TENANTS = 10_000


class InFlightLimit:
    """A non-blocking counter of reads in progress, which also refuses a read that would
    wait longer than its deadline allows.

    A read that waited for a slot would spend its own deadline queueing and then answer
    late; refusing immediately (RESOURCE_EXHAUSTED, retryable) keeps every admitted call
    inside its deadline when the offered load exceeds what two cores can serve.

    Two gates. A fixed cap (``limit``). And a queue gate: ``pace_s`` is a moving average of
    the time between read completions while reads were running all along (the service time
    of a lone read at light load, one over the throughput when saturated). A read that joins
    ``n`` others finishes after about ``(n + 1) * pace_s``; when that exceeds ``queue_share``
    of its budget it is refused at once. A voice call's 200 ms then joins a short queue and
    gets full results, instead of joining a long one and answering degraded, or late; a
    chat call's 800 ms may join a queue four times deeper.
    """

    # Weight of the newest completion interval in the moving average.
    ALPHA = 0.1

    def __init__(
        self,
        limit: int,
        *,
        queue_share: float = 0.4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if not 0.0 < queue_share <= 1.0:
            raise ValueError(f"queue_share must be in (0, 1], got {queue_share}")
        self._limit = limit
        self._queue_share = queue_share
        self._clock = clock
        self._in_flight = 0
        self._pace_s = 0.0
        # Start of the current busy interval: the last completion, or the admission that
        # ended an idle spell; None while idle.
        self._busy_since: float | None = None

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def pace_s(self) -> float:
        """Average time between read completions while busy (0 until one completed)."""
        return self._pace_s

    def expected_wait_s(self) -> float:
        """When a read admitted now would finish, about."""
        return (self._in_flight + 1) * self._pace_s

    @contextmanager
    def slot(self, budget_s: float | None = None) -> Iterator[None]:
        """Hold a slot for the block; ResourceExhausted at once when the cap is reached, or
        when a read admitted now would not finish within ``queue_share`` of ``budget_s``."""
        if self._in_flight >= self._limit:
            metrics.READS_SHED.inc()
            raise ResourceExhausted(
                f"more than {self._limit} reads in flight on this server; retry shortly",
                retry_after_s=IN_FLIGHT_RETRY_AFTER_S,
            )
        if budget_s is not None and self._in_flight:
            wait_s = self.expected_wait_s()
            if wait_s > self._queue_share * budget_s:
                metrics.READS_SHED.inc()
                raise ResourceExhausted(
                    f"this server is busy: a read admitted now would finish in about "
                    f"{wait_s * 1000:.0f} ms ({self._in_flight} ahead of it), too close to "
                    f"its deadline ({budget_s * 1000:.0f} ms left); retry shortly",
                    retry_after_s=IN_FLIGHT_RETRY_AFTER_S,
                )
        if self._in_flight == 0:
            self._busy_since = self._clock()
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1
            self._completed()

    def _completed(self) -> None:
        now = self._clock()
        if self._busy_since is not None:
            sample = now - self._busy_since
            alpha = self.ALPHA if self._pace_s else 1.0
            self._pace_s += alpha * (sample - self._pace_s)
        self._busy_since = now if self._in_flight else None


@dataclass(frozen=True)
class Bucket:
    """A token bucket's state: tokens available at monotonic time ``at``."""

    tokens: float
    at: float


def take_token(
    bucket: Bucket, now: float, *, rate_per_s: float, burst: float
) -> tuple[Bucket, float]:
    """Refill ``bucket`` up to ``now`` and take one token.

    Returns the new state and 0.0 when a token was taken, or the state (refilled, nothing
    taken) and the seconds until the next token when none was there.
    """
    tokens = min(burst, bucket.tokens + max(0.0, now - bucket.at) * rate_per_s)
    if tokens >= 1.0:
        return Bucket(tokens - 1.0, now), 0.0
    return Bucket(tokens, now), (1.0 - tokens) / rate_per_s


class TenantLimits:
    """Per-tenant token bucket (``rate_per_s`` 0: off) and in-flight cap (``max_in_flight``
    0: off). ``burst`` 0 means one second's worth of calls (at least one)."""

    def __init__(
        self,
        *,
        rate_per_s: float,
        burst: int,
        max_in_flight: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate_per_s < 0 or burst < 0 or max_in_flight < 0:
            raise ValueError("tenant limits must not be negative")
        self._rate_per_s = rate_per_s
        self._burst = float(burst) if burst else max(1.0, rate_per_s)
        self._max_in_flight = max_in_flight
        self._clock = clock
        self._buckets: dict[str, Bucket] = {}
        self._in_flight: dict[str, int] = {}

    def in_flight(self, tenant: str) -> int:
        return self._in_flight.get(tenant, 0)

    @contextmanager
    def admit(self, tenant: str) -> Iterator[None]:
        """Hold one of the tenant's slots for the block; ResourceExhausted (with a retry
        hint) when the tenant is over its rate or has too many calls in flight."""
        in_flight = self._in_flight.get(tenant, 0)
        if self._max_in_flight and in_flight >= self._max_in_flight:
            metrics.TENANT_LIMITED.labels("in_flight").inc()
            raise ResourceExhausted(
                f"more than {self._max_in_flight} calls of this tenant in flight; retry shortly",
                retry_after_s=IN_FLIGHT_RETRY_AFTER_S,
            )
        if self._rate_per_s:
            self._take(tenant)
        self._in_flight[tenant] = in_flight + 1
        try:
            yield
        finally:
            left = self._in_flight[tenant] - 1
            if left:
                self._in_flight[tenant] = left
            else:
                del self._in_flight[tenant]

    def _take(self, tenant: str) -> None:
        now = self._clock()
        bucket = self._buckets.get(tenant) or Bucket(self._burst, now)
        bucket, wait_s = take_token(bucket, now, rate_per_s=self._rate_per_s, burst=self._burst)
        self._buckets[tenant] = bucket
        if len(self._buckets) > MAX_TRACKED_TENANTS:
            self._forget_full(now)
        if wait_s > 0:
            metrics.TENANT_LIMITED.labels("rate").inc()
            raise ResourceExhausted(
                f"this tenant's rate limit ({self._rate_per_s:g} calls/s, bursts of "
                f"{self._burst:g}) is reached; retry in {math.ceil(wait_s * 1000)} ms",
                retry_after_s=wait_s,
            )

    def _forget_full(self, now: float) -> None:
        full = [
            tenant
            for tenant, b in self._buckets.items()
            if b.tokens + (now - b.at) * self._rate_per_s >= self._burst
        ]
        for tenant in full:
            del self._buckets[tenant]
