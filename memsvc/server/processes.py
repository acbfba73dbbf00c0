"""Many serving processes on one port: a parent that starts N memsvc servers and stops them.

Python serves from one core per process (one event loop, the GIL), so a machine's other cores
help a single memsvc only through its database and embedder threads. ``memsvc serve
--processes N`` starts N whole servers (each its own event loop, pools, embedder and cache
client), every one bound to the same port with SO_REUSEPORT: the kernel hands each new
connection to one of them. It spreads connections, not calls, so a client uses all N
processes only over several connections (memsvc.client's ``channels``; a gateway fleet does
so by itself).

The parent holds no connection and serves nothing. Before any child starts it migrates the
database once (children then find it current). The first child also runs what must not run N
times over on one machine: the extraction workers (when configured) and the packet warmer.
Child ``i`` serves metrics on the configured port + ``i`` (``0``: each takes a free one).

Children start with the ``spawn`` method (a fresh interpreter each: gRPC's core does not
survive ``fork``). A child that dies after it served is started again after a pause (1 s,
doubling to 30 s while it keeps dying); one that dies before it ever served means its
configuration cannot work, and the parent stops them all and exits with its code. SIGTERM or
SIGINT to the parent: every child gets SIGTERM and drains within MEMSVC_SHUTDOWN_GRACE_S
(in-flight calls finish, workers hand back their jobs); a child still running
``STOP_EXTRA_S`` after that is killed.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.synchronize
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.context import SpawnProcess
from types import FrameType

from memsvc.config import ConfigError, Settings
from memsvc.embedded.process import pick_free_port
from memsvc.observability import log_format
from memsvc.server.app import MemsvcServer, serve_until_signalled
from memsvc.storage.pool import apply_migrations

log = logging.getLogger(__name__)

# A child still running this long after its grace period is killed.
STOP_EXTRA_S = 10.0
RESTART_MIN_S = 1.0
RESTART_MAX_S = 30.0
# How often the parent looks at its children.
POLL_S = 0.2
# Exit code of the parent when a child could not start.
CHILD_FAILED = 1


@dataclass(frozen=True)
class ChildSpec:
    """What one child runs: its settings (port fixed, workers and warmer only in the first)."""

    index: int
    settings: Settings
    log_level: str
    metrics_any_port_if_taken: bool


def child_settings(settings: Settings, index: int, port: int) -> Settings:
    """The settings of child ``index``: the shared port, its own metrics port, and the
    workers and the packet warmer in child 0 only."""
    metrics_port = settings.metrics_port
    if metrics_port:  # None: off; 0: any free port, each its own
        metrics_port += index
    first = index == 0
    return settings.with_overrides(
        processes=1,
        grpc_port=port,
        metrics_port=metrics_port,
        run_workers=settings.run_workers and first,
        prefetch_warm=settings.prefetch_warm and first,
    )


def _stop_with_the_parent() -> None:
    """SIGTERM to this child (a graceful stop) when its parent is gone: a parent killed
    outright (SIGKILL, the OOM killer) cannot stop its children, which would otherwise serve
    on, and run the workers, with nobody supervising them. multiprocessing's sentinel of the
    parent becomes ready when it exits."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="memsvc-parent-watch", daemon=True).start()


def _child_main(spec: ChildSpec, ready: multiprocessing.synchronize.Event) -> None:
    """A child's whole life (a fresh interpreter): serve until SIGTERM."""
    log_format.configure(spec.log_level, spec.settings.log_format)
    # The parent answers Ctrl-C for everyone: a terminal's SIGINT reaches the whole process
    # group, and the children must drain once, when the parent says so.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _stop_with_the_parent()
    server = MemsvcServer(
        spec.settings,
        reuse_port=True,
        metrics_any_port_if_taken=spec.metrics_any_port_if_taken,
    )
    asyncio.run(serve_until_signalled(server, on_serving=ready.set, signals=(signal.SIGTERM,)))


@dataclass
class _Child:
    spec: ChildSpec
    process: SpawnProcess
    ready: multiprocessing.synchronize.Event
    started_at: float = field(default_factory=time.monotonic)
    restart_pause_s: float = RESTART_MIN_S


class ServingProcesses:
    """The parent of ``count`` serving processes; :meth:`run` blocks until they stopped."""

    def __init__(
        self,
        settings: Settings,
        *,
        log_level: str = "INFO",
        metrics_any_port_if_taken: bool = False,
    ) -> None:
        if settings.processes < 2:
            raise ConfigError("ServingProcesses needs MEMSVC_PROCESSES >= 2")
        self._settings = settings
        self._log_level = log_level
        self._metrics_any_port = metrics_any_port_if_taken
        self._context = multiprocessing.get_context("spawn")
        self._stop = threading.Event()
        self._children: list[_Child] = []
        #: The port every child serves (fixed before the first child starts).
        self.port = 0

    def request_stop(self) -> None:
        """Stop every child (thread- and signal-safe); :meth:`run` then returns."""
        self._stop.set()

    def run(self, *, on_serving: Callable[[int], None] | None = None) -> int:
        """Migrate, start the children, keep them running until a stop is requested; the
        exit code (0, or CHILD_FAILED when a child could not start)."""
        settings = self._settings
        # Once, before any child: N children starting together would queue on the
        # migration lock, each on its own connection.
        asyncio.run(apply_migrations(settings))
        self.port = settings.grpc_port or pick_free_port(settings.grpc_host)
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            self._children = [self._spawn(i) for i in range(settings.processes)]
            code = self._supervise(on_serving)
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return code

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping %d serving processes", signum, len(self._children))
        self._stop.set()

    def _spawn(self, index: int) -> _Child:
        spec = ChildSpec(
            index,
            child_settings(self._settings, index, self.port),
            self._log_level,
            self._metrics_any_port,
        )
        ready = self._context.Event()
        process = self._context.Process(
            target=_child_main, args=(spec, ready), name=f"memsvc-serve-{index}", daemon=False
        )
        process.start()
        return _Child(spec, process, ready)

    def _supervise(self, on_serving: Callable[[int], None] | None) -> int:
        announced = False
        while not self._stop.wait(POLL_S):
            if not announced and all(c.ready.is_set() for c in self._children):
                announced = True
                log.info(
                    "memsvc serving on %s:%d from %d processes",
                    self._settings.grpc_host,
                    self.port,
                    len(self._children),
                )
                if on_serving is not None:
                    on_serving(self.port)
            for i, child in enumerate(self._children):
                if child.process.is_alive():
                    if child.ready.is_set():
                        child.restart_pause_s = RESTART_MIN_S
                    continue
                code = child.process.exitcode
                if not child.ready.is_set():
                    log.error(
                        "serving process %d exited (code %s) before it served; stopping all",
                        i,
                        code,
                    )
                    return CHILD_FAILED
                pause = child.restart_pause_s
                log.error(
                    "serving process %d exited (code %s); starting it again in %.0f s",
                    i,
                    code,
                    pause,
                )
                if self._stop.wait(pause):
                    break
                replacement = self._spawn(i)
                replacement.restart_pause_s = min(RESTART_MAX_S, 2 * pause)
                self._children[i] = replacement
        return 0

    def _stop_all(self) -> None:
        for child in self._children:
            if child.process.is_alive():
                child.process.terminate()  # SIGTERM: drain, then exit
        deadline = time.monotonic() + self._settings.shutdown_grace_s + STOP_EXTRA_S
        for child in self._children:
            child.process.join(max(0.0, deadline - time.monotonic()))
            if child.process.is_alive():
                log.error("serving process %d did not stop in time: killed", child.spec.index)
                child.process.kill()
                child.process.join(5.0)
