"""The read gate: refuse a read at once, with a retry hint, instead of queueing it past its
deadline.

A cap on Recall + Prefetch in flight in this process, past which a read is shed rather than
left to answer late; the cap shrinks while the machine's CPUs are saturated (the load's
``cpu``), whoever saturates them; and while the oldest call queued in gRPC's core in front of
the handlers (the load's ``queue``) has waited longer than ``MEMSVC_READS_MAX_QUEUE_MS``,
reads are refused until the queue is short again (Recall stops embedding its queries at a
shorter wait, ``MEMSVC_READS_DEGRADE_QUEUE_MS``, so this is the last resort).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from memsvc.errors import DeadlineExceeded, Overloaded
from memsvc.observability import tracing
from memsvc.overload import shed_log
from memsvc.overload.load import Load

# Retry hint when a cap on calls in flight is reached: a slot frees as soon as one of those
# calls ends (reads within their deadline, typically tens of ms), so a short pause is enough
# and still spreads retries out.
IN_FLIGHT_RETRY_AFTER_S = 0.1


class InFlightLimit:
    """A non-blocking counter of reads in progress, which also refuses a read that would
    wait longer than its deadline allows.

    A read that waited for a slot would spend its own deadline queueing and then answer
    late; refusing immediately (RESOURCE_EXHAUSTED, retryable) keeps every admitted call
    inside its deadline when the offered load exceeds what two cores can serve.

    Two gates. A fixed cap (``limit``). And a queue gate, from two moving averages over the
    reads that completed lately: how long they took (``latency_s``) and how many reads were
    already running when each was admitted (``ahead``). A read admitted behind ``n`` others
    is expected to take ``latency_s * (n + 1) / (ahead + 1)``: when reads share the CPU
    their time grows with the reads beside them, and when they overlap (waiting on a disk or
    a remote database) the ratio stays near one. When that exceeds ``queue_share`` of the
    read's budget it is refused at once. A voice call's 200 ms then joins a short queue and
    gets full results, instead of a long one where it would answer degraded, or late; a
    chat call's 800 ms may join a queue four times deeper.

    And a gate on the queue before the handlers (the load's ``queue``; off when its
    ``refuse_queue_s`` is 0): while its oldest call has waited longer, every read is refused at
    once. Those are the calls at the head of the queue, already late by that much; refusing
    one costs the loop about half of the cheapest answer, so the queue drains and no call
    waits past its deadline there. Alone it would refuse far too much (an embedding per call
    keeps the loop saturated: once the queue is short the calls behind are admitted together
    and it fills again); with Recall answering from its lexical leg alone from a shorter wait
    on (retrieval/recall.py), it only catches what even that cannot drain (docs/read-path.md).
    """

    # Weight of the newest read in the moving averages.
    ALPHA = 0.1
    # The machine gate (``cpu``): each measurement that finds the machine's CPUs busier than
    # ``max_cpu_busy`` multiplies the cap by CPU_DECREASE, down to MIN_CAP; each one that
    # does not adds a read back, up to ``limit``, if the reads in flight reached the cap
    # since the measurement before (additive increase, multiplicative decrease: every
    # serving process sees the same machine and backs off with the others). A cap that no
    # read reached says nothing about what the machine can take more of, so it does not
    # grow (TCP's congestion window validation, RFC 7661): it starts at START_CAP, and after
    # a quiet spell stays where the last busy one left it, so a burst arriving at once meets
    # that cap and not ``limit`` while the CPU measure (50-100 ms behind) catches up.
    # Measured on 2 cores, two serving processes, 4x and 8x the capacity (docs/read-path.md):
    # a floor of 2 refused a third of the calls at 4x (the machine is saturated there, and
    # the reads a loop takes in one pass arrive together); 4 answers 80%, and starting at 8
    # instead of ``limit`` took the burst's first tenth of a second from tens of calls past
    # their deadline to none or a few.
    CPU_DECREASE = 0.8
    MIN_CAP = 4
    START_CAP = 8

    def __init__(
        self,
        limit: int,
        *,
        queue_share: float = 0.4,
        clock: Callable[[], float] = time.monotonic,
        load: Load | None = None,
    ) -> None:
        """``load``: the machine gate reads its ``cpu`` (past ``max_cpu_busy``) and the
        queue gate its ``queue`` (past ``refuse_queue_s``); without it, neither gate."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if not 0.0 < queue_share <= 1.0:
            raise ValueError(f"queue_share must be in (0, 1], got {queue_share}")
        self._limit = limit
        self._queue_share = queue_share
        self._clock = clock
        self._in_flight = 0
        self._latency_s = 0.0
        self._ahead = 0.0
        self._seen = False
        load = load if load is not None else Load()
        self._cpu = load.cpu
        self._max_cpu_busy = load.limits.max_cpu_busy
        # Without the machine gate the cap is ``limit`` and never moves.
        self._cap = float(min(limit, self.START_CAP) if self._cpu is not None else limit)
        self._cap_reached = False
        self._cpu_samples = 0
        self._max_queue_s = load.limits.refuse_queue_s
        self._core_queue = load.queue if self._max_queue_s > 0 else None

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def cap(self) -> int:
        """Reads admitted at a time now: ``limit``, less while the machine is saturated."""
        self._adapt_cap()
        return max(self.MIN_CAP, min(self._limit, int(self._cap)))

    def _adapt_cap(self) -> None:
        cpu = self._cpu
        if cpu is None or cpu.samples == self._cpu_samples:
            return
        # Read lazily, on a read's arrival: the measurements since the last read count as
        # many like the newest (only its busy share is kept).
        missed = cpu.samples - self._cpu_samples
        self._cpu_samples = cpu.samples
        if cpu.busy > self._max_cpu_busy:
            self._cap = max(float(self.MIN_CAP), self._cap * self.CPU_DECREASE**missed)
        elif self._cap_reached:
            # One read more, however many measurements passed: reaching the cap once says
            # nothing of the measurements between.
            self._cap = min(float(self._limit), self._cap + 1)
        self._cap_reached = False

    @property
    def latency_s(self) -> float:
        """Average duration of the last reads (0 until one completed)."""
        return self._latency_s

    @property
    def ahead(self) -> float:
        """Average number of reads already running when the last reads were admitted."""
        return self._ahead

    def expected_s(self, ahead: int | None = None) -> float:
        """How long a read admitted now (behind ``ahead`` others, by default the reads in
        flight) would take, about; 0 before any read completed."""
        n = self._in_flight if ahead is None else ahead
        return self._latency_s * (n + 1) / (self._ahead + 1)

    def refusal(self) -> Overloaded | None:
        """The gates that need nothing of the call (the queue in front of the handlers, the
        fixed limit, the machine's cap): the error to refuse a read arriving now with, or
        None. The servicer asks before it authenticates or validates anything, so a refusal
        costs the saturated loop least; :meth:`slot` asks again."""
        if self._core_queue is not None:
            waited_s = self._core_queue.wait_s()
            if waited_s > self._max_queue_s:
                return _shed(
                    f"this server is saturated: calls wait {waited_s * 1000:.0f} ms in its "
                    f"queue before a handler takes them ({self._core_queue.waiting} waiting)"
                )
        ahead = self._in_flight
        if ahead >= self._limit:
            return _shed(f"more than {self._limit} reads in flight on this server")
        cap = self.cap
        if ahead + 1 >= cap:
            self._cap_reached = True  # this read fills the cap, or finds it full
        if ahead >= cap:
            busy = self._cpu.busy if self._cpu is not None else 0.0
            return _shed(
                f"this machine's CPUs are saturated ({busy:.0%} busy): this server takes "
                f"{cap} reads at a time until they are not"
            )
        return None

    @contextmanager
    def slot(
        self, budget_s: float | None = None, *, floor_s: float | None = None
    ) -> Iterator[None]:
        """Hold a slot for the block; ResourceExhausted at once when :meth:`refusal` says
        so, or when a read admitted now would not finish within ``queue_share`` of
        ``budget_s``; DeadlineExceeded naming the deadline when no other read is in flight
        and even the cheapest answer does not fit (the deadline is too short, the server is
        not busy).

        ``floor_s``: a read that degrades by itself (Recall answers from its lexical leg
        alone when the embedder is busy) says how long its cheapest answer takes now; it is
        refused only when that does not fit, instead of by the queue model, which counts the
        reads waiting for the embedder as if each had to be waited for."""
        with tracing.span("memsvc.admission.read"):
            ahead = self._admit_read(budget_s, floor_s)
        started = self._clock()
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1
            self._completed(ahead, self._clock() - started)

    def _admit_read(self, budget_s: float | None, floor_s: float | None) -> int:
        """Raise the refusal a read meets now, if any; the reads ahead of it."""
        refused = self.refusal()
        if refused is not None:
            raise refused
        ahead = self._in_flight
        if budget_s is not None and floor_s is not None:
            if floor_s > self._queue_share * budget_s and not ahead:
                # No other read in flight: the deadline is what is short, not the server.
                raise DeadlineExceeded(
                    f"deadline: {budget_s * 1000:.0f} ms left for this read, and even its"
                    f" degraded answer takes about {floor_s * 1000:.0f} ms now; send a"
                    " longer deadline"
                )
            if floor_s > self._queue_share * budget_s:
                raise _shed(
                    f"this server is busy: even a degraded answer would take about "
                    f"{floor_s * 1000:.0f} ms now, too close to its deadline "
                    f"({budget_s * 1000:.0f} ms left)"
                )
        elif budget_s is not None and ahead:
            expected_s = self.expected_s(ahead)
            if expected_s > self._queue_share * budget_s:
                raise _shed(
                    f"this server is busy: a read admitted now would take about "
                    f"{expected_s * 1000:.0f} ms ({ahead} ahead of it), too close to its "
                    f"deadline ({budget_s * 1000:.0f} ms left)"
                )
        return ahead

    def _completed(self, ahead: int, took_s: float) -> None:
        alpha = self.ALPHA if self._seen else 1.0
        self._seen = True
        self._latency_s += alpha * (took_s - self._latency_s)
        self._ahead += alpha * (ahead - self._ahead)


def _shed(why: str) -> Overloaded:
    """A read refused at once (counted, summarized in the log), with the retry hint."""
    return shed_log.refused(why, retry_after_s=IN_FLIGHT_RETRY_AFTER_S)
