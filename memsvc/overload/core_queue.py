"""How long calls wait in gRPC's core before a handler takes them, from channelz's counters.

grpc's asyncio server takes the next call of each method from its core once per turn of its
accept loop, which runs once every pass of the event loop or two. On a saturated loop new
calls queue in the core, where no gate in a handler can see or refuse them, and some wait
there past their deadline (DEADLINE_EXCEEDED without any handler having run). The core
counts every call when it arrives (channelz ``callsStarted``); the interceptor counts the
calls handlers took (:meth:`CoreQueue.entered`). Calls leave the core's queue in arrival
order, so the next one a handler takes is arrival number ``taken + died + 1``, where ``died``
counts the calls the core ended before any handler took them (a deadline passed in the queue,
a caller cancelled, an unknown method). Sampling the arrival counter over time dates that
call, so the wait of the queue's head is known: the sojourn time CoDel controls, needing no
service-rate estimate and valid from a burst's first call. ``died`` is set again whenever
the queue is seen empty: arrived, less ended (``callsSucceeded`` + ``callsFailed``), less in
a handler is an upper bound of the queue (a handler that returned before the core sent its
status counts in it), so when that is 0 every call arrived was taken or died.

Recall answers without embedding its query while that wait is over
``MEMSVC_READS_DEGRADE_QUEUE_MS`` (retrieval/recall.py), and the admission gate
(read_gate.py, ``MEMSVC_READS_MAX_QUEUE_MS``) refuses reads at once while it is over
that; the sampling thread runs when either is on.

The counters come from grpc's own channelz (``grpc._cython.cygrpc.channelz_get_server``,
the call grpcio-channelz's servicer makes before turning the JSON into protobuf, which would
double the cost of a read of ~0.2 ms taken every ``interval_s``). With channelz
off (``grpc.enable_channelz`` 0), or a grpc without it, the wait reads 0: Recall does not
degrade and the gate does not refuse on it. ``memsvc_core_queue_wait_seconds`` shows it.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from collections.abc import Callable

from grpc._cython import cygrpc  # type: ignore[attr-defined]

from memsvc.observability import metrics

log = logging.getLogger(__name__)

# (calls arrived, calls ended) of one server, since it started.
Counters = tuple[int, int]


def server_ids() -> set[int]:
    """The channelz ids of this process's gRPC servers (empty when channelz is off)."""
    ids: set[int] = set()
    start = 0
    try:
        while True:
            page = json.loads(cygrpc.channelz_get_servers(start))
            servers = page.get("server") or []
            ids.update(int(s["ref"]["serverId"]) for s in servers)
            if page.get("end", False) or not servers:
                return ids
            start = max(ids) + 1
    except (AttributeError, ValueError, KeyError, cygrpc.InternalError) as exc:
        log.warning("channelz unavailable (%s): gRPC's queue is not measured", exc)
        return set()


def read_counters(server_id: int) -> Counters:
    """Calls the server's core has received and ended, from channelz."""
    data = json.loads(cygrpc.channelz_get_server(server_id))["server"]["data"]
    ended = int(data.get("callsSucceeded", 0)) + int(data.get("callsFailed", 0))
    return int(data.get("callsStarted", 0)), ended


class CoreQueue:
    """The wait of the oldest call queued in gRPC's core for a handler (one server).

    A thread samples the counters every ``interval_s`` (``idle_interval_s`` while nothing
    arrives), so the samples go on while the event loop is stalled, when calls queue the
    most; the loop only reads the latest. A call's arrival is known to the sampling
    interval: the wait reported is its lower bound (from the sample that first counted the
    call), so the gate errs on admitting and Recall on embedding.
    """

    # Samples are kept this long: a call queued longer is reported at least this old.
    HISTORY_S = 2.0

    def __init__(
        self,
        *,
        interval_s: float = 0.01,
        idle_interval_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        read: Callable[[int], Counters] = read_counters,
    ) -> None:
        self._interval_s = interval_s
        self._idle_interval_s = idle_interval_s
        self._clock = clock
        self._read = read
        self._server_id: int | None = None
        self._in_handlers = 0
        self._taken = 0
        self._died = 0
        # Written by the sampling thread only; the loop reads the two floats.
        self._times: list[float] = []
        self._arrived: list[int] = []
        self._waiting = 0
        self._oldest_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, server_id: int) -> None:
        """Measure the server with this channelz id (:func:`server_ids`), from its start."""
        self._server_id = server_id
        self._taken = self._died = 0
        self._forget()

    def _forget(self) -> None:
        """No queue known: what a stopped measure reports (a wait frozen at the last sample
        would grow forever, and degrade or refuse reads on it during a graceful stop)."""
        self._times.clear()
        self._arrived.clear()
        self._waiting = 0
        self._oldest_at = None
        metrics.CORE_QUEUE_WAIT.set(0.0)

    @property
    def watching(self) -> bool:
        return self._server_id is not None

    def start(self) -> None:
        """Sample in a thread until :meth:`stop` (nothing to do when not watching)."""
        if self._server_id is None or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="memsvc-core-queue", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None
        self._forget()

    def entered(self) -> None:
        """A handler started (every method, health and reflection included)."""
        self._in_handlers += 1
        self._taken += 1

    def left(self) -> None:
        """A handler ended."""
        self._in_handlers -= 1

    @property
    def waiting(self) -> int:
        """Calls queued in the core at the last sample."""
        return self._waiting

    def wait_s(self) -> float:
        """How long the oldest queued call has waited by now (0: none was queued at the
        last sample, or not measured)."""
        oldest_at = self._oldest_at
        return 0.0 if oldest_at is None else max(0.0, self._clock() - oldest_at)

    def _run(self) -> None:
        interval = self._interval_s
        while not self._stop.wait(interval):
            before = self._arrived[-1] if self._arrived else -1
            if not self.sample():
                return
            metrics.CORE_QUEUE_WAIT.set(self.wait_s())
            idle = self._waiting == 0 and self._arrived[-1] == before
            interval = self._idle_interval_s if idle else self._interval_s

    def sample(self) -> bool:
        """Read the counters now (the thread calls this); False when they cannot be read
        (the server is gone, or channelz is): the measure is then off."""
        server_id = self._server_id
        if server_id is None:
            return False
        # With the counters, as near the same moment as they can be read.
        taken, in_handlers = self._taken, self._in_handlers
        try:
            arrived, ended = self._read(server_id)
        except (ValueError, KeyError, cygrpc.InternalError) as exc:
            log.info("channelz read failed (%s): gRPC's queue is no longer measured", exc)
            self._server_id = None
            self._oldest_at = None
            self._waiting = 0
            return False
        now = self._clock()
        times, counts = self._times, self._arrived
        times.append(now)
        counts.append(arrived)
        stale = bisect.bisect_left(times, now - self.HISTORY_S)
        if stale:
            del times[:stale]
            del counts[:stale]
        if arrived - ended - in_handlers <= 0:
            self._died = arrived - taken  # the queue is empty
        waiting = arrived - taken - self._died
        self._waiting = max(0, waiting)
        if waiting <= 0:
            self._oldest_at = None
            return True
        first_counted = bisect.bisect_left(counts, arrived - waiting + 1)
        self._oldest_at = times[min(first_counted, len(times) - 1)]
        return True
