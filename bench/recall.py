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
   (a distinct hint per call: embedding + walk + store), a filtered text Recall (categories
   and a time range, FILTERED: facts only, in SQL on both legs), and the transport alone (a
   gRPC Health/Check to the same server on the same channel);
2. capacity: Recall text at rising rates; the highest with p99 <= 200 ms and no errors
   (a rate whose p99, failures counted at their 2 s deadline, is past 800 ms ends the climb);
3. overload: twice that rate with 200 ms deadlines; every answer is classified (OK, OK but
   degraded, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, other);
4. the floor: the same embedding, SQL and Redis calls made directly from this process, with
   the service's concurrency (a text Recall embeds while its lexical leg runs).

Percentiles are over every call, a failed or late one counted at its deadline, beside the
same over the calls answered in time (bench/harness.py). Each ratio to the floor is printed
with its parts: floor + transport + memsvc's own overhead.

``--overload-only RATE`` runs only phase 3, ``--overload-runs`` times, to compare server
settings (one run varies a lot on a shared machine). Each phase's latencies are kept in call
order in the JSON, and the server's garbage-collection pauses are reported.

Client, server and PostgreSQL share the machine's cores. Results: bench/results/recall-*.json
and a latency CDF plot recall-*.png.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import numpy as np
import redis.asyncio as aioredis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from redis.asyncio.cluster import RedisCluster

from bench import corpus
from bench.harness import (
    Call,
    Phase,
    Target,
    free_port,
    open_loop,
    ratio_line,
    ratio_row,
    result_paths,
    served_stack,
    write_result,
)
from bench.plots import latency_cdf
from memsvc.cache.keys import packet_key, user_index_key
from memsvc.cache.packets import STORE_SCRIPT
from memsvc.concurrency.deadline import Budget
from memsvc.config import Settings
from memsvc.embedding.onnx_minilm import OnnxMiniLMEmbedder
from memsvc.prefetch import queries as prefetch_sql
from memsvc.prefetch.model import PrefetchQuery
from memsvc.retrieval.dense import dense_hits
from memsvc.retrieval.lexical import lexical_hits
from memsvc.retrieval.query import DEFAULT_KINDS, ItemKind, RecallFilters
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
CAPACITY_DEADLINE_S = 2.0
STEP_SECONDS = 8.0
TRANSPORT = "gRPC transport"

DEADLINE_S = 1.0
# What the Prefetch floor stores for a built packet: about the size of one of this corpus's.
PACKET_STAND_IN = b"x" * 2048


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


# The filtered Recall scenario: two categories (of the corpus's six) and the last 180 days
# (of its year): a fact-only filter, so the legs search facts only.
FILTER_CATEGORIES = ("preference", "event")
FILTER_SINCE_DAYS = 180


def filtered_since() -> datetime:
    return datetime.now(UTC) - timedelta(days=FILTER_SINCE_DAYS)


class Client:
    """Calls against the served memsvc, each returning its outcome."""

    def __init__(self, target: Target, users: int, seed: int, *, channels: int = 1) -> None:
        """``channels``: connections the calls take in turn (a server with --processes
        spreads connections, not calls; each channel keeps its own connection)."""
        options = [("grpc.use_local_subchannel_pool", 1)] if channels > 1 else []
        self._channels = [
            grpc.aio.insecure_channel(f"127.0.0.1:{target.port}", options=options)
            for _ in range(channels)
        ]
        self._stubs = [memory_pb2_grpc.MemoryServiceStub(c) for c in self._channels]
        self._turn = 0
        self._health = health_pb2_grpc.HealthStub(self._channels[0])
        self._metadata = (("x-api-key", target.api_key),)
        self._users = users
        self._rng = random.Random(seed)
        self.server_total_ms: list[float] = []

    @property
    def _stub(self) -> memory_pb2_grpc.MemoryServiceStub:
        stub = self._stubs[self._turn]
        self._turn = (self._turn + 1) % len(self._stubs)
        return stub

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
            pb.CACHE_STATUS_SKIPPED: "skipped",
        }[reply.cache]

    async def health(self, _i: int) -> str:
        """The transport alone: a Health/Check on the same channel to the same server process
        (no auth, no database), so service - floor - transport is memsvc's own overhead."""
        await self._health.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S)
        return "ok"

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close(None)


async def run_phase(
    client: Client,
    name: str,
    call: Call,
    rate: float,
    count: int,
    deadline_s: float = DEADLINE_S,
) -> Phase:
    """One open-loop phase; ``call`` must give up after ``deadline_s``."""
    client.server_total_ms = []
    phase = await open_loop(name, call, rate_per_s=rate, count=count, deadline_s=deadline_s)
    phase.server_total_ms = client.server_total_ms
    print(phase.summary().line(), phase.outcome_counts())
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
        return await client.recall(request, DEADLINE_S)

    async def recall_filtered(_i: int) -> str:
        request = pb.RecallRequest(
            scope=pb.Scope(user_id=client.user()),
            query=next(texts),
            filters=pb.RecallFilters(categories=FILTER_CATEGORIES),
        )
        request.filters.since.FromDatetime(filtered_since())
        return await client.recall(request, DEADLINE_S)

    warm_users = [f"user-{u:05d}" for u in range(min(args.users, 200))]

    async def prefetch_cached(i: int) -> str:
        request = pb.PrefetchRequest(scope=pb.Scope(user_id=warm_users[i % len(warm_users)]))
        return await client.prefetch(request, DEADLINE_S)

    async def prefetch_built(i: int) -> str:
        request = pb.PrefetchRequest(
            scope=pb.Scope(user_id=client.user()), hint=f"{next(texts)} #{i}"
        )
        return await client.prefetch(request, DEADLINE_S)

    try:
        await run_phase(client, "warm-up", recall_text(DEADLINE_S), args.rate, 100)
        for user in warm_users:  # fill the cache for the cached-Prefetch phase
            await client.prefetch(pb.PrefetchRequest(scope=pb.Scope(user_id=user)), 2.0)
        if args.overload_only:
            return await overload_runs(client, recall_text, args, metrics_port)
        rate, count = args.rate, args.count
        phases.append(await run_phase(client, "Recall text", recall_text(DEADLINE_S), rate, count))
        phases.append(await run_phase(client, "Recall vector", recall_vector, rate, count))
        phases.append(await run_phase(client, "Prefetch cached", prefetch_cached, rate, count))
        phases.append(await run_phase(client, "Prefetch built", prefetch_built, rate, count))
        phases.append(await run_phase(client, "Recall filtered", recall_filtered, rate, count))
        phases.append(await run_phase(client, TRANSPORT, client.health, rate, count))

        capacity = 0.0
        steps: list[dict[str, Any]] = []
        for step_rate in args.capacity_rates:
            phase = await run_phase(
                client,
                f"capacity {step_rate:g}/s",
                recall_text(CAPACITY_DEADLINE_S),
                step_rate,
                int(step_rate * STEP_SECONDS),
                CAPACITY_DEADLINE_S,
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
            OVERLOAD_DEADLINE_S,
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
            OVERLOAD_DEADLINE_S,
        )
        server_side = server_recall_codes(metrics_port)
        server_side.subtract(before)
        print(f"  as the server answered: {dict(+server_side)}")
        runs.append(phase.as_dict() | {"server_codes": dict(+server_side)})
    return [], {"overload_runs": runs}


async def floor_phases(
    target: Target, args: argparse.Namespace, vectors: list[list[float]]
) -> list[Phase]:
    """The same calls made directly, with the service's concurrency: for a text Recall the
    embedding runs beside the lexical leg and the dense leg's SQL follows it, each leg on
    its own pooled connection; a vector Recall is the dense leg alone; Prefetch reads the
    version beside the Redis GET, and a built packet runs its core read beside the hint's
    embedding and walk, then stores the packet. No gRPC, fusion, ranking or framing."""
    settings = Settings(pg_dsn=target.pg_dsn, redis_url=target.redis_url)
    pool = await connect_and_migrate(settings)
    redis_client: aioredis.Redis | RedisCluster = (
        RedisCluster.from_url(target.redis_url)
        if args.redis_cluster
        else aioredis.Redis.from_url(target.redis_url)
    )
    embedder = OnnxMiniLMEmbedder(intra_op_threads=1)
    rng = random.Random(13)
    texts = iter(corpus.queries(400_000, seed=17))
    model_id = embedder.model_id

    def scope() -> Scope:
        return Scope(corpus.TENANT, f"user-{rng.randrange(args.users):05d}")

    unfiltered = RecallFilters()

    async def dense(
        s: Scope, vector: Any, budget: Budget, filters: RecallFilters = unfiltered
    ) -> None:
        async with pool.acquire() as conn:
            await dense_hits(
                conn, s, vector, filters.kinds(DEFAULT_KINDS), model_id=model_id, limit=50,
                exact_max_rows=2000, as_of=None, budget=budget, filters=filters,
            )  # fmt: skip

    async def lexical(
        s: Scope, text: str, budget: Budget, filters: RecallFilters = unfiltered
    ) -> None:
        # As the hybrid service does: the hits' embeddings too (relevance of lexical hits).
        async with pool.acquire() as conn:
            await lexical_hits(
                conn, s, text, filters.kinds(DEFAULT_KINDS), limit=50, exact_max_rows=2000,
                as_of=None, budget=budget, filters=filters, embedding_model=model_id,
            )  # fmt: skip

    async def hybrid(filters: RecallFilters) -> str:
        s, text, budget = scope(), next(texts), Budget(DEADLINE_S)

        async def dense_leg() -> None:
            [vector] = await embedder.embed([text], timeout_s=DEADLINE_S)
            await dense(s, vector, budget, filters)

        await asyncio.gather(dense_leg(), lexical(s, text, budget, filters))
        return "ok"

    async def recall_text(_i: int) -> str:
        return await hybrid(unfiltered)

    async def recall_filtered(_i: int) -> str:
        return await hybrid(RecallFilters(categories=FILTER_CATEGORIES, since=filtered_since()))

    async def recall_vector(i: int) -> str:
        vector = np.asarray(vectors[i % len(vectors)], dtype=np.float32)
        await dense(scope(), vector, Budget(DEADLINE_S))
        return "ok"

    warm = [f"user-{u:05d}" for u in range(min(args.users, 200))]

    async def version(s: Scope) -> int:
        async with pool.acquire() as conn:
            return await versions.current_version(conn, s.tenant_id, s.user_id)

    async def prefetch_cached(i: int) -> str:
        s = Scope(corpus.TENANT, warm[i % len(warm)])
        shape = PrefetchQuery(s, "", "", settings.packet_default_chars).shape()
        # Both round trips at once, as the service makes them.
        current, raw = await asyncio.gather(
            version(s), redis_client.get(packet_key(s.tenant_id, s.user_id, shape))
        )
        hit = isinstance(raw, bytes) and pb.PrefetchResponse.FromString(raw).version == current
        return "hit" if hit else "miss"

    async def prefetch_built(i: int) -> str:
        s = scope()
        hint = f"{next(texts)} #{i}"
        shape = PrefetchQuery(s, "", hint, settings.packet_default_chars).shape()
        key = packet_key(s.tenant_id, s.user_id, shape)
        await asyncio.gather(version(s), redis_client.get(key))

        async def core() -> None:
            async with pool.acquire() as conn:
                await prefetch_sql.core_facts(conn, s, core_role="core", limit=40, timeout_s=2)

        async def relevant() -> None:
            budget = Budget(DEADLINE_S)
            [vector] = await embedder.embed([hint], timeout_s=DEADLINE_S)
            async with pool.acquire() as conn:
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
                    exact_max_rows=2000, as_of=None, budget=budget,
                )  # fmt: skip
                await lexical_hits(
                    conn, s, hint, (ItemKind.FACT,), limit=40, exact_max_rows=2000, as_of=None,
                    budget=budget,
                )  # fmt: skip

        await asyncio.gather(core(), relevant())
        # The packet stored as the service stores it (a stand-in of a packet's size).
        index = user_index_key(s.tenant_id, s.user_id)
        ttl_ms = settings.packet_ttl_s * 1000
        await redis_client.eval(
            STORE_SCRIPT, 2, key, index, PACKET_STAND_IN, ttl_ms, settings.packet_ttl_s
        )
        return "miss"

    phases: list[Phase] = []
    try:
        await open_loop(
            "warm-up", recall_text, rate_per_s=args.rate, count=100, deadline_s=DEADLINE_S
        )
        for name, call in (
            ("floor Recall text", recall_text),
            ("floor Recall vector", recall_vector),
            ("floor Prefetch cached", prefetch_cached),
            ("floor Prefetch built", prefetch_built),
            ("floor Recall filtered", recall_filtered),
        ):
            phase = await open_loop(
                name, call, rate_per_s=args.rate, count=args.count, deadline_s=DEADLINE_S
            )
            print(phase.summary().line(), phase.outcome_counts())
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
        out: list[list[float]] = []
        for i in range(0, count, 256):
            out.extend(v.tolist() for v in await embedder.embed(texts[i : i + 256]))
        return out
    finally:
        await embedder.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    corpus.add_arguments(parser, users=1000, memories_per_user=100, messages_per_user=50)
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
    parser.add_argument(
        "--citus",
        action="store_true",
        help="the database on a Citus coordinator with two workers, all on this machine",
    )
    parser.add_argument(
        "--redis-cluster",
        action="store_true",
        help="the packet cache on a 3-master valkey cluster (the floor uses a cluster client)",
    )
    args = parser.parse_args()
    metrics_port = free_port()
    server_env = dict(SERVER_ENV) | {"MEMSVC_METRICS_PORT": str(metrics_port)}
    for pair in args.server_env:
        name, _, value = pair.partition("=")
        server_env[name] = value
    with served_stack(server_env, redis_cluster=args.redis_cluster, citus=args.citus) as target:
        seeded = corpus.seed_from_args(target.pg_dsn, args)
        vectors = asyncio.run(client_vectors(500))
        phases, capacity = asyncio.run(grpc_phases(target, args, vectors, metrics_port))
        if args.overload_only:
            write_overload_runs(args, server_env, capacity["overload_runs"])
            return
        floors = asyncio.run(floor_phases(target, args, vectors))

    transport = next(p for p in phases if p.name == TRANSPORT).summary()
    ratios = []
    for phase, floor in zip(phases[:5], floors, strict=True):
        ours, base = phase.summary(), floor.summary()
        # What is left once the floor's work and a bare gRPC round trip are taken off.
        own_ms = ours.p50_ms - base.p50_ms - transport.p50_ms
        ratios.append(ratio_row(ours, base) | {"own_overhead_p50_ms": round(own_ms, 2)})
        print(
            f"{ratio_line(ratios[-1])}  (p50 = floor {base.p50_ms:.2f} + transport "
            f"{transport.p50_ms:.2f} + memsvc {own_ms:+.2f} ms)"
        )
    overload: Phase = capacity["overload"]
    overload_codes = capacity["overload_server_codes"]
    notes = [
        f"corpus: {seeded.memories:,} memories and {seeded.messages:,} messages over "
        f"{args.users:,} users",
        f"transport (a gRPC Health/Check to the same server): p50 {transport.p50_ms:.2f} ms; "
        + "; ".join(
            f"{r['phase']}: floor + transport + memsvc {r['own_overhead_p50_ms']:+.2f} ms at p50"
            for r in ratios
        ),
        f"capacity (text Recall, p99 <= {CAPACITY_P99_MS:g} ms, no error): "
        f"{capacity['capacity_per_s']:g} calls/s",
        f"overload at {overload.rate_per_s:g} calls/s with {OVERLOAD_DEADLINE_S * 1000:g} ms "
        f"deadlines: {overload.outcome_counts()} (as the server answered: {overload_codes})",
    ]
    for note in notes[2:]:
        print(note)

    # Its own kind: bench/report.py shows the newest result of each.
    parts = [
        name for name, on in (("citus", args.citus), ("valkey-cluster", args.redis_cluster)) if on
    ]
    kind = "-".join([*parts, "recall"])
    out, plot = result_paths(kind)
    write_result(
        out,
        {
            "args": dict(vars(args)),
            "server_env": server_env,
            "corpus": asdict(seeded),
            "phases": {p.name: p.as_dict() for p in phases},
            "floor": {p.name: p.as_dict() for p in floors},
            "service_over_floor": ratios,
            "capacity_per_s": capacity["capacity_per_s"],
            "server_gc_pauses": capacity["gc_pauses"],
            "capacity_steps": capacity["steps"],
            "overload": overload.as_dict()
            | {"deadline_s": OVERLOAD_DEADLINE_S, "server_codes": overload_codes},
        },
        {
            "title": (
                f"Recall and Prefetch, {args.rate:g} calls/s open loop, {args.count} calls a "
                "phase; capacity and overload"
                + ("; packet cache on a 3-master valkey cluster" if args.redis_cluster else "")
                + ("; database on Citus (coordinator + 2 workers)" if args.citus else "")
            ),
            "rows": [p.summary().as_dict() for p in phases + floors],
            "ratios": ratios,
            "notes": notes,
        },
    )
    latency_cdf(
        plot,
        [(p.name, p.counted_ms()) for p in phases + floors],
        title=(
            f"Recall and Prefetch latency, open loop at {args.rate:g} calls/s (overload: "
            f"{overload.rate_per_s:g}/s), failed or late calls at the deadline"
        ),
        floors={r["floor"]: r["phase"] for r in ratios},
    )
    print(f"written {plot}")


def write_overload_runs(
    args: argparse.Namespace, server_env: dict[str, str], runs: list[dict[str, Any]]
) -> None:
    totals: Counter[str] = Counter()
    for run in runs:
        totals.update(run["outcomes"])
    print(f"overload outcomes over {len(runs)} runs: {dict(totals)}")
    out, _plot = result_paths("overload")
    write_result(
        out,
        {"args": vars(args), "server_env": server_env, "runs": runs, "totals": totals},
        {"title": f"Overload only, {len(runs)} runs", "rows": [], "ratios": [], "notes": []},
    )


if __name__ == "__main__":
    main()
