"""How busy the machine's CPUs are, sampled by a timer: the signal of a saturated machine.

Each serving process sees only its own event loop's lateness. With several processes (`serve
--processes`), PostgreSQL and a client on the same cores, every loop can look healthy while
the machine as a whole has no CPU left: the answers then leave late from all of them at once,
and calls wait unread in gRPC's queue until their deadline passes. The machine's busy share is
the one signal they all see. Every ``interval_s`` the timer reads the CPU times (psutil:
/proc/stat on Linux, the platform's counters elsewhere); ``busy`` is the share of CPU time
not idle over the last ``window`` intervals, summed over all CPUs. Twenty reads a second
cost a few tens of microseconds each.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import psutil

# The CPU time fields that count as not busy (the rest: user, system, irq, steal...).
_IDLE_FIELDS = ("idle", "iowait")


def _busy_and_total(times: Any) -> tuple[float, float]:
    fields = times._asdict()
    total = float(sum(fields.values()))
    idle = float(sum(fields.get(name, 0.0) for name in _IDLE_FIELDS))
    return total - idle, total


class CpuBusy:
    """The machine's CPU busy share (0..1) over the last few intervals; ``start`` and
    ``stop`` it on the running loop. ``samples`` counts the intervals measured, so a reader
    can act once per new measurement."""

    def __init__(
        self,
        *,
        interval_s: float = 0.05,
        window: int = 2,
        read: Callable[[], Any] = psutil.cpu_times,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._interval_s = interval_s
        self._read = read
        self._readings: deque[tuple[float, float]] = deque(maxlen=window + 1)
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.busy = 0.0
        self.samples = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.sample()
        self._handle = self._loop.call_later(self._interval_s, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def sample(self) -> None:
        """Read the CPU times now and update ``busy`` (the timer calls this)."""
        self._readings.append(_busy_and_total(self._read()))
        if len(self._readings) > 1:
            (busy0, total0), (busy1, total1) = self._readings[0], self._readings[-1]
            elapsed = total1 - total0
            if elapsed > 0:
                self.busy = min(1.0, max(0.0, (busy1 - busy0) / elapsed))
                self.samples += 1

    def _tick(self) -> None:
        assert self._loop is not None
        self.sample()
        self._handle = self._loop.call_later(self._interval_s, self._tick)
