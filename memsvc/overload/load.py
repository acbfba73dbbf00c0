"""The process's load, as one object: its signals and the rules read off them.

Three signals, each measured by its own module: the event loop's lateness (loop_lag.py), the
machine's CPU share in use (cpu_busy.py) and how long calls wait in gRPC's core before a
handler takes them (core_queue.py). Two rules on them, with the thresholds of
``MEMSVC_READS_*`` (0 turns a rule off):

- **refuse** a read at once (RESOURCE_EXHAUSTED, retryable, with a hint) while the loop lags
  more than ``max_loop_lag_s``: whatever it does, it would answer late. (The read gate,
  read_gate.py, holds the other refusals: its caps, and the queue past ``refuse_queue_s``.)
- **degrade** a read (answer from the lexical leg alone, embedding nothing new) while the
  machine's CPUs are busier than ``max_cpu_busy`` or the queue's oldest call has waited more
  than ``degrade_queue_s``: a cheaper answer comes before refusing anyone.

Services take a :class:`Load` (``Load()`` is an idle one, with no signals); the runtime
builds the process's one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memsvc.config import Settings, from_setting, service_config
from memsvc.overload import shed_log
from memsvc.overload.core_queue import CoreQueue
from memsvc.overload.cpu_busy import CpuBusy
from memsvc.overload.loop_lag import LoopLag

# Retry hint of a read refused for the loop's lag: the lag is measured every 50 ms.
LAG_RETRY_AFTER_S = 0.1


@dataclass(frozen=True)
class LoadLimits:
    """The thresholds of the overload rules (0: that rule is off)."""

    # Reads are refused while the event loop is later than this.
    max_loop_lag_s: float = field(default=0.0, metadata=from_setting("reads_max_loop_lag_ms"))
    # Busier than this machine-wide CPU share, reads embed nothing new and the read gate's
    # cap shrinks.
    max_cpu_busy: float = field(default=0.0, metadata=from_setting("reads_max_cpu_busy"))
    # While the oldest call queued in front of the handlers has waited longer than this,
    # reads embed nothing new ...
    degrade_queue_s: float = field(default=0.0, metadata=from_setting("reads_degrade_queue_ms"))
    # ... and longer than this, every read is refused.
    refuse_queue_s: float = field(default=0.0, metadata=from_setting("reads_max_queue_ms"))

    @classmethod
    def from_settings(cls, settings: Settings) -> LoadLimits:
        return service_config(settings, cls)


class Load:
    """This process's load signals (any may be absent) and the refuse / degrade rules."""

    def __init__(
        self,
        limits: LoadLimits = LoadLimits(),
        *,
        loop_lag: LoopLag | None = None,
        cpu: CpuBusy | None = None,
        queue: CoreQueue | None = None,
    ) -> None:
        self.limits = limits
        self.loop_lag = loop_lag
        # A signal whose rule is off is not read.
        self.cpu = cpu if limits.max_cpu_busy > 0 else None
        self.queue = queue

    @property
    def lag_s(self) -> float:
        """How late the event loop runs now (0 when not measured)."""
        return self.loop_lag.lag_s if self.loop_lag is not None else 0.0

    def admit_read(self) -> None:
        """Overloaded (retryable, with a hint) while the loop lags more than the limit."""
        limit_s = self.limits.max_loop_lag_s
        lag_s = self.lag_s
        if limit_s and lag_s > limit_s:
            raise shed_log.refused(
                f"this server is overloaded (event loop {lag_s * 1000:.0f} ms late)",
                retry_after_s=LAG_RETRY_AFTER_S,
            )

    def saturated(self) -> bool:
        """The machine's CPUs busier than the limit, or calls queued in front of the
        handlers for longer than the degrade limit: reads should spend no new CPU."""
        cpu, queue, limits = self.cpu, self.queue, self.limits
        return (cpu is not None and cpu.busy > limits.max_cpu_busy) or (
            queue is not None
            and limits.degrade_queue_s > 0
            and queue.wait_s() > limits.degrade_queue_s
        )
