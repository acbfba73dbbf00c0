"""Per-tenant admission, after authentication: a token bucket and a cap on calls in flight,
so one tenant cannot take every slot of the server. Refused at once, with a retry hint.
(The per-process read gate, which sheds load, is overload/read_gate.py.)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from memsvc.errors import ResourceExhausted
from memsvc.observability import metrics, tracing
from memsvc.overload.read_gate import IN_FLIGHT_RETRY_AFTER_S

# Idle tenants' buckets are dropped past this many (a full bucket is the same as none).
MAX_TRACKED_TENANTS = 10_000


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
        with tracing.span("memsvc.admission.tenant"):
            in_flight = self._in_flight.get(tenant, 0)
            if self._max_in_flight and in_flight >= self._max_in_flight:
                metrics.TENANT_LIMITED.labels("in_flight").inc()
                raise ResourceExhausted(
                    f"more than {self._max_in_flight} calls of this tenant in flight; "
                    "retry shortly",
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
