"""A worker node's crash, for the cluster tests: SIGKILL and start again on its port."""

from __future__ import annotations

import os
import signal
import time

from memsvc.embedded.process import Deadline, child_pids, pid_alive
from tools.clusters.citus import CitusCluster


def kill_worker_node_and_start_it_again(cluster: CitusCluster) -> None:
    """SIGKILL the first worker node's postmaster (its process group, as in a crash), start
    it again on its port once its backends exited (each in a session of its own, they exit
    when they notice; a new postmaster refuses to start while one holds the shared memory),
    and wait until the coordinator reaches it."""
    worker = cluster.workers[0]
    pid = worker.pid
    assert pid is not None
    backends = child_pids(pid)
    os.killpg(pid, signal.SIGKILL)
    gone = Deadline(30)
    while worker.is_running() or any(pid_alive(b) for b in backends):
        assert not gone.expired, "the killed node's backends did not exit"
        time.sleep(0.01)
    worker.start()
    deadline = Deadline(60)
    while True:
        out = cluster.coordinator.psql(
            "SELECT bool_and(success) FROM run_command_on_workers($$SELECT 1$$)", deadline
        )
        if out.strip() == "t" or deadline.expired:
            break
        deadline.sleep(0.5)
    assert out.strip() == "t", "the coordinator does not reach the worker node started again"
