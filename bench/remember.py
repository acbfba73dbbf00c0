"""Remember latency over gRPC (open loop, fixed rate) against the floor (same work, direct).

    python -m bench.remember [--rate 50] [--count 1000] [--batch-rate 2] [--batch-count 100]
    python -m bench.remember --batch-only --batch-count 10     # RememberBatch alone, quickly

Two phases, each over gRPC to `memsvc serve` in its own process and then as the floor:
new facts (a duplicate check, an embedding, the INSERT and the version bump in one
transaction, the cache invalidation) and reinforcements of facts already stored (no
embedding; the upsert reinforces). The floor is that embedding and those SQL and Redis
calls made directly from this process with asyncpg and redis (bench/direct_writes.py).
A third phase, "RememberBatch (100)", stores 100 new facts of one user per call; its floor
is the same 100 rows written the fastest direct way: one embedder call for the 100 contents,
one multi-row upsert (memsvc's own statement), the version bump and the cache invalidation.
Results: bench/results/remember-*.json and a latency CDF plot remember-*.png.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable

import grpc
import redis.asyncio as aioredis

from bench import direct_writes
from bench.harness import (
    Call,
    Phase,
    Target,
    open_loop,
    ratio_line,
    ratio_row,
    result_paths,
    served_stack,
    write_result,
)
from bench.plots import latency_cdf
from memsvc.config import Settings
from memsvc.embedding.onnx_minilm import OnnxMiniLMEmbedder
from memsvc.storage.model import Scope
from memsvc.storage.pool import connect_and_migrate
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc

USERS = 100
DEADLINE_S = 2.0
WARM_UP = 50
BATCH_ITEMS = 100
# 100 embeddings and 100 rows a call: a longer deadline than one Remember's.
BATCH_DEADLINE_S = 5.0
BATCH_WARM_UP = 3


def content(i: int, tag: str) -> str:
    return f"{tag} fact {i}: user {i % USERS} mentioned they enjoy hiking near lake number {i}"


def fact(i: int, count: int, phase: str) -> tuple[str, int]:
    """(user, fact number) of call ``i``: a new fact, or one of the first ``USERS`` facts the
    "new" phase stored (fact k belongs to user k % USERS), each reinforced count/USERS times."""
    if phase == "warm-up":
        return f"u{i % USERS}", count * 10 + i
    n = i if phase == "new" else i % USERS
    return f"u{n % USERS}", n


def batch_contents(i: int, tag: str) -> tuple[str, list[str]]:
    """(user, contents) of batch call ``i``: 100 facts never stored before."""
    return f"b{i % USERS}", [
        f"{tag} batch {i} fact {k}: user {i % USERS} keeps a jar of buttons number {k}"
        for k in range(BATCH_ITEMS)
    ]


async def batch_phase(
    prefix: str, call: Callable[[int], Awaitable[str]], rate: float, count: int
) -> Phase:
    """Warm-up calls (ids past the phase's), then the measured RememberBatch phase."""
    await open_loop(
        "batch warm-up",
        lambda i: call(count + i),
        rate_per_s=rate,
        count=BATCH_WARM_UP,
        deadline_s=BATCH_DEADLINE_S,
    )
    run = await open_loop(
        f"{prefix} RememberBatch ({BATCH_ITEMS})",
        call,
        rate_per_s=rate,
        count=count,
        deadline_s=BATCH_DEADLINE_S,
    )
    print(run.summary().line(), run.outcome_counts())
    return run


async def bench_grpc_batch(target: Target, rate: float, count: int) -> Phase:
    metadata = (("x-api-key", target.api_key),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)

        async def call(i: int) -> str:
            user, texts = batch_contents(i, "grpc")
            reply = await stub.RememberBatch(
                pb.RememberBatchRequest(
                    scope=pb.Scope(user_id=user),
                    items=[pb.RememberRequest(content=t) for t in texts],
                    atomic=True,
                ),
                metadata=metadata,
                timeout=BATCH_DEADLINE_S,
            )
            return "new" if reply.succeeded == BATCH_ITEMS else "partial"

        return await batch_phase("grpc", call, rate, count)


async def bench_floor_batch(target: Target, rate: float, count: int) -> Phase:
    settings = Settings(pg_dsn=target.pg_dsn, redis_url=target.redis_url)
    pool = await connect_and_migrate(settings)
    client = aioredis.Redis.from_url(target.redis_url)
    embedder = OnnxMiniLMEmbedder(intra_op_threads=1)
    try:

        async def call(i: int) -> str:
            user, texts = batch_contents(i, "floor")
            return await direct_writes.remember_batch(
                pool, client, embedder, Scope("floor", user), texts, timeout_s=BATCH_DEADLINE_S
            )

        return await batch_phase("floor", call, rate, count)
    finally:
        await embedder.aclose()
        await client.aclose()
        await pool.close()


async def bench_grpc(target: Target, rate: float, count: int) -> list[Phase]:
    metadata = (("x-api-key", target.api_key),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)

        def remember(phase: str) -> Call:
            async def call(i: int) -> str:
                user, n = fact(i, count, phase)
                reply = await stub.Remember(
                    pb.RememberRequest(scope=pb.Scope(user_id=user), content=content(n, "grpc")),
                    metadata=metadata,
                    timeout=DEADLINE_S,
                )
                return "reinforced" if reply.reinforced else "new"

            return call

        return await phases("grpc", remember, rate, count)


async def bench_floor(target: Target, rate: float, count: int) -> list[Phase]:
    """The same embedding, SQL statements and Redis calls, made directly in this process."""
    settings = Settings(pg_dsn=target.pg_dsn, redis_url=target.redis_url)
    pool = await connect_and_migrate(settings)
    client = aioredis.Redis.from_url(target.redis_url)
    embedder = OnnxMiniLMEmbedder(intra_op_threads=1)
    try:

        def remember(phase: str) -> Call:
            async def call(i: int) -> str:
                user, n = fact(i, count, phase)
                return await direct_writes.remember(
                    pool,
                    client,
                    embedder,
                    # Its own tenant: the floor's facts never meet the service's.
                    Scope("floor", user),
                    content(n, "floor"),
                    timeout_s=DEADLINE_S,
                )

            return call

        return await phases("floor", remember, rate, count)
    finally:
        await embedder.aclose()
        await client.aclose()
        await pool.close()


async def phases(
    prefix: str, remember: Callable[[str], Call], rate: float, count: int
) -> list[Phase]:
    await open_loop(
        "warm-up", remember("warm-up"), rate_per_s=rate, count=WARM_UP, deadline_s=DEADLINE_S
    )
    out = []
    for phase, label in (("new", "new"), ("reinforce", "reinforce")):
        run = await open_loop(
            f"{prefix} Remember ({label})",
            remember(phase),
            rate_per_s=rate,
            count=count,
            deadline_s=DEADLINE_S,
        )
        print(run.summary().line(), run.outcome_counts())
        out.append(run)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=50.0, help="calls per second (open loop)")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument(
        "--batch-rate", type=float, default=2.0, help="RememberBatch calls per second"
    )
    parser.add_argument("--batch-count", type=int, default=100, help="RememberBatch calls")
    parser.add_argument(
        "--batch-only", action="store_true", help="only the RememberBatch phase and its floor"
    )
    args = parser.parse_args()
    with served_stack() as target:
        grpc_phases: list[Phase] = []
        floor_phases: list[Phase] = []
        if not args.batch_only:
            grpc_phases = asyncio.run(bench_grpc(target, args.rate, args.count))
            floor_phases = asyncio.run(bench_floor(target, args.rate, args.count))
        grpc_phases.append(asyncio.run(bench_grpc_batch(target, args.batch_rate, args.batch_count)))
        floor_phases.append(
            asyncio.run(bench_floor_batch(target, args.batch_rate, args.batch_count))
        )
    ratios = [
        ratio_row(ours.summary(), floor.summary())
        for ours, floor in zip(grpc_phases, floor_phases, strict=True)
    ]
    for row in ratios:
        print(ratio_line(row))
    out, plot = result_paths("remember_batch" if args.batch_only else "remember")
    every = grpc_phases + floor_phases
    write_result(
        out,
        {
            "rate_per_s": args.rate,
            "count": args.count,
            "batch_rate_per_s": args.batch_rate,
            "batch_count": args.batch_count,
            "batch_items": BATCH_ITEMS,
            "phases": {p.name: p.as_dict() for p in every},
        },
        {
            "title": (
                f"Remember, {args.rate:g} calls/s open loop, {args.count} calls a phase; "
                f"RememberBatch ({BATCH_ITEMS} items), {args.batch_rate:g} calls/s, "
                f"{args.batch_count} calls"
            ),
            "rows": [p.summary().as_dict() for p in every],
            "ratios": ratios,
            "notes": [
                f"reinforce: the first {USERS} facts of the new phase again; "
                + ", ".join(
                    f"{p.name}: {p.outcome_counts()}" for p in every if "reinforce" in p.name
                ),
                f"RememberBatch: {BATCH_ITEMS} new facts of one user per call (atomic); per "
                "fact, its p50 is "
                + ", ".join(
                    f"{p.name}: {p.summary().p50_ms / BATCH_ITEMS:.2f} ms"
                    for p in every
                    if "RememberBatch" in p.name
                ),
            ],
        },
    )
    latency_cdf(
        plot,
        [(p.name, p.counted_ms()) for p in every],
        title=f"Remember latency, {args.rate:g} calls/s open loop (failed calls at the deadline)",
        floors={r["floor"]: r["phase"] for r in ratios},
    )
    print(f"written {plot}")


if __name__ == "__main__":
    main()
