"""Read-path benchmark: Recall and Prefetch over gRPC under open-loop load, against the floor.

    python -m bench.recall [--users 1000] [--memories-per-user 100] [--messages-per-user 50]
                           [--rate 50] [--count 1000] [--capacity-rates 50,100,150,200,250]
                           [--server-env MEMSVC_X=value ...]
    python -m bench.recall --overload-only 200 --overload-runs 3 [--server-env ...]

memsvc runs as its own process (`memsvc serve`, workers off); this process seeds the corpus
(bench/corpus.py), then drives the server with calls sent at a fixed rate whether or not
earlier ones returned (a closed loop would hide queueing). Phases:

1. at --rate: Recall with a text query (every query distinct: each costs an embedding),
   Recall with a caller-supplied vector, Prefetch served from the cache, Prefetch built
   (a distinct hint per call: embedding + walk + store), and the transport alone (a gRPC
   Health/Check to the same server on the same channel);
2. capacity: Recall text at rising rates; the highest with p99 <= 200 ms and no errors;
3. overload: twice that rate with 200 ms deadlines; every answer is classified (OK, OK but
   degraded, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, other);
4. the floor: the same embedding, SQL and Redis calls made directly from this process.

Each ratio to the floor is printed with its parts: floor + transport + memsvc's own overhead.

``--overload-only RATE`` runs only phase 3, ``--overload-runs`` times, to compare server
settings (one run varies a lot on a shared machine). Each phase's latencies are kept in call
order in the JSON, and the server's garbage-collection pauses are reported.

Client, server and PostgreSQL share the machine's cores. Results: bench/results/recall-*.json
and a latency CDF plot recall-*.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import grpc
import numpy as np
import redis.asyncio as aioredis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import corpus
from bench.harness import (
    RESULTS_DIR,
    Summary,
    Target,
    finished,
    free_port,
    paced,
    served_stack,
    summarize,
)
from bench.png import latency_cdf_png
from memsvc.cache.keys import packet_key
from memsvc.concurrency.deadline import Budget
from memsvc.config import Settings
from memsvc.embedding.onnx_minilm import OnnxMiniLMEmbedder
from memsvc.prefetch import queries as prefetch_sql
from memsvc.prefetch.model import PrefetchQuery
from memsvc.retrieval.dense import dense_hits
from memsvc.retrieval.lexical import lexical_hits
from memsvc.retrieval.query import DEFAULT_KINDS, ItemKind
from memsvc.storage import versions
from memsvc.storage.model import Scope
from memsvc.storage.pool import connect_and_migrate
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc

SERVER_ENV = {"MEMSVC_RUN_WORKERS": "false"}
HANDLED = re.compile(
    r"^memsvc_grpc_server_handled_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$", re.MULTILINE
)
LABEL = re.compile(r'(\w+)="([^"]*)"')
CAPACITY_P99_MS = 200.0
OVERLOAD_DEADLINE_S = 0.2
STEP_SECONDS = 8.0
TRANSPORT = "gRPC transport"

Call = Callable[[int], Awaitable[str]]


@dataclass
class Phase:
    """One open-loop run: every call's latency (from its scheduled start) and outcome."""

    name: str
    rate_per_s: float
    latencies_s: list[float]
    outcomes: list[str]
    wall_s: float
    server_total_ms: list[float]

    def summary(self) -> Summary:
        ok = [
            lat for lat, o in zip(self.latencies_s, self.outcomes, strict=True) if o in OK_OUTCOMES
        ]
        errors = sum(o not in OK_OUTCOMES for o in self.outcomes)
        return summarize(self.name, ok, errors, self.wall_s)

    def as_dict(self) -> dict[str, Any]:
        ms = np.asarray(self.latencies_s) * 1000
        return {
            "summary": self.summary().as_dict(),
            "rate_per_s": self.rate_per_s,
            "outcomes": dict(Counter(self.outcomes)),
            "all_calls_p99_ms": float(np.percentile(ms, 99)) if ms.size else None,
            "server_total_ms_p50": float(np.median(self.server_total_ms))
            if self.server_total_ms
            else None,
            # In call order (= scheduled time): stalls show up as runs of slow calls.
            "latencies_ms": [round(float(x), 1) for x in ms],
        }


OK_OUTCOMES = ("ok", "degraded", "hit", "miss", "bypassed")


async def open_loop(name: str, call: Call, *, rate_per_s: float, count: int) -> Phase:
    """Send ``count`` calls at ``rate_per_s``; no call waits for an earlier one."""
    latencies = [0.0] * count
    outcomes = [""] * count
    tasks: list[asyncio.Task[None]] = []

    async def one(i: int, scheduled: float) -> None:
        try:
            outcomes[i] = await call(i)
        except grpc.aio.AioRpcError as exc:
            outcomes[i] = exc.code().name
        except Exception as exc:
            outcomes[i] = type(exc).__name__
        latencies[i] = time.perf_counter() - scheduled

    start = await paced(
        lambda i, scheduled: tasks.append(asyncio.create_task(one(i, scheduled))),
        rate_per_s=rate_per_s,
        count=count,
    )
    await finished(tasks)
    return Phase(name, rate_per_s, latencies, outcomes, time.perf_counter() - start, [])


def server_recall_codes(metrics_port: int) -> Counter[str]:
    """Recall calls the server finished, by the status it answered (its /metrics): tells a
    server that answered late from a client that gave up on a reply already on its way."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    codes: Counter[str] = Counter()
    for match in HANDLED.finditer(text):
        labels = dict(LABEL.findall(match["labels"]))
        if labels.get("grpc_method") == "Recall":
            codes[labels["grpc_code"]] += int(float(match["value"]))
    return codes


GC_PAUSE = re.compile(
    r'^memsvc_gc_pause_seconds_(?P<kind>count|sum)\{generation="(?P<gen>\d)"\}\s+(?P<value>\S+)$',
    re.MULTILINE,
)


def server_gc_pauses(metrics_port: int) -> dict[str, dict[str, float]]:
    """The server's garbage-collection pauses so far, per generation: count and total ms."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    pauses: dict[str, dict[str, float]] = {}
    for match in GC_PAUSE.finditer(text):
        entry = pauses.setdefault(match["gen"], {"count": 0.0, "total_ms": 0.0})
        if match["kind"] == "count":
            entry["count"] = float(match["value"])
        else:
            entry["total_ms"] = round(float(match["value"]) * 1000, 2)
    return pauses


class Client:
    """Calls against the served memsvc, each returning its outcome."""

    def __init__(self, target: Target, users: int, seed: int) -> None:
        self._channel = grpc.aio.insecure_channel(f"127.0.0.1:{target.port}")
        self._stub = memory_pb2_grpc.MemoryServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._metadata = (("x-api-key", target.api_key),)
        self._users = users
        self._rng = random.Random(seed)
        self.server_total_ms: list[float] = []

    def user(self) -> str:
        return f"user-{self._rng.randrange(self._users):05d}"

    async def recall(self, request: pb.RecallRequest, timeout_s: float) -> str:
        reply = await self._stub.Recall(request, metadata=self._metadata, timeout=timeout_s)
        self.server_total_ms.append(reply.timings.total_ms)
        return "degraded" if reply.degraded else "ok"

    async def prefetch(self, request: pb.PrefetchRequest, timeout_s: float) -> str:
        reply = await self._stub.Prefetch(request, metadata=self._metadata, timeout=timeout_s)
        self.server_total_ms.append(reply.timings.total_ms)
        if reply.degraded:
            return "degraded"
        return {
            pb.CACHE_STATUS_HIT: "hit",
            pb.CACHE_STATUS_MISS: "miss",
            pb.CACHE_STATUS_BYPASSED: "bypassed",
        }[reply.cache]

    async def health(self, _i: int) -> str:
        """The transport alone: a Health/Check on the same channel to the same server process
        (no auth, no database), so service - floor - transport is memsvc's own overhead."""
        await self._health.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        return "ok"

    async def close(self) -> None:
        await self._channel.close()


async def run_phase(client: Client, name: str, call: Call, rate: float, count: int) -> Phase:
    client.server_total_ms = []
    phase = await open_loop(name, call, rate_per_s=rate, count=count)
    phase.server_total_ms = client.server_total_ms
    print(phase.summary().line(), dict(Counter(phase.outcomes)))
    return phase


async def grpc_phases(
    target: Target, args: argparse.Namespace, vectors: list[list[float]], metrics_port: int
) -> tuple[list[Phase], dict[str, Any]]:
    client = Client(target, args.users, seed=11)
    texts = iter(corpus.queries(200_000, seed=5))
    phases: list[Phase] = []

    def recall_text(timeout_s: float) -> Call:
        async def call(_i: int) -> str:
            request = pb.RecallRequest(scope=pb.Scope(user_id=client.user()), query=next(texts))
            return await client.recall(request, timeout_s)

        return call

    async def recall_vector(i: int) -> str:
        request = pb.RecallRequest(
            scope=pb.Scope(user_id=client.user()), query_vector=vectors[i % len(vectors)]
        )
        return await client.recall(request, 1.0)

    warm_users = [f"user-{u:05d}" for u in range(min(args.users, 200))]

    async def prefetch_cached(i: int) -> str:
        request = pb.PrefetchRequest(scope=pb.Scope(user_id=warm_users[i % len(warm_users)]))
        return await client.prefetch(request, 1.0)

    async def prefetch_built(i: int) -> str:
        request = pb.PrefetchRequest(
            scope=pb.Scope(user_id=client.user()), hint=f"{next(texts)} #{i}"
        )
        return await client.prefetch(request, 1.0)

    try:
        await run_phase(client, "warm-up", recall_text(1.0), args.rate, 100)
        for user in warm_users:  # fill the cache for the cached-Prefetch phase
            await client.prefetch(pb.PrefetchRequest(scope=pb.Scope(user_id=user)), 2.0)
        if args.overload_only:
            return await overload_runs(client, recall_text, args, metrics_port)
        rate, count = args.rate, args.count
        phases.append(await run_phase(client, "Recall text", recall_text(1.0), rate, count))
        phases.append(await run_phase(client, "Recall vector", recall_vector, rate, count))
        phases.append(await run_phase(client, "Prefetch cached", prefetch_cached, rate, count))
        phases.append(await run_phase(client, "Prefetch built", prefetch_built, rate, count))
        phases.append(await run_phase(client, TRANSPORT, client.health, rate, count))

        capacity = 0.0
        steps: list[dict[str, Any]] = []
        for step_rate in args.capacity_rates:
            phase = await run_phase(
                client,
                f"capacity {step_rate:g}/s",
                recall_text(2.0),
                step_rate,
                int(step_rate * STEP_SECONDS),
            )
            summary = phase.summary()
            good = summary.errors == 0 and summary.p99_ms <= CAPACITY_P99_MS
            steps.append({"rate_per_s": step_rate, "ok": good, **phase.as_dict()})
            if good:
                capacity = step_rate
            elif summary.p99_ms > 4 * CAPACITY_P99_MS:
                break  # far past saturation: higher rates say nothing new
        overload_rate = max(2 * capacity, 2 * args.rate)
        before = server_recall_codes(metrics_port)
        overload = await run_phase(
            client,
            f"overload {overload_rate:g}/s 200ms",
            recall_text(OVERLOAD_DEADLINE_S),
            overload_rate,
            int(overload_rate * 10),
        )
        phases.append(overload)
        server_side = server_recall_codes(metrics_port)
        server_side.subtract(before)
        print(f"overload, as the server answered: {dict(+server_side)}")
        gc_pauses = server_gc_pauses(metrics_port)
        print(f"server garbage collections (count, total ms) by generation: {gc_pauses}")
        return phases, {
            "capacity_per_s": capacity,
            "steps": steps,
            "overload": overload,
            "overload_server_codes": dict(+server_side),
            "gc_pauses": gc_pauses,
        }
    finally:
        await client.close()


async def overload_runs(
    client: Client,
    recall_text: Callable[[float], Call],
    args: argparse.Namespace,
    metrics_port: int,
) -> tuple[list[Phase], dict[str, Any]]:
    """Only the overload phase, ``--overload-runs`` times at ``--overload-only`` calls/s
    (A/B comparisons of settings need several runs: one varies a lot on a shared box)."""
    runs: list[dict[str, Any]] = []
    for n in range(args.overload_runs):
        await asyncio.sleep(2.0)  # let the previous run's stragglers finish
        before = server_recall_codes(metrics_port)
        phase = await run_phase(
            client,
            f"overload {args.overload_only:g}/s 200ms #{n + 1}",
            recall_text(OVERLOAD_DEADLINE_S),
            args.overload_only,
            int(args.overload_only * 10),
        )
        server_side = server_recall_codes(metrics_port)
        server_side.subtract(before)
        print(f"  as the server answered: {dict(+server_side)}")
        runs.append(phase.as_dict() | {"server_codes": dict(+server_side)})
    return [], {"overload_runs": runs}


async def floor_phases(
    target: Target, args: argparse.Namespace, vectors: list[list[float]]
) -> list[Phase]:
    """The same calls made directly: embed, both legs' SQL concurrently on two pooled
    connections, the version read and the Redis GET; no gRPC, no fusion, no framing."""
    settings = Settings(pg_dsn=target.pg_dsn, redis_url=target.redis_url)
    pool = await connect_and_migrate(settings)
    redis_client = aioredis.Redis.from_url(target.redis_url)
    embedder = OnnxMiniLMEmbedder(intra_op_threads=1)
    rng = random.Random(13)
    texts = iter(corpus.queries(400_000, seed=17))
    model_id = embedder.model_id

    def scope() -> Scope:
        return Scope(corpus.TENANT, f"user-{rng.randrange(args.users):05d}")

    async def legs(s: Scope, text: str, vector: Any) -> None:
        budget = Budget(2.0)

        async def dense() -> None:
            async with pool.acquire() as conn:
                await dense_hits(
                    conn, s, vector, DEFAULT_KINDS, model_id=model_id, limit=50,
                    exact_max_rows=2000, as_of=None, budget=budget, delays={},
                )  # fmt: skip

        async def lexical() -> None:
            async with pool.acquire() as conn:
                await lexical_hits(
                    conn,
                    s,
                    text,
                    DEFAULT_KINDS,
                    limit=50,
                    exact_max_rows=2000,
                    as_of=None,
                    budget=budget,
                    delays={},
                )

        await asyncio.gather(dense(), lexical()) if text else await dense()

    async def recall_text(_i: int) -> str:
        text = next(texts)
        [vector] = await embedder.embed([text], timeout_s=2.0)
        await legs(scope(), text, vector)
        return "ok"

    async def recall_vector(i: int) -> str:
        await legs(scope(), "", np.asarray(vectors[i % len(vectors)], dtype=np.float32))
        return "ok"

    warm = [f"user-{u:05d}" for u in range(min(args.users, 200))]

    async def prefetch_cached(i: int) -> str:
        s = Scope(corpus.TENANT, warm[i % len(warm)])
        shape = PrefetchQuery(s, "", "", settings.packet_default_chars).shape()

        async def version() -> int:
            async with pool.acquire() as conn:
                return await versions.current_version(conn, s.tenant_id, s.user_id)

        # Both round trips at once, as the service makes them.
        current, raw = await asyncio.gather(
            version(), redis_client.get(packet_key(s.tenant_id, s.user_id, shape))
        )
        return "hit" if raw and pb.PrefetchResponse.FromString(raw).version == current else "miss"

    async def prefetch_built(i: int) -> str:
        s = scope()
        hint = f"{next(texts)} #{i}"
        [vector] = await embedder.embed([hint], timeout_s=2.0)

        async def core() -> None:
            async with pool.acquire() as conn:
                await prefetch_sql.core_facts(conn, s, core_role="core", limit=40, timeout_s=2)

        async def relevant() -> None:
            budget = Budget(2.0)
            async with pool.acquire() as conn:
                await versions.current_version(conn, s.tenant_id, s.user_id)
                topics = await prefetch_sql.topics(
                    conn, s, hint=hint, vector=vector, model_id=model_id, patterns=[],
                    limit=500, timeout_s=2,
                )  # fmt: skip
                edges = await prefetch_sql.episodes(
                    conn, s, topic_ids=[t.topic_id for t in topics[:8]], recent=8, limit=500,
                    timeout_s=2,
                )  # fmt: skip
                await prefetch_sql.walk_facts(
                    conn, s, episode_ids=[e.episode.episode_id for e in edges[:8]], limit=80,
                    timeout_s=2,
                )  # fmt: skip
                await dense_hits(
                    conn, s, vector, (ItemKind.FACT,), model_id=model_id, limit=40,
                    exact_max_rows=2000, as_of=None, budget=budget, delays={},
                )  # fmt: skip
                await lexical_hits(
                    conn, s, hint, (ItemKind.FACT,), limit=40, exact_max_rows=2000, as_of=None,
                    budget=budget,
                    delays={},
                )  # fmt: skip

        await asyncio.gather(core(), relevant())
        return "miss"

    phases: list[Phase] = []
    try:
        await open_loop("warm-up", recall_text, rate_per_s=args.rate, count=100)
        for name, call in (
            ("floor Recall text", recall_text),
            ("floor Recall vector", recall_vector),
            ("floor Prefetch cached", prefetch_cached),
            ("floor Prefetch built", prefetch_built),
        ):
            phase = await open_loop(name, call, rate_per_s=args.rate, count=args.count)
            print(phase.summary().line(), dict(Counter(phase.outcomes)))
            phases.append(phase)
        return phases
    finally:
        await embedder.aclose()
        await redis_client.aclose()
        await pool.close()


async def client_vectors(count: int) -> list[list[float]]:
    embedder = OnnxMiniLMEmbedder(intra_op_threads=2)
    try:
        texts = corpus.queries(count, seed=23)
        out = []
        for i in range(0, count, 256):
            out.extend(v.tolist() for v in await embedder.embed(texts[i : i + 256]))
        return out
    finally:
        await embedder.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--memories-per-user", type=int, default=100)
    parser.add_argument("--messages-per-user", type=int, default=50)
    parser.add_argument("--rate", type=float, default=50.0, help="calls per second (open loop)")
    parser.add_argument("--count", type=int, default=1000, help="calls per phase")
    parser.add_argument(
        "--capacity-rates",
        type=lambda raw: [float(r) for r in raw.split(",")],
        default=[50.0, 100.0, 150.0, 200.0, 250.0],
    )
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="MEMSVC_X=value",
        help="extra server setting (repeatable), e.g. MEMSVC_READS_MAX_IN_FLIGHT=16",
    )
    parser.add_argument(
        "--overload-only",
        type=float,
        default=0.0,
        metavar="RATE",
        help="run only the overload phase at RATE calls/s (no floor, no plot)",
    )
    parser.add_argument("--overload-runs", type=int, default=1, help="with --overload-only")
    args = parser.parse_args()
    metrics_port = free_port()
    server_env = dict(SERVER_ENV) | {"MEMSVC_METRICS_PORT": str(metrics_port)}
    for pair in args.server_env:
        name, _, value = pair.partition("=")
        server_env[name] = value
    with served_stack(server_env) as target:
        seeded = asyncio.run(
            corpus.seed(
                target.pg_dsn,
                users=args.users,
                memories_per_user=args.memories_per_user,
                messages_per_user=args.messages_per_user,
            )
        )
        print(f"corpus: {seeded}")
        vectors = asyncio.run(client_vectors(500))
        phases, capacity = asyncio.run(grpc_phases(target, args, vectors, metrics_port))
        if args.overload_only:
            write_overload_runs(args, server_env, capacity["overload_runs"])
            return
        floors = asyncio.run(floor_phases(target, args, vectors))

    ratios = {}
    transport = next(p for p in phases if p.name == TRANSPORT).summary()
    for phase, floor in zip(phases[:4], floors, strict=True):
        ours, base = phase.summary(), floor.summary()
        ratios[phase.name] = {
            "p50": ours.p50_ms / base.p50_ms if base.p50_ms else None,
            "p99": ours.p99_ms / base.p99_ms if base.p99_ms else None,
            # What is left once the floor's work and a bare gRPC round trip are taken off.
            "own_overhead_p50_ms": ours.p50_ms - base.p50_ms - transport.p50_ms,
        }
        print(
            f"{phase.name:<16} service/floor p50 x{ratios[phase.name]['p50']:.2f}"
            f"  p99 x{ratios[phase.name]['p99']:.2f}"
            f"  (p50 = floor {base.p50_ms:.2f} + transport {transport.p50_ms:.2f}"
            f" + memsvc {ratios[phase.name]['own_overhead_p50_ms']:+.2f} ms)"
        )
    overload: Phase = capacity["overload"]
    print(f"capacity (p99 <= {CAPACITY_P99_MS:g} ms): {capacity['capacity_per_s']:g} Recall/s")
    print(f"overload outcomes: {dict(Counter(overload.outcomes))}")

    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = RESULTS_DIR / f"recall-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "args": {k: v for k, v in vars(args).items()},
                "server_env": server_env,
                "corpus": asdict(seeded),
                "phases": {p.name: p.as_dict() for p in phases},
                "floor": {p.name: p.as_dict() for p in floors},
                "service_over_floor": ratios,
                "capacity_per_s": capacity["capacity_per_s"],
                "server_gc_pauses": capacity["gc_pauses"],
                "capacity_steps": capacity["steps"],
                "overload": overload.as_dict()
                | {
                    "deadline_s": OVERLOAD_DEADLINE_S,
                    "server_codes": capacity["overload_server_codes"],
                },
            },
            indent=2,
        )
    )
    plot = RESULTS_DIR / f"recall-{stamp}.png"
    series = [
        (f"{p.name} {p.rate_per_s:g}/s", [x * 1000 for x in p.latencies_s]) for p in phases
    ] + [(p.name, [x * 1000 for x in p.latencies_s]) for p in floors]
    latency_cdf_png(plot, series, title="memsvc read path latency (open loop)")
    print(f"written {out} and {plot}")


def write_overload_runs(
    args: argparse.Namespace, server_env: dict[str, str], runs: list[dict[str, Any]]
) -> None:
    totals: Counter[str] = Counter()
    for run in runs:
        totals.update(run["outcomes"])
    print(f"overload outcomes over {len(runs)} runs: {dict(totals)}")
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"overload-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {"args": vars(args), "server_env": server_env, "runs": runs, "totals": totals},
            indent=2,
        )
    )
    print(f"written {out}")


if __name__ == "__main__":
    main()
