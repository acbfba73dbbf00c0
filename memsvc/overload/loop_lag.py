"""Event-loop lag, measured by a timer (the rule that refuses reads on it: load.py).

When the CPU is saturated every callback runs late, including the ones that finish reads and
send answers: a read admitted then answers after its caller's deadline no matter how its own
legs are budgeted. Admitting fewer reads is the only cure, and the loop's lag is the signal
that says when. Nothing announces lag as an event, so a timer samples it: every
``interval_s`` it checks how late it fired. The lag is the *smallest* lateness of the last
few samples: a saturated loop is late every time, while a single stall (a GC pause, a
blocking call) makes one sample late and must not turn reads away. Twenty wake-ups a second
cost nothing measurable.
"""

from __future__ import annotations

import asyncio
from collections import deque


class LoopLag:
    """Sustained lateness of a periodic timer on the running loop; ``start`` and ``stop`` it."""

    def __init__(self, *, interval_s: float = 0.05, window: int = 4) -> None:
        self._interval_s = interval_s
        self._samples: deque[float] = deque([0.0], maxlen=window)
        self._expected = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def lag_s(self) -> float:
        """How late every one of the last few ticks fired, at least."""
        return min(self._samples)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._schedule()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self) -> None:
        assert self._loop is not None
        self._expected = self._loop.time() + self._interval_s
        self._handle = self._loop.call_at(self._expected, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        self._samples.append(max(0.0, self._loop.time() - self._expected))
        self._schedule()
