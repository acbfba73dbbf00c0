"""Remember latency over gRPC (open loop, fixed rate) against the floor (same work, direct).

python -m bench.remember [--rate 50] [--count 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import grpc
import redis.asyncio as aioredis

from bench.harness import RESULTS_DIR, Summary, Target, open_loop, served_stack, summarize
from memsvc.cache.invalidation import PacketInvalidator
from memsvc.concurrency.deadline import Budget
from memsvc.config import Settings
from memsvc.embedding.onnx_minilm import OnnxMiniLMEmbedder
from memsvc.memories.service import MemoryService
from memsvc.storage.model import NewMemory, Scope
from memsvc.storage.pool import connect_and_migrate
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc

USERS = 100


def content(i: int, tag: str) -> str:
    return f"{tag} fact {i}: user {i % USERS} mentioned they enjoy hiking near lake number {i}"


async def bench_grpc(target: Target, rate: float, count: int) -> list[Summary]:
    metadata = (("x-api-key", target.api_key),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)

        async def new_fact(i: int) -> None:
            await stub.Remember(
                pb.RememberRequest(
                    scope=pb.Scope(user_id=f"u{i % USERS}"), content=content(i, "grpc")
                ),
                metadata=metadata,
                timeout=2,
            )

        async def duplicate(i: int) -> None:
            await stub.Remember(
                pb.RememberRequest(
                    scope=pb.Scope(user_id=f"u{i % USERS}"), content=content(i % 50, "grpc")
                ),
                metadata=metadata,
                timeout=2,
            )

        await open_loop(lambda i: new_fact(count * 10 + i), rate_per_s=rate, count=50)  # warm-up
        out = []
        lat, err, wall = await open_loop(new_fact, rate_per_s=rate, count=count)
        out.append(summarize("grpc Remember (new)", lat, err, wall))
        lat, err, wall = await open_loop(duplicate, rate_per_s=rate, count=count)
        out.append(summarize("grpc Remember (reinforce)", lat, err, wall))
        return out


async def bench_floor(target: Target, rate: float, count: int) -> list[Summary]:
    """The same embed + SQL transaction + Redis invalidation, called directly in this process."""
    settings = Settings(pg_dsn=target.pg_dsn, redis_url=target.redis_url)
    pool = await connect_and_migrate(settings)
    client = aioredis.Redis.from_url(target.redis_url)
    embedder = OnnxMiniLMEmbedder(intra_op_threads=1)
    service = MemoryService(
        pool,
        embedder,
        PacketInvalidator(client, timeout_s=0.05),
        acquire_timeout_s=1.0,
        embed_timeout_s=2.0,
    )
    try:

        async def new_fact(i: int) -> None:
            await service.remember(
                Scope("floor", f"u{i % USERS}"),
                NewMemory(
                    content=content(i, "floor"), category="context", role="context", confidence=0.9
                ),
                Budget(2.0),
            )

        await open_loop(lambda i: new_fact(count * 10 + i), rate_per_s=rate, count=50)
        lat, err, wall = await open_loop(new_fact, rate_per_s=rate, count=count)
        return [summarize("floor Remember (new)", lat, err, wall)]
    finally:
        await embedder.aclose()
        await client.aclose()
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=50.0, help="calls per second (open loop)")
    parser.add_argument("--count", type=int, default=1000)
    args = parser.parse_args()
    with served_stack() as target:
        grpc_results = asyncio.run(bench_grpc(target, args.rate, args.count))
        floor_results = asyncio.run(bench_floor(target, args.rate, args.count))
    results = grpc_results + floor_results
    for r in results:
        print(r.line())
    ratio_p50 = grpc_results[0].p50_ms / floor_results[0].p50_ms
    ratio_p99 = grpc_results[0].p99_ms / floor_results[0].p99_ms
    print(f"service / floor (new facts): p50 x{ratio_p50:.2f}, p99 x{ratio_p99:.2f}")
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"remember-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "rate_per_s": args.rate,
                "count": args.count,
                "results": [r.as_dict() for r in results],
                "ratio_p50": ratio_p50,
                "ratio_p99": ratio_p99,
            },
            indent=2,
        )
    )
    print(f"written {out}")


if __name__ == "__main__":
    main()
