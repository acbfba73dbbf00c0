"""One shrinking time budget per call, handed down instead of restarting a timer per layer."""

from __future__ import annotations

import time


class Budget:
    """Seconds left until the caller's deadline, minus the margin kept to answer."""

    __slots__ = ("_deadline",)

    def __init__(self, seconds: float) -> None:
        self._deadline = time.monotonic() + max(0.0, seconds)

    @classmethod
    def from_remaining(
        cls, time_remaining_s: float | None, *, default_ms: int, margin_ms: int
    ) -> Budget:
        """From grpc's context.time_remaining() (None when the caller set no deadline)."""
        total = default_ms / 1000 if time_remaining_s is None else time_remaining_s
        return cls(total - margin_ms / 1000)

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self._deadline - time.monotonic())

    def cap(self, limit_s: float) -> float:
        """The smaller of the remaining budget and a per-step limit."""
        return min(self.remaining(), limit_s)

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0.0
