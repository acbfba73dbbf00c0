"""Crash or restart an embedded server from the outside, by its pid, as a fault test needs."""

from __future__ import annotations

import os
import signal
import time

from memsvc.embedded.supervisor import ServerSupervisor


def crash(server: ServerSupervisor, timeout_s: float = 10.0) -> None:
    """SIGKILL a running server and its workers (postgres backends), as a crash would."""
    pid = server.pid
    assert pid is not None, "the server is not running"
    # Supervisors start each server as a session leader, so its process group id is its pid.
    os.killpg(pid, signal.SIGKILL)
    # The supervisor owns the child and reaps it in is_running(); SIGKILL cannot be ignored,
    # so this only waits for the kernel to tear the process down.
    deadline = time.monotonic() + timeout_s
    while server.is_running():
        assert time.monotonic() < deadline, f"server {pid} outlived SIGKILL"
        time.sleep(0.01)


def restart(server: ServerSupervisor) -> str:
    """Stop a server the clean way and start it again on the same port; return its URL."""
    server.stop()
    return server.start()
