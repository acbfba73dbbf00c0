"""Load shedding for reads: past a number in flight, refuse at once instead of queueing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from memsvc import metrics
from memsvc.errors import ResourceExhausted


class InFlightLimit:
    """A non-blocking counter of calls in progress.

    A read that waited for a slot would spend its own deadline queueing and then answer
    late; refusing immediately (RESOURCE_EXHAUSTED, retryable) keeps every admitted call
    inside its deadline when the offered load exceeds what two cores can serve.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self._limit = limit
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @contextmanager
    def slot(self) -> Iterator[None]:
        if self._in_flight >= self._limit:
            metrics.READS_SHED.inc()
            raise ResourceExhausted(
                f"more than {self._limit} reads in flight on this server; retry shortly"
            )
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1
