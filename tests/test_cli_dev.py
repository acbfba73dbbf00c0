"""`memsvc dev` as users run it: side by side, Ctrl-C stops every child, data survives."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_dev(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSVC_")}
    return subprocess.Popen(
        [sys.executable, "-m", "memsvc", "dev", "--port", str(port), "--data-dir", str(data_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def wait_serving(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                out = proc.stdout.read().decode() if proc.stdout else ""
                pytest.fail(f"memsvc dev exited early ({proc.returncode}):\n{out}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                time.sleep(0.2)
    pytest.fail("memsvc dev did not become ready")


def interrupt(proc: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGINT) -> str:
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()
    return out.decode()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def child_pids(data_dir: Path) -> list[int]:
    pids = [int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])]
    valkey_pid = data_dir / "valkey.pid"
    if valkey_pid.exists():
        pids.append(int(valkey_pid.read_text().strip()))
    return pids


def remember(port: int, content: str) -> str:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        reply = stub.Remember(
            pb.RememberRequest(scope=pb.Scope(user_id="alice"), content=content), timeout=10
        )
        return reply.memory.memory_id


def listed(port: int) -> list[str]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        reply = stub.ListMemories(
            pb.ListMemoriesRequest(scope=pb.Scope(user_id="alice")), timeout=10
        )
        return [m.content for m in reply.memories]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_dev_instances_side_by_side_then_restart(tmp_path: Path) -> None:
    dir_a, dir_b = tmp_path / "a", tmp_path / "b"
    port_a, port_b = free_port(), free_port()
    proc_a, proc_b = start_dev(dir_a, port_a), start_dev(dir_b, port_b)
    try:
        wait_serving(port_a, proc_a)
        wait_serving(port_b, proc_b)
        remember(port_a, "A remembers tea")
        remember(port_b, "B remembers coffee")
        assert listed(port_a) == ["A remembers tea"]
        assert listed(port_b) == ["B remembers coffee"]
        children = child_pids(dir_a)
        assert all(pid_alive(p) for p in children)
    finally:
        out_a = interrupt(proc_a)
        interrupt(proc_b, signal.SIGTERM)
    assert "AUTHENTICATION IS OFF" in out_a
    # Ctrl-C stopped the child servers too.
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in children)

    # A second start on the same data folder reuses it: the memory survived.
    proc_a = start_dev(dir_a, port_a)
    try:
        wait_serving(port_a, proc_a)
        assert listed(port_a) == ["A remembers tea"]
    finally:
        interrupt(proc_a)
