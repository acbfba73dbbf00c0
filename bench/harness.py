"""Shared benchmark pieces: memsvc in its own process, open-loop pacing, percentiles."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

RESULTS_DIR = Path(__file__).parent / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Target:
    """A running memsvc (separate process) and the servers behind it."""

    port: int
    pg_dsn: str
    redis_url: str
    api_key: str
    # The `memsvc serve` process (its RSS, for the soak).
    server_pid: int = 0


@contextmanager
def served_stack(extra_env: dict[str, str] | None = None) -> Iterator[Target]:
    """Embedded PostgreSQL + valkey, and `memsvc serve` against them in its own process."""
    with embedded_stack() as stack, memsvc_server(stack, extra_env) as target:
        yield target


@contextmanager
def embedded_stack() -> Iterator[Target]:
    """Embedded PostgreSQL + valkey, migrated, with an API key; no memsvc yet (port 0).

    Several `memsvc_server`s can run against it one after the other (e.g. the same ingested
    data served with different settings)."""
    from memsvc.embedded import EmbeddedStack

    # `timeout` and Ctrl-C must still stop the child servers: turn SIGTERM into SystemExit so
    # the finally blocks below run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="memsvc-bench-") as tmp:
        stack = EmbeddedStack(Path(tmp))
        dsn, url = stack.start()
        try:
            api_key = asyncio.run(_create_key(dsn))
            yield Target(0, dsn, url, api_key)
        finally:
            stack.stop()


@contextmanager
def memsvc_server(stack: Target, extra_env: dict[str, str] | None = None) -> Iterator[Target]:
    """`memsvc serve` in its own process against an embedded stack, stopped on exit."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSVC_")}
    env.update(
        {
            "MEMSVC_PG_DSN": stack.pg_dsn,
            "MEMSVC_REDIS_URL": stack.redis_url,
            "MEMSVC_GRPC_PORT": str(port),
            # Any free port: a bench never takes (or fails on) the standard 9464.
            "MEMSVC_METRICS_PORT": "0",
        }
    )
    env.update(extra_env or {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "memsvc", "--log-level", "WARNING", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_serving(port, proc)
        yield Target(port, stack.pg_dsn, stack.redis_url, stack.api_key, server_pid=proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


async def _create_key(dsn: str) -> str:
    import asyncpg

    from memsvc.storage import api_keys
    from memsvc.storage.migrate import migrate

    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn, embedding_dim=384)
        return await api_keys.create_key(conn, "bench", "bench")
    finally:
        await conn.close()


def _wait_serving(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"memsvc dev exited with {proc.returncode}")
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                    return
            except grpc.RpcError:
                time.sleep(0.2)
    raise RuntimeError("memsvc dev did not become ready")


@dataclass
class Summary:
    name: str
    count: int
    errors: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    throughput_per_s: float

    def line(self) -> str:
        return (
            f"{self.name:<28} n={self.count:<6} err={self.errors:<4} "
            f"p50={self.p50_ms:7.2f} p95={self.p95_ms:7.2f} p99={self.p99_ms:7.2f} "
            f"max={self.max_ms:7.2f} ms  {self.throughput_per_s:7.1f}/s"
        )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def summarize(name: str, latencies_s: list[float], errors: int, wall_s: float) -> Summary:
    ms = np.asarray(latencies_s, dtype=np.float64) * 1000
    if ms.size == 0:
        ms = np.asarray([float("nan")])
    return Summary(
        name=name,
        count=len(latencies_s),
        errors=errors,
        p50_ms=float(np.percentile(ms, 50)),
        p95_ms=float(np.percentile(ms, 95)),
        p99_ms=float(np.percentile(ms, 99)),
        max_ms=float(ms.max()),
        mean_ms=float(ms.mean()),
        throughput_per_s=len(latencies_s) / wall_s if wall_s > 0 else 0.0,
    )


async def paced(
    start_call: Callable[[int, float], None], *, rate_per_s: float, count: int
) -> float:
    """Call ``start_call(i, scheduled)`` at ``scheduled = start + i / rate_per_s``, on this
    event loop; returns ``start`` once the last one was started.

    A timer thread does the waiting: asyncio's own timers ride on epoll, whose timeout has
    millisecond resolution (rounded up), so an ``asyncio.sleep`` pacer starts each call
    0.5-1.5 ms late, and latency measured from the scheduled start would carry that client
    error into every percentile. ``time.sleep`` wakes within tens of microseconds and
    ``call_soon_threadsafe`` wakes the loop at once. A busy client still shows up: a call
    started late is measured from when it should have started.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    interval = 1.0 / rate_per_s
    start = time.perf_counter()

    def pace() -> None:
        for i in range(count):
            scheduled = start + i * interval
            delay = scheduled - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            loop.call_soon_threadsafe(start_call, i, scheduled)
        loop.call_soon_threadsafe(done.set_result, None)

    threading.Thread(target=pace, name="bench-pacer", daemon=True).start()
    await done
    return start


async def finished(tasks: list[asyncio.Task[None]]) -> None:
    """Wait for the calls still running. Not ``gather(*tasks)``: that queues one callback per
    task, done or not, in the loop iteration that also holds the last call's reply, which then
    ends about a millisecond late (it was the slowest call of every 1,000-call phase)."""
    pending = [t for t in tasks if not t.done()]
    if pending:
        await asyncio.wait(pending)


async def open_loop(
    call: Callable[[int], Awaitable[None]], *, rate_per_s: float, count: int
) -> tuple[list[float], int, float]:
    """Send `count` calls at a fixed rate whether or not earlier ones returned (no hidden queueing).

    Latency is measured from each call's scheduled start, so a stalled client shows up too.
    """
    latencies: list[float] = []
    errors = 0
    tasks: list[asyncio.Task[None]] = []

    async def one(i: int, scheduled: float) -> None:
        nonlocal errors
        try:
            await call(i)
            latencies.append(time.perf_counter() - scheduled)
        except Exception:
            errors += 1

    start = await paced(
        lambda i, scheduled: tasks.append(asyncio.create_task(one(i, scheduled))),
        rate_per_s=rate_per_s,
        count=count,
    )
    await finished(tasks)
    return latencies, errors, time.perf_counter() - start
