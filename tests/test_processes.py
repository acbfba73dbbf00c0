"""`memsvc serve --processes N`: one port, N servers, connections spread, one SIGTERM stops all."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from memsvc.client import MemoryClient
from memsvc.config import Settings
from memsvc.server.processes import child_settings
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import LOAD_GATES_OFF
from tests.test_cli_dev import free_port, pid_alive, wait_serving

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def serving_children(pid: int) -> list[int]:
    """The parent's children that are memsvc servers (multiprocessing also starts a
    resource tracker)."""
    found = []
    for child in children(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"resource_tracker" not in cmdline:
            found.append(child)
    return found


def start_serve(
    backing_urls: tuple[str, str], port: int, metrics_port: int, processes: int, **env: str
) -> subprocess.Popen[bytes]:
    dsn, url = backing_urls
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSVC_")}
    full_env.update(
        {
            "MEMSVC_PG_DSN": dsn,
            "MEMSVC_REDIS_URL": url,
            "MEMSVC_AUTH_ENABLED": "false",
            "MEMSVC_METRICS_PORT": str(metrics_port),
            "MEMSVC_SHUTDOWN_GRACE_S": "2",
            **{f"MEMSVC_{name.upper()}": str(value) for name, value in LOAD_GATES_OFF.items()},
            **env,
        }
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memsvc",
            "serve",
            "--port",
            str(port),
            "--processes",
            str(processes),
        ],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def recalls_handled(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("memsvc_grpc_server_handled_total{") and 'method="Recall"' in line
    )


def recall_over_connections(port: int, connections: int) -> None:
    """One call on each of ``connections`` separate TCP connections (a local subchannel
    pool: channels with the same target would otherwise share one connection)."""
    for i in range(connections):
        with grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
        ) as channel:
            stub = memory_pb2_grpc.MemoryServiceStub(channel)
            reply = stub.Recall(
                pb.RecallRequest(scope=pb.Scope(user_id=f"spread-{i}"), query="what do I like"),
                timeout=10,
            )
            assert not reply.items


async def client_recalls(port: int, *, channels: int, calls: int) -> None:
    async with MemoryClient(f"127.0.0.1:{port}", channels=channels) as client:
        for i in range(calls):
            request = pb.RecallRequest(scope=pb.Scope(user_id=f"c-{i}"), query="what do I like")
            reply = await client.recall(request, timeout=10)
            assert not reply.items


def test_child_settings_put_the_background_work_in_the_first_child() -> None:
    settings = Settings(processes=3, metrics_port=9500, run_workers=True, prefetch_warm=True)
    first, second = child_settings(settings, 0, 7000), child_settings(settings, 1, 7000)
    assert (first.grpc_port, second.grpc_port) == (7000, 7000)
    assert (first.metrics_port, second.metrics_port) == (9500, 9501)
    assert first.run_workers and first.prefetch_warm
    assert not second.run_workers and not second.prefetch_warm
    assert first.processes == second.processes == 1
    # Metrics off stays off; 0 (any free port) stays 0 for each child.
    assert child_settings(Settings(processes=2, metrics_port=None), 1, 1).metrics_port is None
    assert child_settings(Settings(processes=2, metrics_port=0), 1, 1).metrics_port == 0


def two_serving_children(port: int, proc: subprocess.Popen[bytes]) -> list[int]:
    """The parent's serving children once it serves and both are up (at most 60 s)."""
    wait_serving(port, proc)
    deadline = time.monotonic() + 60
    while len(serving_children(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    return serving_children(proc.pid)


def all_gone(pids: list[int], timeout_s: float = 30) -> bool:
    """Whether every process of ``pids`` has exited within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not any(pid_alive(pid) for pid in pids)


def test_processes_share_one_port_restart_and_stop_together(
    backing_urls: tuple[str, str],
) -> None:
    port, metrics_port = free_port(), free_port()
    proc = start_serve(backing_urls, port, metrics_port, 2)
    servers_seen: list[int] = []
    try:
        servers = two_serving_children(port, proc)
        servers_seen.extend(servers)
        assert len(servers) == 2, servers
        # Both must be ready (each child's metrics port answers once it serves).
        for child_metrics in (metrics_port, metrics_port + 1):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    recalls_handled(child_metrics)
                    break
                except OSError:
                    time.sleep(0.2)
        recall_over_connections(port, 24)
        per_child = [recalls_handled(metrics_port), recalls_handled(metrics_port + 1)]
        assert sum(per_child) == 24
        # The kernel spreads connections: 24 of them all landing on one child is 2**-23.
        assert min(per_child) > 0, per_child

        # memsvc.client spreads its calls the same way once it holds several channels.
        asyncio.run(client_recalls(port, channels=8, calls=16))
        after = [recalls_handled(metrics_port), recalls_handled(metrics_port + 1)]
        gained = [b - a for a, b in zip(per_child, after, strict=True)]
        assert sum(gained) == 16 and min(gained) > 0, gained

        # A child that dies after serving is started again, and the port keeps answering.
        os.kill(servers[1], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = serving_children(proc.pid)
            if len(now) == 2 and servers[1] not in now:
                break
            time.sleep(0.2)
        replaced = serving_children(proc.pid)
        servers_seen.extend(replaced)
        assert len(replaced) == 2 and servers[1] not in replaced, replaced
        wait_serving(port, proc)
        recall_over_connections(port, 4)

        # One SIGTERM to the parent stops every child and the parent exits 0.
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out.decode()
        assert not any(pid_alive(pid) for pid in replaced)
        assert b"Traceback" not in out, out.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        # Children of a parent killed outright stop by themselves (a failed run once left
        # two serving on, with workers, taking the next tests' jobs).
        assert all_gone(servers_seen), servers_seen


def test_children_stop_when_their_parent_is_killed(backing_urls: tuple[str, str]) -> None:
    port = free_port()
    proc = start_serve(backing_urls, port, free_port(), 2)
    try:
        children = two_serving_children(port, proc)
        assert len(children) == 2, children
    finally:
        proc.kill()  # SIGKILL: the parent cannot stop anyone
        proc.communicate()
    assert all_gone(children), children


def test_a_child_that_cannot_start_stops_the_parent(
    backing_urls: tuple[str, str], tmp_path: Path
) -> None:
    # A certificate file that does not exist: every child fails before it serves.
    proc = start_serve(
        backing_urls,
        free_port(),
        free_port(),
        2,
        MEMSVC_TLS_CERT_FILE=str(tmp_path / "missing.pem"),
        MEMSVC_TLS_KEY_FILE=str(tmp_path / "missing.key"),
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out.decode()
    assert b"before it served" in out, out.decode()


def test_processes_out_of_range_is_a_configuration_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "memsvc", "serve", "--processes", "0"],
        env={k: v for k, v in os.environ.items() if not k.startswith("MEMSVC_")},
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert b"MEMSVC_PROCESSES must be within 1..64" in result.stderr
