"""Retry policy: which codes are retried, and how long to wait before the next attempt."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import grpc

from memsvc.concurrency.backoff import backoff_delay

RETRY_AFTER_KEY = "retry-after-ms"


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter. Only reads and Ingest (idempotency key) use it."""

    max_attempts: int = 3
    initial_backoff_ms: float = 25.0
    max_backoff_ms: float = 1000.0
    multiplier: float = 2.0
    #: Fraction of the delay drawn at random (0.2: 80% to 100% of the computed delay; 1.0:
    #: full jitter, anywhere below it). memsvc.concurrency.backoff computes it.
    jitter: float = 0.2
    retryable: frozenset[grpc.StatusCode] = field(
        default=frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
    )


def backoff_ms(
    policy: RetryPolicy, attempt: int, random_unit: float, retry_after_ms: float | None
) -> float:
    """Delay before attempt ``attempt + 1`` (``attempt`` is 1-based); ``random_unit`` in [0, 1).

    A server's retry hint wins when it asks for longer than the backoff: retrying sooner
    would only be refused again.
    """
    delay = backoff_delay(
        attempt,
        base=policy.initial_backoff_ms,
        cap=policy.max_backoff_ms,
        multiplier=policy.multiplier,
        jitter=policy.jitter,
        random_unit=random_unit,
    )
    if retry_after_ms is not None:
        delay = max(delay, retry_after_ms)
    return delay


def retry_after_ms(trailing: Iterable[object] | None) -> float | None:
    """The server's `retry-after-ms` trailer, when present and well formed.

    Takes any iterable of (key, value) pairs: grpc.aio.Metadata at run time, typed as a
    tuple of metadata entries by grpc-stubs.
    """
    if trailing is None:
        return None
    for entry in trailing:
        if not (isinstance(entry, tuple) and len(entry) == 2 and entry[0] == RETRY_AFTER_KEY):
            continue
        value = entry[1]
        text = value.decode() if isinstance(value, bytes) else str(value)
        try:
            ms = float(text)
        except ValueError:
            return None
        return ms if ms >= 0 else None
    return None
