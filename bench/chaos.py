"""Chaos: mixed traffic from several tenants while the servers are killed (issue 31, item 8).

    python -m bench.chaos [--seconds 180] [--rate 12] [--rounds 2] [--processes 1] [--citus]
                          [--workers 2] [--tenants 3] [--seed 7] [--env NAME=VALUE]

The bench starts every server itself, as processes it can SIGKILL: the embedded PostgreSQL
and valkey (bench/harness.py; with ``--citus`` a Citus coordinator and two workers, built as
`make test-cluster` builds them), `python -m memsvc serve` with its workers off
(``--processes N``: `memsvc serve --processes N`), and ``--workers`` `python -m memsvc
worker` processes doing the extraction. Then, for ``--seconds``:

- open-loop traffic at ``--rate`` calls/s from ``--tenants`` tenants (one API key each):
  Ingest (a user turn and the agent's answer; retried with the same idempotency key until
  acknowledged or given up), Remember, Recall and Prefetch, each with its deadline;
- one WatchMemories stream per tenant and watched user, resumed after every break from the
  last position it saw;
- a stale-packet probe: ``--stale-after-s`` after each acknowledged Remember on a probe user,
  a hint-less Prefetch of that user, which must hold the new fact;
- faults at random moments, ``--rounds`` of each kind, one at a time: the serving process
  (SIGKILL of its process group, then started again; with ``--processes 2`` also one serving
  child alone, which its parent starts again), an extraction worker (SIGKILL, started again),
  PostgreSQL (SIGKILL of the postmaster; its backends exit; started again: crash recovery), valkey
  (SIGKILL, started again from its AOF), and with ``--citus`` a Citus worker node. Each
  fault's recovery time runs from the kill until a probe that needs the killed part succeeds
  again (a Recall; a Remember; a Prefetch served from the cache; an extraction worker's
  leased jobs all finished; a Remember for each of 8 users, spread over the shards).

Afterwards, once the outbox drained, it checks against the database:

- every acknowledged Ingest: its messages stored once, its job DONE, one extraction run;
  every acknowledged Remember: its memory stored, and one memory with its content (lost,
  duplicated);
- every change the change log holds between a stream's first and last position was
  delivered to that stream (missing), and the stream caught up with the log (behind);
- no call answered OK later than its deadline, measured by the client from the send (late;
  gRPC's client turns an answer that comes after the deadline into DEADLINE_EXCEEDED, so an
  OK a hair past it is the client's event loop taking the answer late: answers within
  ``LATE_TOLERANCE_MS`` of the deadline are listed, not counted; DEADLINE_EXCEEDED, calls
  the server did not answer in time, are counted beside it);
- no stale packet: the probe's Prefetch held the fact (unless 10 newer facts pushed it out of
  the packet's most recent facts or it was superseded: counted apart).

Printed, and written to bench/results/chaos-p1-*.json (chaos-p2-*, chaos-citus-*): every
fault with its time and recovery, calls by RPC and status, the counts. Exits 1 when anything
was lost, duplicated, missing, late or stale, or a server died that the bench did not kill.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import corpus
from bench.harness import (
    Servers,
    Target,
    embedded_servers,
    free_port,
    free_ports,
    paced,
    result_paths,
    server_env,
    write_result,
)
from memsvc.embedded.process import pid_alive
from memsvc.storage import api_keys
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc

DEADLINE_S = {"Ingest": 5.0, "Remember": 5.0, "Recall": 2.0, "Prefetch": 1.0}
MIX = {"Ingest": 0.3, "Remember": 0.25, "Recall": 0.25, "Prefetch": 0.2}
# Retryable answers of an Ingest: the same idempotency key again, up to this many attempts.
RETRYABLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED"})
INGEST_ATTEMPTS = 8
USERS_PER_TENANT = 8
PROBE_USERS = 2  # per tenant: Remember only, watched, their packets checked
# A hint-less packet shows the user's most recent facts (MEMSVC_PREFETCH_DIRECT_FACTS).
PACKET_RECENT_FACTS = 10
RECOVERY_TIMEOUT_S = 180.0
LATE_TOLERANCE_MS = 5.0
TAIL_S = 5.0
ORPHAN_GRACE_S = 5.0
PROBE_EVERY_S = 0.25
CHANNELS = 4
CHANNEL_OPTIONS = [
    # Reconnect fast after a restart: gRPC's default backoff (1 s doubling to 120 s) would
    # make every recovery look as slow as the client's next attempt.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Each channel its own connection: with several serving processes the kernel hands
    # connections, not calls, to them.
    ("grpc.use_local_subchannel_pool", 1),
]
# Settings of the served processes: a killed worker's job waits for its lease to run out;
# the default lease (120 s) would make a few-minute run mostly waiting.
SERVER_ENV = {
    "MEMSVC_RUN_WORKERS": "false",
    "MEMSVC_WORKER_LEASE_S": "30",
    "MEMSVC_WORKER_JOB_TIMEOUT_S": "25",
    "MEMSVC_WORKER_BACKOFF_BASE_S": "1",
    "MEMSVC_WORKER_SWEEP_INTERVAL_S": "2",
    # The read gates that answer to the machine's load measure the other processes of a
    # shared 2-core machine (as in bench/fairness.py): off, so refusals come from the faults.
    "MEMSVC_READS_MAX_CPU_BUSY": "0",
}


def now_ts() -> Timestamp:
    ts = Timestamp()
    ts.GetCurrentTime()
    return ts


# --- the processes it kills -------------------------------------------------------------


class Proc:
    """A memsvc process (`serve` or `worker`) in its own process group, started again at will."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        with self.log.open("ab") as log:
            log.write(f"--- start {self.starts} at {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "memsvc", "--log-level", "WARNING", *self.argv],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        self.starts += 1

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the process group (a container killed, the OOM killer), then reap it."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()

    def children(self) -> list[int]:
        """The serving children of `serve --processes N` (not multiprocessing's tracker)."""
        if not self.alive():
            return []
        out = []
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                for pid in (task / "children").read_text().split():
                    with contextlib.suppress(OSError):
                        if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                            out.append(int(pid))
        return out


def kill_server(server: Any) -> None:
    """SIGKILL an embedded server (its process group) and wait until it and its children are
    gone. PostgreSQL's backends each call setsid(), so the postmaster's group holds only the
    postmaster: they exit by themselves once they notice it died, and a new postmaster
    started while one still holds the shared memory refuses to start ("pre-existing shared
    memory block is still in use"); one left after ORPHAN_GRACE_S is killed. start() would
    also return at once while the old process is still there to answer its poll()."""
    pid = server.pid
    children = child_pids(pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + ORPHAN_GRACE_S
    while server.is_running() or any(pid_alive(c) for c in children):
        if time.monotonic() > deadline:
            for child in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
        time.sleep(0.01)


def child_pids(pid: int) -> list[int]:
    """The children of ``pid`` now (from /proc)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(c) for c in (task / "children").read_text().split()]
    return out


@dataclass
class Fault:
    kind: str
    at_s: float
    detail: str = ""
    recovered_s: float | None = None
    # Calls answered with an error while it lasted (kill to recovery), by status.
    errors: dict[str, int] = field(default_factory=dict)


class Cluster:
    """Every server of the run and how to kill each kind of them."""

    def __init__(
        self, servers: Servers, args: argparse.Namespace, logs: Path, rng: random.Random
    ) -> None:
        self.servers = servers
        self.args = args
        self.rng = rng
        self.port = free_port()
        self.metrics_base = free_ports(args.processes) if args.processes > 1 else 0
        env = server_env(
            servers.target,
            self.port,
            SERVER_ENV | {"MEMSVC_METRICS_PORT": str(self.metrics_base or 0)} | args.extra_env,
        )
        serve_argv = ["serve"] + (
            ["--processes", str(args.processes)] if args.processes > 1 else []
        )
        self.serve = Proc("serve", serve_argv, env, logs / "serve.log")
        # Workers: no metrics (the default port would collide), no gRPC.
        worker_env = {k: v for k, v in env.items() if k != "MEMSVC_METRICS_PORT"}
        self.workers = [
            Proc(f"worker{i}", ["worker"], worker_env, logs / f"worker{i}.log")
            for i in range(args.workers)
        ]
        # What the bench killed on purpose (a death it did not cause is a finding).
        self.killing: set[str] = set()
        self.chosen_worker: Proc | None = None
        self.held = 0  # jobs the chosen worker held
        self.unexpected: list[dict[str, Any]] = []
        self.restart_failures: list[dict[str, Any]] = []

    @property
    def target(self) -> Target:
        return self.servers.target

    def kinds(self) -> list[str]:
        kinds = ["serve", "worker", "postgres", "valkey"]
        if self.args.processes > 1:
            kinds.append("serve-child")
        if self.servers.citus is not None:
            kinds.append("citus-worker")
        return kinds

    async def start_all(self) -> None:
        for worker in self.workers:
            worker.start()
        self.serve.start()
        await self.wait_serving(RECOVERY_TIMEOUT_S)

    async def wait_serving(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if not self.serve.alive():
                    raise RuntimeError(f"memsvc serve exited; see {self.serve.log}")
                try:
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError("memsvc serve did not become ready")

    def stop_all(self) -> None:
        self.serve.stop()
        for worker in self.workers:
            worker.stop()

    async def inject(self, kind: str) -> str:
        """Kill one server of ``kind`` and start it again; what was killed."""
        self.killing.add(kind)
        try:
            return await self._inject(kind)
        except Exception as exc:  # a restart that failed is a finding, not the end of the run
            self.restart_failures.append({"kind": kind, "error": str(exc)[:2000]})
            print(f"!! {kind}: starting it again failed: {exc}", flush=True)
            return f"starting it again failed: {type(exc).__name__}"
        finally:
            self.killing.discard(kind)

    async def _inject(self, kind: str) -> str:
        if kind == "serve":
            pid = self.serve.pid
            self.serve.kill()
            self.serve.start()
            return f"memsvc serve pid {pid} (its process group)"
        if kind == "serve-child":
            children = self.serve.children()
            if not children:
                return "no serving child found"
            pid = self.rng.choice(children)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return f"serving child pid {pid} (its parent starts it again)"
        if kind == "worker":
            worker = self.chosen_worker or self.rng.choice(self.workers)
            pid = worker.pid
            worker.kill()
            worker.start()
            return f"{worker.name} pid {pid}, holding {self.held} job(s)"
        if kind == "postgres":
            node = (
                self.servers.citus.coordinator
                if self.servers.citus is not None
                else self.servers.stack.postgres
            )
            return await self._kill_postgres(
                node, "PostgreSQL" if self.servers.citus is None else "Citus coordinator"
            )
        if kind == "citus-worker":
            workers = self.servers.citus.workers
            i = self.rng.randrange(len(workers))
            return await self._kill_postgres(workers[i], f"Citus worker node {i + 1}")
        if kind == "valkey":
            valkey = self.servers.stack.valkey
            pid = valkey.pid
            await asyncio.to_thread(kill_server, valkey)
            await asyncio.to_thread(valkey.start, 60.0)
            return f"valkey pid {pid}"
        raise ValueError(kind)

    async def _kill_postgres(self, node: Any, name: str) -> str:
        pid = node.pid
        # SIGKILL of the postmaster: its backends exit when they notice; start() then starts
        # it again (crash recovery from the WAL).
        await asyncio.to_thread(kill_server, node)
        for attempt in range(3):
            try:
                await asyncio.to_thread(node.start, 120.0)
                break
            except Exception as exc:
                # Recorded (a finding), then tried again as a supervisor would: the checks
                # need the database.
                self.restart_failures.append({"kind": name, "error": str(exc)[:2000]})
                print(f"!! {name}: starting it again failed (attempt {attempt + 1})", flush=True)
                if attempt == 2:
                    raise
                await asyncio.sleep(2.0)
        return f"{name} postmaster pid {pid}"

    async def watchdog(self, stop: asyncio.Event, t0: float) -> None:
        """A memsvc process that died without the bench killing it: noted, started again."""
        while not stop.is_set():
            for proc in [self.serve, *self.workers]:
                kind = "serve" if proc is self.serve else "worker"
                if proc.proc is not None and not proc.alive() and kind not in self.killing:
                    self.unexpected.append(
                        {
                            "process": proc.name,
                            "at_s": round(time.perf_counter() - t0, 1),
                            "exit_code": proc.proc.returncode,
                        }
                    )
                    print(f"!! {proc.name} exited by itself (code {proc.proc.returncode})")
                    proc.start()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


# --- the traffic ------------------------------------------------------------------------


@dataclass
class Call:
    rpc: str
    tenant: str
    scheduled_s: float
    latency_s: float  # from the send
    code: str
    late: bool = False


@dataclass
class IngestAck:
    tenant: str
    user: str
    key: str
    ingest_id: str
    message_ids: list[str]
    attempts: int
    duplicate: bool


@dataclass
class RememberAck:
    tenant: str
    user: str
    memory_id: str
    content: str
    reinforced: bool
    acked_at: float


@dataclass
class Stream:
    """One WatchMemories stream, resumed after every break."""

    tenant: str
    user: str
    start_position: int | None = None
    last_position: int = 0
    received: Counter[int] = field(default_factory=Counter)
    breaks: Counter[str] = field(default_factory=Counter)
    resumes: int = 0


@dataclass
class Run:
    calls: list[Call] = field(default_factory=list)
    ingests: list[IngestAck] = field(default_factory=list)
    ingest_given_up: int = 0
    ingest_conflicts: list[str] = field(default_factory=list)
    remembers: list[RememberAck] = field(default_factory=list)
    # Remembers that failed: (tenant, user, content, status).
    remember_failed: list[tuple[str, str, str, str]] = field(default_factory=list)
    streams: list[Stream] = field(default_factory=list)
    stale_checked: int = 0
    stale: list[dict[str, Any]] = field(default_factory=list)
    stale_unchecked: Counter[str] = field(default_factory=Counter)
    faults: list[Fault] = field(default_factory=list)


class Traffic:
    def __init__(self, port: int, keys: dict[str, str], seed: int) -> None:
        self.channels = [
            grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS)
            for _ in range(CHANNELS)
        ]
        self.stubs = [memory_pb2_grpc.MemoryServiceStub(c) for c in self.channels]
        self.keys = keys
        self.tenants = sorted(keys)
        self.rng = random.Random(seed)
        self.queries = corpus.queries(20_000, seed=seed)
        # The corpus's distinct facts (about 1,400), over and over: one said again to the same
        # user is reinforced, which the checks allow for.
        self.facts = itertools.cycle(
            corpus.distinct_sentences(corpus.FACT_TEMPLATES, 50_000, random.Random(seed))
        )
        self.run = Run()
        self.t0 = time.perf_counter()
        self.i = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.stale_after_s = 1.0

    def stub(self) -> Any:
        return self.stubs[self.rng.randrange(len(self.stubs))]

    def md(self, tenant: str) -> tuple[tuple[str, str]]:
        return (("x-api-key", self.keys[tenant]),)

    def user(self) -> str:
        return f"u{self.rng.randrange(USERS_PER_TENANT)}"

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close(None)

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def timed(self, rpc: str, tenant: str, scheduled: float, coro: Any) -> Any:
        """Await one call; record its status and whether it answered OK after its deadline."""
        sent = time.perf_counter()
        try:
            reply = await coro
            code = "OK"
        except grpc.aio.AioRpcError as exc:
            reply, code = None, exc.code().name
        latency = time.perf_counter() - sent
        late = code == "OK" and latency > DEADLINE_S[rpc] + LATE_TOLERANCE_MS / 1000
        self.run.calls.append(Call(rpc, tenant, scheduled - self.t0, latency, code, late))
        return reply, code

    def start_call(self, _: int, scheduled: float) -> None:
        self.i += 1
        i = self.i
        rpc = self.rng.choices(list(MIX), list(MIX.values()))[0]
        tenant = self.rng.choice(self.tenants)
        if rpc == "Ingest":
            self.spawn(self.ingest(tenant, i, scheduled))
        elif rpc == "Remember":
            self.spawn(self.remember(tenant, scheduled))
        elif rpc == "Recall":
            request = pb.RecallRequest(
                scope=pb.Scope(user_id=self.user()), query=self.queries[i % len(self.queries)]
            )
            self.spawn(self.read("Recall", tenant, scheduled, request))
        else:
            prefetch = pb.PrefetchRequest(
                scope=pb.Scope(user_id=self.user()),
                session_id=f"call-{i}",
                hint=self.rng.choice(corpus.TOPICS),
            )
            self.spawn(self.read("Prefetch", tenant, scheduled, prefetch))

    async def read(self, rpc: str, tenant: str, scheduled: float, request: Any) -> None:
        method = getattr(self.stub(), rpc)
        await self.timed(
            rpc,
            tenant,
            scheduled,
            method(request, metadata=self.md(tenant), timeout=DEADLINE_S[rpc]),
        )

    async def ingest(self, tenant: str, i: int, scheduled: float) -> None:
        """A user turn and the agent's answer, sent until acknowledged with one key."""
        user = self.user()
        key = uuid.uuid4().hex
        ids = [f"c{i}-u", f"c{i}-a"]
        sent = now_ts()
        text = next(self.facts)
        request = pb.IngestRequest(
            scope=pb.Scope(user_id=user),
            session_id=f"s-{user}-{int(time.time() // 60)}",
            idempotency_key=key,
            messages=[
                pb.Message(
                    message_id=ids[0],
                    sender_id=user,
                    role=pb.MESSAGE_ROLE_USER,
                    text=text,
                    sent_at=sent,
                ),
                pb.Message(
                    message_id=ids[1],
                    sender_id="agent",
                    role=pb.MESSAGE_ROLE_ASSISTANT,
                    text="Noted, thank you.",
                    sent_at=sent,
                ),
            ],
        )
        for attempt in range(1, INGEST_ATTEMPTS + 1):
            reply, code = await self.timed(
                "Ingest",
                tenant,
                scheduled if attempt == 1 else time.perf_counter(),
                self.stub().Ingest(request, metadata=self.md(tenant), timeout=DEADLINE_S["Ingest"]),
            )
            if code == "OK":
                self.run.ingests.append(
                    IngestAck(tenant, user, key, reply.ingest_id, ids, attempt, reply.duplicate)
                )
                return
            if code not in RETRYABLE:
                break
            await asyncio.sleep(min(8.0, 0.5 * 2**attempt) * (0.5 + self.rng.random()))
        self.run.ingest_given_up += 1

    async def remember(self, tenant: str, scheduled: float) -> None:
        """Remember is not idempotent: never retried (a client cannot know whether a call
        that failed wrote). A probe user's write is followed by the stale-packet check."""
        probe = self.rng.random() < 0.3
        user = f"p{self.rng.randrange(PROBE_USERS)}" if probe else self.user()
        content = next(self.facts)
        request = pb.RememberRequest(scope=pb.Scope(user_id=user), content=content)
        reply, code = await self.timed(
            "Remember",
            tenant,
            scheduled,
            self.stub().Remember(request, metadata=self.md(tenant), timeout=DEADLINE_S["Remember"]),
        )
        if code != "OK":
            self.run.remember_failed.append((tenant, user, content, code))
            return
        ack = RememberAck(
            tenant, user, reply.memory.memory_id, content, reply.reinforced, time.perf_counter()
        )
        self.run.remembers.append(ack)
        if probe and ack.reinforced:
            # The fact was there already: the packet's most recent facts need not show it.
            self.run.stale_unchecked["reinforced an older fact"] += 1
        elif probe:
            await asyncio.sleep(self.stale_after_s)
            await self.stale_check(ack)

    async def stale_check(self, ack: RememberAck) -> None:
        """A hint-less Prefetch once the packet's rebuild is due must hold the new fact."""
        prefetch = pb.PrefetchRequest(scope=pb.Scope(user_id=ack.user), session_id="stale-check")
        sent = time.perf_counter()
        reply, code = await self.timed(
            "Prefetch",
            ack.tenant,
            sent,
            self.stub().Prefetch(
                prefetch, metadata=self.md(ack.tenant), timeout=DEADLINE_S["Prefetch"]
            ),
        )
        if code != "OK":
            self.run.stale_unchecked[f"Prefetch {code}"] += 1
            return
        if ack.memory_id in {f.memory_id for f in reply.facts}:
            self.run.stale_checked += 1
            return
        newer = sum(
            1
            for r in self.run.remembers
            if r.tenant == ack.tenant and r.user == ack.user and ack.acked_at < r.acked_at < sent
        )
        if newer >= PACKET_RECENT_FACTS:
            self.run.stale_unchecked["pushed out by newer facts"] += 1
            return
        self.run.stale_checked += 1
        self.run.stale.append(
            {
                "tenant": ack.tenant,
                "user": ack.user,
                "memory_id": ack.memory_id,
                "cache": pb.CacheStatus.Name(reply.cache),
                "packet_version": reply.version,
                "at_s": round(sent - self.t0, 1),
            }
        )

    async def watch(self, stream: Stream, stop: asyncio.Event) -> None:
        """Follow a user's changes; after a break, resume after the last position seen."""
        while not stop.is_set():
            request = pb.WatchMemoriesRequest(scope=pb.Scope(user_id=stream.user), whole_user=True)
            if stream.start_position is not None:
                request.after_position = stream.last_position
                stream.resumes += 1
            call = self.stub().WatchMemories(request, metadata=self.md(stream.tenant))
            stopper = asyncio.ensure_future(stop.wait())
            try:
                async for change in _until(call, stopper):
                    if change.kind == pb.CHANGE_KIND_HEARTBEAT:
                        if stream.start_position is None:
                            stream.start_position = change.position
                        stream.last_position = max(stream.last_position, change.position)
                        continue
                    stream.received[change.position] += 1
                    stream.last_position = max(stream.last_position, change.position)
            except grpc.aio.AioRpcError as exc:
                stream.breaks[exc.code().name] += 1
                await asyncio.sleep(0.3)
            finally:
                call.cancel()
                stopper.cancel()


async def _until(call: Any, stopper: asyncio.Future[Any]) -> Any:
    """The stream's messages until it ends or ``stopper`` is done."""
    iterator = call.__aiter__()
    while True:
        nxt = asyncio.ensure_future(iterator.__anext__())
        await asyncio.wait({nxt, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not nxt.done():
            nxt.cancel()
            return
        try:
            yield nxt.result()
        except StopAsyncIteration:
            return


# --- recovery probes --------------------------------------------------------------------


class Prober:
    """The first moment after a kill when the killed part answers again."""

    def __init__(self, cluster: Cluster, key: str) -> None:
        self.cluster = cluster
        self.md = (("x-api-key", key),)
        self.n = 0

    async def recovered(self, kind: str, since: float, before: set[str]) -> float | None:
        deadline = since + RECOVERY_TIMEOUT_S
        channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{self.cluster.port}", options=CHANNEL_OPTIONS
        )
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        try:
            while time.perf_counter() < deadline:
                try:
                    if await self._probe(kind, stub, before):
                        return round(time.perf_counter() - since, 2)
                except (grpc.aio.AioRpcError, OSError, asyncpg.PostgresError):
                    pass
                await asyncio.sleep(PROBE_EVERY_S)
            return None
        finally:
            await channel.close(None)

    async def _probe(self, kind: str, stub: Any, leased: set[str]) -> bool:
        self.n += 1
        scope = pb.Scope(user_id="recovery-probe")
        if kind == "serve":
            await stub.Recall(
                pb.RecallRequest(scope=scope, query="probe"), metadata=self.md, timeout=2
            )
            return True
        if kind == "serve-child":
            if len(self.cluster.serve.children()) < self.cluster.args.processes:
                return False
            for i in range(self.cluster.args.processes):
                url = f"http://127.0.0.1:{self.cluster.metrics_base + i}/metrics"
                await asyncio.to_thread(lambda u=url: urllib.request.urlopen(u, timeout=1).read())
            return True
        if kind == "postgres":
            await stub.Remember(
                pb.RememberRequest(scope=scope, content=f"recovery probe number {self.n}"),
                metadata=self.md,
                timeout=2,
            )
            return True
        if kind == "citus-worker":
            for u in range(8):
                await stub.Remember(
                    pb.RememberRequest(
                        scope=pb.Scope(user_id=f"recovery-probe-{u}"),
                        content=f"recovery probe number {self.n}",
                    ),
                    metadata=self.md,
                    timeout=2,
                )
            return True
        if kind == "valkey":
            reply = await stub.Prefetch(
                pb.PrefetchRequest(scope=scope, session_id=f"probe-{self.n}"),
                metadata=self.md,
                timeout=2,
            )
            return bool(reply.cache in (pb.CACHE_STATUS_HIT, pb.CACHE_STATUS_MISS))
        if kind == "worker":
            if not leased:
                return True
            conn = await asyncpg.connect(self.cluster.target.pg_dsn, timeout=2)
            try:
                left = await conn.fetchval(
                    "SELECT count(*) FROM ingest_outbox WHERE ingest_id::text = ANY($1::text[])"
                    " AND state IN ('pending', 'processing')",
                    list(leased),
                )
            finally:
                await conn.close()
            return int(left) == 0
        raise ValueError(kind)

    async def leased_by(self, pid: int) -> set[str]:
        """The jobs a worker process holds (its worker id carries its pid)."""
        conn = await asyncpg.connect(self.cluster.target.pg_dsn, timeout=5)
        try:
            rows = await conn.fetch(
                "SELECT ingest_id::text FROM ingest_outbox WHERE state = 'processing'"
                " AND leased_by LIKE $1",
                f"%:{pid}:%",
            )
        finally:
            await conn.close()
        return {r[0] for r in rows}


def schedule(
    kinds: list[str], rounds: int, seconds: float, rng: random.Random
) -> list[tuple[float, str]]:
    """``rounds`` of each kind in random order, one in each equal slot of the run after a
    warm-up, at a random moment of the slot's first two thirds (recovery fits in the rest)."""
    faults = [k for k in kinds for _ in range(rounds)]
    rng.shuffle(faults)
    warm = min(15.0, seconds * 0.1)
    slot = (seconds - warm) / max(1, len(faults))
    return [(warm + i * slot + rng.uniform(0, slot * 2 / 3), k) for i, k in enumerate(faults)]


async def inject_faults(
    cluster: Cluster, prober: Prober, traffic: Traffic, plan: list[tuple[float, str]]
) -> None:
    run = traffic.run
    for at_s, kind in plan:
        wait = traffic.t0 + at_s - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        leased: set[str] = set()
        if kind == "worker":
            # The jobs the chosen worker holds when it is killed: recovered once they are
            # finished (by another worker, after their lease ran out).
            cluster.chosen_worker = cluster.rng.choice(cluster.workers)
            with contextlib.suppress(OSError, asyncpg.PostgresError):
                leased = await prober.leased_by(cluster.chosen_worker.pid)
            cluster.held = len(leased)
        since = time.perf_counter()
        fault = Fault(kind, round(since - traffic.t0, 1))
        run.faults.append(fault)
        fault.detail = await cluster.inject(kind)
        fault.recovered_s = await prober.recovered(kind, since, leased)
        end = since + (fault.recovered_s or RECOVERY_TIMEOUT_S)
        fault.errors = dict(
            Counter(
                c.code
                for c in run.calls
                if c.code != "OK" and since - traffic.t0 <= c.scheduled_s <= end - traffic.t0
            )
        )
        print(
            f"fault {kind:<13} at {fault.at_s:6.1f}s: {fault.detail}; recovered in "
            f"{fault.recovered_s} s; errors meanwhile {fault.errors or 'none'}",
            flush=True,
        )


# --- the checks -------------------------------------------------------------------------


async def wait_drained(dsn: str, timeout_s: float) -> float | None:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            conn = await asyncpg.connect(dsn, timeout=5)
            try:
                left = await conn.fetchval(
                    "SELECT count(*) FROM ingest_outbox WHERE state IN ('pending', 'processing')"
                )
            finally:
                await conn.close()
            if left == 0:
                return round(time.perf_counter() - started, 1)
        await asyncio.sleep(1.0)
    return None


async def check(dsn: str, run: Run) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return {
            "ingest": await check_ingests(conn, run),
            "remember": await check_remembers(conn, run),
            "watch": await check_streams(conn, run),
        }
    finally:
        await conn.close()


async def check_ingests(conn: Any, run: Run) -> dict[str, Any]:
    lost: list[str] = []
    duplicated: list[str] = []
    not_extracted: list[str] = []
    by_key: dict[tuple[str, str], set[str]] = defaultdict(set)
    for ack in run.ingests:
        by_key[(ack.tenant, ack.key)].add(ack.ingest_id)
        messages = await conn.fetch(
            "SELECT message_id, ingest_id::text FROM messages WHERE tenant_id = $1"
            " AND user_id = $2 AND message_id = ANY($3::text[])",
            ack.tenant,
            ack.user,
            ack.message_ids,
        )
        counts = Counter(r[0] for r in messages)
        if any(counts[m] == 0 for m in ack.message_ids) or any(
            r[1] != ack.ingest_id for r in messages
        ):
            lost.append(ack.ingest_id)
        if any(counts[m] > 1 for m in ack.message_ids):
            duplicated.append(ack.ingest_id)
        jobs = await conn.fetch(
            "SELECT state FROM ingest_outbox WHERE tenant_id = $1 AND ingest_id = $2::uuid",
            ack.tenant,
            ack.ingest_id,
        )
        runs = await conn.fetchval(
            "SELECT count(*) FROM extraction_runs WHERE tenant_id = $1 AND user_id = $2"
            " AND ingest_id = $3::uuid",
            ack.tenant,
            ack.user,
            ack.ingest_id,
        )
        if not jobs:
            lost.append(ack.ingest_id)
        elif len(jobs) > 1 or runs > 1:
            duplicated.append(ack.ingest_id)
        if not jobs or jobs[0][0] != "done" or runs != 1:
            not_extracted.append(ack.ingest_id)
    conflicting = [k for (_, k), ids in by_key.items() if len(ids) > 1]
    acked_keys = {(a.tenant, a.key) for a in run.ingests}
    stored_keys = {
        (r[0], r[1])
        for r in await conn.fetch("SELECT tenant_id, idempotency_key FROM ingest_outbox")
    }
    return {
        "acknowledged": len(run.ingests),
        "acknowledged_after_retry": sum(a.attempts > 1 for a in run.ingests),
        "acknowledged_as_duplicate": sum(a.duplicate for a in run.ingests),
        "given_up": run.ingest_given_up,
        "lost": sorted(set(lost)),
        "duplicated": sorted(set(duplicated)),
        "not_extracted_once": sorted(set(not_extracted)),
        "one_key_two_ingests": conflicting,
        # Stored although never acknowledged (the answer was lost, the client gave up): not
        # a loss, the write happened; counted to show the faults' window.
        "stored_unacknowledged": len(
            {k for k in stored_keys if not k[0].startswith("recovery")} - acked_keys
        ),
    }


async def check_remembers(conn: Any, run: Run) -> dict[str, Any]:
    lost: list[str] = []
    duplicated: list[str] = []
    for ack in run.remembers:
        found = await conn.fetchval(
            "SELECT count(*) FROM memories WHERE tenant_id = $1 AND user_id = $2"
            " AND memory_id = $3::uuid",
            ack.tenant,
            ack.user,
            ack.memory_id,
        )
        if found == 0:
            lost.append(ack.memory_id)
        if not ack.reinforced:
            same = await conn.fetchval(
                "SELECT count(*) FROM memories WHERE tenant_id = $1 AND user_id = $2"
                " AND content = $3 AND origin <> 'extraction'",
                ack.tenant,
                ack.user,
                ack.content,
            )
            if same > 1:
                duplicated.append(ack.memory_id)
    # A Remember that failed may still have been stored (its answer was lost): Remember has
    # no idempotency key, so a client that retries it can store the fact twice.
    stored_anyway: Counter[str] = Counter()
    for tenant, user, content, code in run.remember_failed:
        if await conn.fetchval(
            "SELECT count(*) FROM memories WHERE tenant_id = $1 AND user_id = $2 AND content = $3",
            tenant,
            user,
            content,
        ):
            stored_anyway[code] += 1
    return {
        "acknowledged": len(run.remembers),
        "failed": len(run.remember_failed),
        "failed_but_stored": dict(stored_anyway),
        "reinforced": sum(a.reinforced for a in run.remembers),
        "lost": lost,
        "duplicated": duplicated,
    }


async def check_streams(conn: Any, run: Run) -> dict[str, Any]:
    missing: list[dict[str, Any]] = []
    behind = 0
    redelivered = 0
    delivered = 0
    for stream in run.streams:
        if stream.start_position is None:
            missing.append({"tenant": stream.tenant, "user": stream.user, "never_opened": True})
            continue
        rows = await conn.fetch(
            "SELECT position, kind FROM memory_changes WHERE tenant_id = $1 AND user_id = $2"
            " AND position > $3 ORDER BY position",
            stream.tenant,
            stream.user,
            stream.start_position,
        )
        logged = [int(r[0]) for r in rows if r[0] is not None]
        delivered += len(stream.received)
        redelivered += sum(n - 1 for n in stream.received.values())
        gaps = [p for p in logged if p <= stream.last_position and p not in stream.received]
        behind += sum(p > stream.last_position for p in logged)
        if gaps:
            missing.append(
                {
                    "tenant": stream.tenant,
                    "user": stream.user,
                    "positions": gaps[:20],
                    "count": len(gaps),
                }
            )
    return {
        "streams": len(run.streams),
        "resumes": sum(s.resumes for s in run.streams),
        "breaks": dict(sum((s.breaks for s in run.streams), Counter())),
        "delivered": delivered,
        "redelivered": redelivered,
        "missing": missing,
        "missing_count": sum(m.get("count", 1) for m in missing),
        "behind_at_end": behind,
    }


async def check_stale(dsn: str, run: Run) -> None:
    """A fact missing from its probe's packet that was superseded meanwhile is not stale."""
    if not run.stale:
        return
    conn = await asyncpg.connect(dsn)
    try:
        kept = []
        for s in run.stale:
            status = await conn.fetchval(
                "SELECT status FROM memories WHERE tenant_id = $1 AND user_id = $2"
                " AND memory_id = $3::uuid",
                s["tenant"],
                s["user"],
                s["memory_id"],
            )
            if status == "superseded":
                run.stale_unchecked["superseded meanwhile"] += 1
                run.stale_checked -= 1
            else:
                kept.append(s)
        run.stale = kept
    finally:
        await conn.close()


# --- the run ----------------------------------------------------------------------------


async def create_keys(dsn: str, tenants: int) -> dict[str, str]:
    conn = await asyncpg.connect(dsn)
    try:
        return {
            f"chaos-{chr(ord('a') + t)}": await api_keys.create_key(
                conn, f"chaos-{chr(ord('a') + t)}", "chaos"
            )
            for t in range(tenants)
        }
    finally:
        await conn.close()


async def run_chaos(servers: Servers, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    keys = await create_keys(servers.target.pg_dsn, args.tenants)
    cluster = Cluster(servers, args, logs, rng)
    await cluster.start_all()
    traffic = Traffic(cluster.port, keys, args.seed)
    traffic.stale_after_s = args.stale_after_s
    prober = Prober(cluster, servers.target.api_key)
    plan = schedule(cluster.kinds(), args.rounds, args.seconds, rng)
    print("faults planned:", [(round(t, 1), k) for t, k in plan], flush=True)
    stop_watch = asyncio.Event()
    stop_dog = asyncio.Event()
    traffic.run.streams = [
        Stream(tenant, user)
        for tenant in traffic.tenants
        for user in [*(f"p{p}" for p in range(PROBE_USERS)), "u0"]
    ]
    watchers = [asyncio.ensure_future(traffic.watch(s, stop_watch)) for s in traffic.run.streams]
    traffic.t0 = time.perf_counter()
    dog = asyncio.ensure_future(cluster.watchdog(stop_dog, traffic.t0))
    injector = asyncio.ensure_future(inject_faults(cluster, prober, traffic, plan))
    try:
        await paced(traffic.start_call, rate_per_s=args.rate, count=int(args.seconds * args.rate))
        # Traffic goes on until the last fault recovered, and TAIL_S more: a fault is never
        # injected into, or recovered in, silence.
        while not injector.done():
            await paced(traffic.start_call, rate_per_s=args.rate, count=int(args.rate))
        await injector
        await paced(traffic.start_call, rate_per_s=args.rate, count=int(TAIL_S * args.rate))
        traffic_s = time.perf_counter() - traffic.t0
        if traffic.tasks:
            await asyncio.wait(set(traffic.tasks))
        drained_s = await wait_drained(servers.target.pg_dsn, args.drain_timeout_s)
        # The streams see the last changes (they poll every MEMSVC_WATCH_POLL_S).
        await asyncio.sleep(5.0)
        stop_watch.set()
        await asyncio.gather(*watchers)
        stop_dog.set()
        await dog
        checks = await check(servers.target.pg_dsn, traffic.run)
        await check_stale(servers.target.pg_dsn, traffic.run)
    finally:
        injector.cancel()
        stop_dog.set()
        stop_watch.set()
        await traffic.close()
        cluster.stop_all()
    return summarize(traffic.run, checks, cluster, args, traffic_s, drained_s)


def summarize(
    run: Run,
    checks: dict[str, Any],
    cluster: Cluster,
    args: argparse.Namespace,
    traffic_s: float,
    drained_s: float | None,
) -> dict[str, Any]:
    by_rpc: dict[str, Any] = {}
    for rpc in DEADLINE_S:
        calls = [c for c in run.calls if c.rpc == rpc]
        ok = [c.latency_s * 1000 for c in calls if c.code == "OK"]
        by_rpc[rpc] = {
            "calls": len(calls),
            "codes": dict(Counter(c.code for c in calls)),
            "late": sum(c.late for c in calls),
            "ok_p50_ms": round(float(np.percentile(ok, 50)), 1) if ok else None,
            "ok_p99_ms": round(float(np.percentile(ok, 99)), 1) if ok else None,
            "ok_max_ms": round(max(ok), 1) if ok else None,
            "deadline_ms": DEADLINE_S[rpc] * 1000,
        }
    recoveries: dict[str, list[float | None]] = defaultdict(list)
    for f in run.faults:
        recoveries[f.kind].append(f.recovered_s)
    counts = {
        "faults_injected": len(run.faults),
        "faults_not_recovered": sum(f.recovered_s is None for f in run.faults),
        "acknowledged_writes": checks["ingest"]["acknowledged"]
        + checks["remember"]["acknowledged"],
        "acknowledged_ingests": checks["ingest"]["acknowledged"],
        "acknowledged_remembers": checks["remember"]["acknowledged"],
        "lost": len(checks["ingest"]["lost"]) + len(checks["remember"]["lost"]),
        "duplicated": len(checks["ingest"]["duplicated"]) + len(checks["remember"]["duplicated"]),
        "not_extracted_once": len(checks["ingest"]["not_extracted_once"]),
        "one_key_two_ingests": len(checks["ingest"]["one_key_two_ingests"]),
        "watch_missing": checks["watch"]["missing_count"],
        "watch_behind_at_end": checks["watch"]["behind_at_end"],
        "late_answers": sum(c.late for c in run.calls),
        "deadline_exceeded": sum(c.code == "DEADLINE_EXCEEDED" for c in run.calls),
        "stale_packets": len(run.stale),
        "stale_checked": run.stale_checked,
        "unexpected_exits": len(cluster.unexpected),
        "restart_failures": len(cluster.restart_failures),
    }
    failed = [
        name
        for name in (
            "lost",
            "duplicated",
            "not_extracted_once",
            "one_key_two_ingests",
            "watch_missing",
            "watch_behind_at_end",
            "late_answers",
            "stale_packets",
            "unexpected_exits",
            "restart_failures",
            "faults_not_recovered",
        )
        if counts[name]
    ]
    return {
        "config": {
            "seconds": args.seconds,
            "rate_per_s": args.rate,
            "mix": MIX,
            "deadlines_s": DEADLINE_S,
            "tenants": args.tenants,
            "processes": args.processes,
            "workers": args.workers,
            "citus": args.citus,
            "rounds": args.rounds,
            "stale_after_s": args.stale_after_s,
            "server_env": SERVER_ENV | args.extra_env,
        },
        "traffic_s": round(traffic_s, 1),
        "outbox_drained_after_s": drained_s,
        "faults": [
            asdict(f) | {"ingest_ok_after_s": first_ok_after(run.calls, "Ingest", f.at_s)}
            for f in run.faults
        ],
        "recovery_s": dict(recoveries),
        "counts": counts,
        "failed": failed,
        "rpcs": by_rpc,
        "checks": checks,
        # Every OK answered after its deadline, however little (ms past it).
        "over_deadline": [
            {
                "rpc": c.rpc,
                "at_s": round(c.scheduled_s, 1),
                "ms_past": round((c.latency_s - DEADLINE_S[c.rpc]) * 1000, 1),
            }
            for c in run.calls
            if c.code == "OK" and c.latency_s > DEADLINE_S[c.rpc]
        ],
        "stale": {
            "checked": run.stale_checked,
            "stale": run.stale,
            "unchecked": dict(run.stale_unchecked),
        },
        "unexpected_exits": cluster.unexpected,
        "restart_failures": cluster.restart_failures,
    }


def first_ok_after(calls: list[Call], rpc: str, at_s: float) -> float | None:
    """Seconds from ``at_s`` (a fault) until the first ``rpc`` sent after it was answered OK
    (None: none was): when that RPC was served again, whatever the fault's probe needs (a
    Citus worker node's probe is a Remember; Ingest once stayed down after it, issue 31)."""
    answered = [
        c.scheduled_s + c.latency_s
        for c in calls
        if c.rpc == rpc and c.code == "OK" and c.scheduled_s >= at_s
    ]
    return round(min(answered) - at_s, 2) if answered else None


def report(result: dict[str, Any]) -> dict[str, Any]:
    config, counts = result["config"], result["counts"]
    where = "Citus" if config["citus"] else "one PostgreSQL"
    return {
        "title": (
            f"Chaos: {config['rate_per_s']:g} calls/s for {config['seconds']:g} s, "
            f"{config['tenants']} tenants, {config['processes']} serving process(es), {where}, "
            f"{counts['faults_injected']} faults"
        ),
        "rows": [],
        "ratios": [],
        "notes": [
            "recovery s by fault: "
            + "; ".join(f"{k} {v}" for k, v in result["recovery_s"].items()),
            "Ingest answered OK again, s after the fault: "
            + "; ".join(f"{f['kind']} {f['ingest_ok_after_s']}" for f in result["faults"]),
            "counts: " + ", ".join(f"{k} {v}" for k, v in counts.items()),
            f"invariants broken: {', '.join(result['failed']) or 'none'}",
        ],
    }


def keep_server_logs(servers: Servers, logs: Path) -> None:
    """The database and cache logs beside memsvc's (their folder is removed after the run)."""
    nodes = [("postgres", servers.stack.postgres), ("valkey", servers.stack.valkey)]
    if servers.citus is not None:
        nodes.append(("citus-coordinator", servers.citus.coordinator))
        nodes += [(f"citus-worker{i + 1}", w) for i, w in enumerate(servers.citus.workers)]
    for name, node in nodes:
        with contextlib.suppress(OSError):
            shutil.copyfile(node.log_path, logs / f"{name}.log")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--rate", type=float, default=12.0, help="calls per second, all RPCs")
    parser.add_argument("--rounds", type=int, default=2, help="faults of each kind")
    parser.add_argument("--processes", type=int, default=1, help="`memsvc serve --processes`")
    parser.add_argument("--workers", type=int, default=2, help="`memsvc worker` processes")
    parser.add_argument("--tenants", type=int, default=3)
    parser.add_argument("--citus", action="store_true", help="on a Citus coordinator + 2 workers")
    parser.add_argument("--stale-after-s", type=float, default=1.0)
    parser.add_argument("--drain-timeout-s", type=float, default=240.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE for the servers (repeatable)"
    )
    args = parser.parse_args()
    args.extra_env = dict(item.split("=", 1) for item in args.env)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    # One result kind per setup: bench/RESULTS.md shows the newest of each.
    out, _ = result_paths("chaos-citus" if args.citus else f"chaos-p{args.processes}")
    logs = out.with_suffix("")
    logs.mkdir(parents=True, exist_ok=True)
    with embedded_servers(citus=args.citus) as servers:
        try:
            result = asyncio.run(run_chaos(servers, args, logs))
        finally:
            keep_server_logs(servers, logs)
    print(json.dumps(result["counts"], indent=1))
    print("recovery s:", json.dumps(result["recovery_s"]))
    print(
        "Ingest OK again after (s):",
        json.dumps([(f["kind"], f["ingest_ok_after_s"]) for f in result["faults"]]),
    )
    print(
        "rpcs:",
        json.dumps(
            {k: {kk: v[kk] for kk in ("calls", "codes", "late")} for k, v in result["rpcs"].items()}
        ),
    )
    write_result(out, result, report(result))
    print(f"server logs in {logs}")
    if result["failed"]:
        raise SystemExit(f"invariants broken: {', '.join(result['failed'])}")


if __name__ == "__main__":
    main()
