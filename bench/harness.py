"""Shared benchmark pieces: memsvc in its own process, open-loop calls, percentiles, results."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.provenance import provenance

RESULTS_DIR = Path(__file__).parent / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports free now (``serve --processes N`` gives its
    Nth process the metrics port + N - 1: one free port alone would leave the others to chance,
    and an outgoing connection's ephemeral port once took one)."""
    for _ in range(100):
        first = free_port()
        sockets: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports found")


@dataclass(frozen=True)
class Target:
    """A running memsvc (separate process) and the servers behind it."""

    port: int
    pg_dsn: str
    redis_url: str
    api_key: str
    # The `memsvc serve` process (its RSS, for the soak).
    server_pid: int = 0
    # The PostgreSQL and valkey servers (their CPU time, for bench/overload.py).
    pg_pid: int = 0
    valkey_pid: int = 0


@contextmanager
def served_stack(
    extra_env: dict[str, str] | None = None,
    *,
    serve_args: tuple[str, ...] = (),
    log_path: Path | None = None,
    redis_cluster: bool = False,
    data_dir: Path | None = None,
    citus: bool = False,
) -> Iterator[Target]:
    """Embedded PostgreSQL (or a Citus cluster) + valkey (or a valkey cluster), and `memsvc
    serve` against them in its own process."""
    with (
        embedded_stack(redis_cluster=redis_cluster, data_dir=data_dir, citus=citus) as stack,
        memsvc_server(stack, extra_env, serve_args=serve_args, log_path=log_path) as target,
    ):
        yield target


@dataclass
class Servers:
    """The servers behind a bench, as objects it can stop, kill and start again (the chaos
    bench SIGKILLs them): the embedded PostgreSQL and valkey, the Citus cluster or valkey
    cluster in their place when asked for, and the migrated ``target`` (port 0)."""

    stack: Any  # memsvc.embedded.EmbeddedStack
    target: Target
    citus: Any = None  # tools.clusters.citus.CitusCluster
    valkey_cluster: Any = None  # tools.clusters.valkey_cluster.EmbeddedValkeyCluster


@contextmanager
def embedded_stack(
    *, redis_cluster: bool = False, data_dir: Path | None = None, citus: bool = False
) -> Iterator[Target]:
    """Embedded PostgreSQL + valkey, migrated, with an API key; no memsvc yet (port 0).
    ``redis_cluster``: the cache is a 3-master valkey cluster instead of one server.
    ``citus``: the database is a Citus coordinator with two workers on this machine (Citus
    built or found as `make test-cluster` does); the embedded PostgreSQL then idles.
    ``data_dir``: their data is kept there (a large corpus seeded once serves many runs);
    by default a temporary folder, removed after.

    Several `memsvc_server`s can run against it one after the other (e.g. the same ingested
    data served with different settings)."""
    with embedded_servers(redis_cluster=redis_cluster, data_dir=data_dir, citus=citus) as servers:
        yield servers.target


@contextmanager
def embedded_servers(
    *, redis_cluster: bool = False, data_dir: Path | None = None, citus: bool = False
) -> Iterator[Servers]:
    """`embedded_stack`, with the server objects themselves."""
    from memsvc.embedded import EmbeddedStack
    from tools.clusters.citus import CitusCluster
    from tools.clusters.citus_build import citus_bin_dir
    from tools.clusters.valkey_cluster import EmbeddedValkeyCluster

    # `timeout` and Ctrl-C must still stop the child servers: turn SIGTERM into SystemExit so
    # the finally blocks below run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with contextlib.ExitStack() as folders:
        if data_dir is None:
            tmp = folders.enter_context(tempfile.TemporaryDirectory(prefix="memsvc-bench-"))
        else:
            data_dir.mkdir(parents=True, exist_ok=True)
            tmp = str(data_dir)
        stack = EmbeddedStack(Path(tmp))
        dsn, url = stack.start()
        cluster = EmbeddedValkeyCluster(Path(tmp) / "cluster") if redis_cluster else None
        citus_cluster = (
            CitusCluster(Path(tmp) / "citus", citus_bin_dir(), durable=True) if citus else None
        )
        try:
            if cluster is not None:
                url = cluster.start()
            if citus_cluster is not None:
                dsn = citus_cluster.start()
            api_key = asyncio.run(_create_key(dsn))
            target = Target(
                0,
                dsn,
                url,
                api_key,
                pg_pid=stack.postgres.pid or 0,
                valkey_pid=stack.valkey.pid or 0,
            )
            yield Servers(stack, target, citus_cluster, cluster)
        finally:
            if citus_cluster is not None:
                citus_cluster.stop()
            if cluster is not None:
                cluster.stop()
            stack.stop()


def server_env(stack: Target, port: int, extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a `memsvc serve` (or `memsvc worker`) against ``stack`` on ``port``:
    ours without any MEMSVC_ setting, then the stack's, then ``extra_env``."""
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
    return env


@contextmanager
def memsvc_server(
    stack: Target,
    extra_env: dict[str, str] | None = None,
    *,
    serve_args: tuple[str, ...] = (),
    log_path: Path | None = None,
) -> Iterator[Target]:
    """`memsvc serve [serve_args]` in its own process against an embedded stack, stopped on
    exit; its log (warnings and errors) goes to ``log_path`` when given."""
    port = free_port()
    env = server_env(stack, port, extra_env)
    log_file = log_path.open("wb") if log_path is not None else None
    proc = subprocess.Popen(
        [sys.executable, "-m", "memsvc", "--log-level", "WARNING", "serve", *serve_args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log_file or subprocess.DEVNULL,
    )
    try:
        wait_serving(port, proc)
        yield dataclasses.replace(stack, port=port, server_pid=proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        if log_file is not None:
            log_file.close()


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


def wait_serving(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    """Until `grpc.health.v1` on ``port`` says SERVING (raises when ``proc`` exits first)."""
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


# Answers: plain, degraded (a leg missing), Prefetch cache outcomes, Remember new or reinforced.
OK_OUTCOMES = frozenset(
    {"ok", "degraded", "hit", "miss", "bypassed", "skipped", "new", "reinforced"}
)
LATE = "late"


@dataclass
class Phase:
    """One open-loop run: every call's latency (from its scheduled start) and outcome, in call
    order. A call that failed, or answered after its deadline (outcome ``late``), is counted
    at the deadline in the all-calls percentiles: the caller had no answer by then."""

    name: str
    rate_per_s: float
    deadline_s: float
    latencies_s: list[float]
    outcomes: list[str]
    wall_s: float
    server_total_ms: list[float] = field(default_factory=list)
    # How late the load generator started each call (its own loop's lag): when this grows,
    # lateness is the client's, not the server's.
    start_lags_s: list[float] = field(default_factory=list)
    # RESOURCE_EXHAUSTED answers by the server's reason (its message, figures left out).
    refusals: Counter[str] = field(default_factory=Counter)

    def summary(self) -> Summary:
        return summarize(self.name, self.latencies_s, self.outcomes, self.deadline_s, self.wall_s)

    def outcome_counts(self) -> dict[str, int]:
        return dict(Counter(self.outcomes))

    def counted_ms(self) -> list[float]:
        """Every call's latency in ms, a failed or late one at the deadline (for plots)."""
        return [
            lat * 1000 if o in OK_OUTCOMES else self.deadline_s * 1000
            for lat, o in zip(self.latencies_s, self.outcomes, strict=True)
        ]

    def start_lag_ms(self) -> dict[str, float] | None:
        """p50 / p99 / max of how late the load generator started the calls."""
        if not self.start_lags_s:
            return None
        lags = np.asarray(self.start_lags_s) * 1000
        p50, p99 = np.percentile(lags, [50, 99])
        return {"p50": float(p50), "p99": float(p99), "max": float(lags.max())}

    def late_from_send(self) -> int:
        """Answers later than the deadline the call carried, counted from when the load
        generator sent it: gRPC's deadline starts then, so this is what the server could
        keep. ``late`` counts from the scheduled start, and so also holds the load
        generator's own start lag (and its loop's lateness in taking the answer)."""
        if not self.start_lags_s:
            return 0
        return sum(
            1
            for lat, lag, o in zip(self.latencies_s, self.start_lags_s, self.outcomes, strict=True)
            if o == LATE and lat - lag > self.deadline_s
        )

    def as_dict(self) -> dict[str, Any]:
        ms = np.asarray(self.latencies_s) * 1000
        return {
            "summary": self.summary().as_dict(),
            "rate_per_s": self.rate_per_s,
            "outcomes": self.outcome_counts(),
            "server_total_ms_p50": float(np.median(self.server_total_ms))
            if self.server_total_ms
            else None,
            "client_start_lag_ms": self.start_lag_ms(),
            "late_from_send": self.late_from_send(),
            "refusals": dict(self.refusals.most_common()),
            # In call order (= scheduled time): stalls show up as runs of slow calls.
            "latencies_ms": [round(float(x), 1) for x in ms],
            # Beside each latency, what the call got (a stall's misses: refused, late or
            # DEADLINE_EXCEEDED).
            "call_outcomes": list(self.outcomes),
        }


@dataclass
class Summary:
    """A phase in figures. ``p*_ms``: over every call, a failed or late one counted at the
    deadline; ``ok_p*_ms``: over the calls answered in time only."""

    name: str
    calls: int
    errors: int
    deadline_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    ok_p50_ms: float
    ok_p95_ms: float
    ok_p99_ms: float
    max_ms: float
    throughput_per_s: float

    def line(self) -> str:
        return (
            f"{self.name:<30} n={self.calls:<6} err={self.errors:<5} all calls "
            f"p50={self.p50_ms:7.2f} p95={self.p95_ms:7.2f} p99={self.p99_ms:7.2f} | OK "
            f"p50={self.ok_p50_ms:7.2f} p95={self.ok_p95_ms:7.2f} p99={self.ok_p99_ms:7.2f} "
            f"max={self.max_ms:7.2f} ms {self.throughput_per_s:6.1f}/s"
        )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _percentiles(ms: npt.NDArray[np.float64]) -> tuple[float, float, float]:
    if ms.size == 0:
        return float("nan"), float("nan"), float("nan")
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return float(p50), float(p95), float(p99)


def summarize(
    name: str, latencies_s: list[float], outcomes: list[str], deadline_s: float, wall_s: float
) -> Summary:
    """Percentiles over all calls (failed or late ones at ``deadline_s``) and over OK ones."""
    ms = np.asarray(latencies_s, dtype=np.float64) * 1000
    ok = np.asarray([o in OK_OUTCOMES for o in outcomes], dtype=bool)
    counted = np.where(ok, ms, deadline_s * 1000)
    p50, p95, p99 = _percentiles(counted)
    ok_p50, ok_p95, ok_p99 = _percentiles(ms[ok])
    return Summary(
        name=name,
        calls=len(outcomes),
        errors=int((~ok).sum()),
        deadline_ms=deadline_s * 1000,
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        ok_p50_ms=ok_p50,
        ok_p95_ms=ok_p95,
        ok_p99_ms=ok_p99,
        max_ms=float(ms.max()) if ms.size else float("nan"),
        throughput_per_s=int(ok.sum()) / wall_s if wall_s > 0 else 0.0,
    )


def over_floor(service: Summary, floor: Summary) -> dict[str, float | None]:
    """service / floor at p50, p95 and p99, over all calls (and over OK calls: ``ok_p*``)."""

    def ratio(ours: float, base: float) -> float | None:
        return round(ours / base, 3) if base and math.isfinite(ours / base) else None

    out: dict[str, float | None] = {}
    for p in ("p50", "p95", "p99"):
        out[p] = ratio(getattr(service, f"{p}_ms"), getattr(floor, f"{p}_ms"))
        out[f"ok_{p}"] = ratio(getattr(service, f"ok_{p}_ms"), getattr(floor, f"ok_{p}_ms"))
    return out


def ratio_row(service: Summary, floor: Summary) -> dict[str, Any]:
    """One line of a report's ``ratios``: which phase, over which floor, and the ratios."""
    return {"phase": service.name, "floor": floor.name, **over_floor(service, floor)}


def ratio_line(row: dict[str, Any]) -> str:
    """A ``ratio_row`` as one printed line."""
    cells = "  ".join(
        f"{p} x{row[p]:.2f}" if row[p] is not None else f"{p} -" for p in ("p50", "p95", "p99")
    )
    return f"{row['phase']:<30} / {row['floor']}: {cells} (all calls)"


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


Call = Callable[[int], Awaitable[str | None]]


async def open_loop(
    name: str, call: Call, *, rate_per_s: float, count: int, deadline_s: float
) -> Phase:
    """Send ``count`` calls at ``rate_per_s`` whether or not earlier ones returned (no hidden
    queueing); each ``call`` returns its outcome (None: "ok") or raises.

    Latency is measured from each call's scheduled start, so a stalled client shows up too;
    an answer later than ``deadline_s`` after that is ``late``.
    """
    latencies = [0.0] * count
    outcomes = [""] * count
    start_lags = [0.0] * count
    refusals: Counter[str] = Counter()
    tasks: list[asyncio.Task[None]] = []

    async def one(i: int, scheduled: float) -> None:
        start_lags[i] = time.perf_counter() - scheduled
        try:
            outcome = await call(i) or "ok"
        except grpc.aio.AioRpcError as exc:
            outcome = exc.code().name
            if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                refusals[refusal_reason(exc.details() or "")] += 1
        except Exception as exc:
            outcome = type(exc).__name__
        latencies[i] = time.perf_counter() - scheduled
        if outcome in OK_OUTCOMES and latencies[i] > deadline_s:
            outcome = LATE
        outcomes[i] = outcome

    # The load generator's own garbage collector stays off while it measures: a full
    # collection over thousands of live calls stops its loop for tens of ms, and every answer
    # waiting then would be counted late against the server.
    gc.collect()
    gc.disable()
    try:
        start = await paced(
            lambda i, scheduled: tasks.append(asyncio.create_task(one(i, scheduled))),
            rate_per_s=rate_per_s,
            count=count,
        )
        await finished(tasks)
    finally:
        gc.enable()
    wall_s = time.perf_counter() - start
    return Phase(
        name,
        rate_per_s,
        deadline_s,
        latencies,
        outcomes,
        wall_s,
        start_lags_s=start_lags,
        refusals=refusals,
    )


def refusal_reason(details: str) -> str:
    """A refusal's message up to its first colon or semicolon, figures as N: the gate that
    refused (``this server is saturated``, ``more than N reads in flight``...)."""
    head = re.split(r"[:;(]", details, maxsplit=1)[0]
    return re.sub(r"\d+(\.\d+)?", "N", head).strip()


def result_paths(kind: str) -> tuple[Path, Path]:
    """bench/results/KIND-YYYYmmdd-HHMMSS.json and the .png beside it."""
    RESULTS_DIR.mkdir(exist_ok=True)
    stem = RESULTS_DIR / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
    return stem.with_suffix(".json"), stem.with_suffix(".png")


def write_eval(kind: str, args: argparse.Namespace, results: list[dict[str, Any]]) -> Path:
    """An evaluation's results with the arguments that produced them, as
    bench/results/KIND-YYYYmmdd-HHMMSS.json; prints and returns the path."""
    out, _ = result_paths(kind)
    out.write_text(
        json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2
        )
    )
    print(f"written {out}")
    return out


def write_result(path: Path, body: dict[str, Any], report: dict[str, Any]) -> None:
    """The run's JSON with its provenance and ``report``: what bench/RESULTS.md shows of it
    (``title``; ``rows``: Summary dicts; ``ratios``: {phase, floor, p50, p95, p99, ok_p*};
    ``notes``: sentences)."""
    # default=str: paths and the like among the arguments.
    path.write_text(
        json.dumps({"provenance": provenance(), "report": report, **body}, indent=2, default=str)
    )
    print(f"written {path}")
