"""Ingest acknowledgement latency (open loop) and end-to-end extraction throughput (rules).

    python -m bench.ingest [--rate 200] [--count 2000] [--sessions 100] [--throughput-count 1000]

Three measurements, each against `memsvc serve` in its own process:
1. ack latency with workers off (the online path alone) and the floor: the same two INSERTs
   in one transaction, made directly with asyncpg (bench/direct_writes.py);
2. ack latency with workers on (extraction competing for the same two cores);
3. throughput: messages per second from the first Ingest until every job has finished,
   counting only jobs that reached `done` (a `dead` job is an error, not throughput).

Results: bench/results/ingest-*.json and a latency CDF plot ingest-*.png.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections import Counter
from datetime import UTC
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from bench import direct_writes
from bench.harness import (
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
from memsvc.storage.model import Scope
from memsvc.storage.pool import connect_and_migrate
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc

SENTENCES = [
    "I live in {city} now.",
    "I'm allergic to {food}.",
    "I love {hobby} on weekends.",
    "My daughter is named {name}.",
    "I work at {company}.",
    "Can you hear me?",
    "I'm planning to visit {city} next spring.",
    "Thanks, that helps a lot.",
]
DEADLINE_S = 2.0
FILL = {
    "city": ["Lisbon", "Oslo", "Kyoto", "Accra", "Quito", "Perth"],
    "food": ["peanuts", "shellfish", "gluten", "kiwi"],
    "hobby": ["hiking", "chess", "baking", "cycling", "sailing"],
    "name": ["Maya", "Ravi", "Lena", "Omar"],
    "company": ["Siemens", "Acme", "Equinor", "Nokia"],
}


def sentence(i: int) -> str:
    template = SENTENCES[i % len(SENTENCES)]
    return template.format(**{k: v[i % len(v)] for k, v in FILL.items()})


def request(i: int, sessions: int) -> pb.IngestRequest:
    user = f"u{i % sessions}"
    sent = Timestamp()
    sent.GetCurrentTime()
    return pb.IngestRequest(
        scope=pb.Scope(user_id=user),
        session_id=f"s-{user}",
        idempotency_key=uuid.uuid4().hex,
        messages=[
            pb.Message(
                message_id=f"m{i}-u",
                sender_id=user,
                role=pb.MESSAGE_ROLE_USER,
                text=sentence(i),
                sent_at=sent,
            ),
            pb.Message(
                message_id=f"m{i}-a",
                sender_id="agent",
                role=pb.MESSAGE_ROLE_ASSISTANT,
                text="Got it, I'll keep that in mind.",
                sent_at=sent,
            ),
        ],
    )


async def ack_latency(target: Target, rate: float, count: int, sessions: int, name: str) -> Phase:
    metadata = (("x-api-key", target.api_key),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)

        async def call(i: int) -> None:
            await stub.Ingest(request(i, sessions), metadata=metadata, timeout=DEADLINE_S)

        async def warm_up(i: int) -> None:
            await call(10_000_000 + i)

        await open_loop("warm-up", warm_up, rate_per_s=rate, count=100, deadline_s=DEADLINE_S)
        phase = await open_loop(name, call, rate_per_s=rate, count=count, deadline_s=DEADLINE_S)
    print(phase.summary().line(), phase.outcome_counts())
    return phase


async def floor_latency(target: Target, rate: float, count: int, sessions: int) -> Phase:
    """The same two INSERTs in one transaction, made directly with asyncpg in this process."""
    pool = await connect_and_migrate(Settings(pg_dsn=target.pg_dsn, redis_url=target.redis_url))
    try:

        async def call(i: int) -> None:
            # The same request the service gets, its messages as the INSERT takes them.
            r = request(20_000_000 + i, sessions)
            await direct_writes.ingest(
                pool,
                Scope("floor", r.scope.user_id),
                r.idempotency_key,
                direct_writes.Turn(
                    session_id=r.session_id,
                    message_ids=[m.message_id for m in r.messages],
                    sender_ids=[m.sender_id for m in r.messages],
                    roles=[
                        "user" if m.role == pb.MESSAGE_ROLE_USER else "assistant"
                        for m in r.messages
                    ],
                    texts=[m.text for m in r.messages],
                    sent_at=[m.sent_at.ToDatetime(tzinfo=UTC) for m in r.messages],
                ),
                timeout_s=DEADLINE_S,
            )

        async def warm_up(i: int) -> None:
            await call(count + i)

        await open_loop("warm-up", warm_up, rate_per_s=rate, count=100, deadline_s=DEADLINE_S)
        phase = await open_loop(
            "floor Ingest (direct SQL)", call, rate_per_s=rate, count=count, deadline_s=DEADLINE_S
        )
        print(phase.summary().line(), phase.outcome_counts())
        return phase
    finally:
        await pool.close()


async def throughput(target: Target, count: int, sessions: int) -> dict[str, Any]:
    """Send `count` ingests as fast as they are acknowledged, then wait until every
    acknowledged job has finished; only the jobs that reached `done` count as throughput."""
    metadata = (("x-api-key", target.api_key),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        started = time.perf_counter()
        ids: list[str] = []
        ack_errors: Counter[str] = Counter()
        for start in range(0, count, 50):
            replies = await asyncio.gather(
                *(
                    stub.Ingest(request(30_000_000 + i, sessions), metadata=metadata, timeout=5)
                    for i in range(start, min(count, start + 50))
                ),
                return_exceptions=True,
            )
            for reply in replies:
                if isinstance(reply, grpc.aio.AioRpcError):
                    ack_errors[reply.code().name] += 1
                elif isinstance(reply, BaseException):
                    raise reply
                else:
                    ids.append(reply.ingest_id)
        acked = time.perf_counter() - started
        # Poll in submission order, a few at a time, from the oldest still pending: jobs are
        # done roughly in that order, and asking for hundreds of statuses twice a second took
        # a large share of the server's event loop, more the longer extraction ran.
        pending = list(ids)
        final: dict[str, int] = {}
        while pending:
            await asyncio.sleep(0.5)
            states = await asyncio.gather(
                *(
                    stub.GetIngestStatus(
                        pb.GetIngestStatusRequest(ingest_id=i), metadata=metadata, timeout=5
                    )
                    for i in pending[:20]
                )
            )
            final |= {
                s.ingest_id: s.state
                for s in states
                if s.state in (pb.INGEST_STATE_DONE, pb.INGEST_STATE_DEAD)
            }
            pending = [i for i in pending if i not in final]
        total = time.perf_counter() - started
    done = sum(state == pb.INGEST_STATE_DONE for state in final.values())
    return {
        "ingests": count,
        "acknowledged": len(ids),
        "ack_errors": dict(ack_errors),
        "done": done,
        "dead": len(final) - done,
        "ack_seconds": round(acked, 2),
        "finished_seconds": round(total, 2),
        # Two messages per job, counted only for jobs that reached `done`.
        "messages_per_s": round(2 * done / total, 2),
        "user_messages_per_s": round(done / total, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--throughput-count", type=int, default=1000)
    args = parser.parse_args()
    with served_stack({"MEMSVC_RUN_WORKERS": "false"}) as target:
        workers_off = asyncio.run(
            ack_latency(target, args.rate, args.count, args.sessions, "grpc Ingest (workers off)")
        )
        floor = asyncio.run(floor_latency(target, args.rate, args.count, args.sessions))
    with served_stack() as target:
        workers_on = asyncio.run(
            ack_latency(target, args.rate, args.count, args.sessions, "grpc Ingest (workers on)")
        )
    with served_stack() as target:
        tp = asyncio.run(throughput(target, args.throughput_count, args.sessions))
    ratios = [ratio_row(workers_off.summary(), floor.summary())]
    print(ratio_line(ratios[0]))
    extraction = (
        f"extraction throughput (rules, end to end until every job finished): "
        f"{tp['messages_per_s']:.1f} messages/s of jobs that reached done ({tp['done']} of "
        f"{tp['ingests']} two-message ingests done, {tp['dead']} dead, "
        f"{sum(tp['ack_errors'].values())} not acknowledged; finished in "
        f"{tp['finished_seconds']:.1f} s, acknowledged in {tp['ack_seconds']:.1f} s)"
    )
    print(extraction)
    every = [workers_off, floor, workers_on]
    out, plot = result_paths("ingest")
    write_result(
        out,
        {"args": vars(args), "phases": {p.name: p.as_dict() for p in every}, "throughput": tp},
        {
            "title": (
                f"Ingest acknowledgement, {args.rate:g} calls/s open loop, {args.count} calls "
                "a phase; extraction throughput"
            ),
            "rows": [p.summary().as_dict() for p in every],
            "ratios": ratios,
            "notes": [extraction],
        },
    )
    latency_cdf(
        plot,
        [(p.name, p.counted_ms()) for p in every],
        title=(
            f"Ingest acknowledgement latency, {args.rate:g} calls/s open loop "
            "(failed calls at the deadline)"
        ),
        floors={r["floor"]: r["phase"] for r in ratios},
    )
    print(f"written {plot}")


if __name__ == "__main__":
    main()
