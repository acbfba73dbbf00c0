"""Ingest acknowledgement latency (open loop) and end-to-end extraction throughput (rules).

    python -m bench.ingest [--rate 200] [--count 2000] [--sessions 100]

Three measurements, each against `memsvc serve` in its own process:
1. ack latency with workers off (the online path alone) and the floor (same two writes direct);
2. ack latency with workers on (extraction competing for the same two cores);
3. throughput: messages per second from the first Ingest until every job is `done`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from bench.harness import RESULTS_DIR, Summary, Target, open_loop, served_stack, summarize
from memsvc.concurrency.deadline import Budget
from memsvc.ingest.service import IngestCommand, IngestService
from memsvc.storage.messages import StoredMessage
from memsvc.storage.model import Scope
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


async def ack_latency(target: Target, rate: float, count: int, sessions: int, name: str) -> Summary:
    metadata = (("x-api-key", target.api_key),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)

        async def call(i: int) -> None:
            await stub.Ingest(request(i, sessions), metadata=metadata, timeout=2)

        await open_loop(lambda i: call(10_000_000 + i), rate_per_s=rate, count=100)  # warm-up
        lat, err, wall = await open_loop(call, rate_per_s=rate, count=count)
    return summarize(name, lat, err, wall)


async def floor_latency(target: Target, rate: float, count: int, sessions: int) -> Summary:
    """The same two writes through IngestService, in this process, without gRPC."""
    import asyncpg
    from pgvector.asyncpg import register_vector

    pool = await asyncpg.create_pool(target.pg_dsn, min_size=2, max_size=10, init=register_vector)
    service = IngestService(pool, acquire_timeout_s=1.0)
    try:

        async def call(i: int) -> None:
            r = request(20_000_000 + i, sessions)
            await service.ingest(
                IngestCommand(
                    scope=Scope("floor", r.scope.user_id),
                    session_id=r.session_id,
                    idempotency_key=r.idempotency_key,
                    messages=tuple(
                        StoredMessage(
                            r.session_id,
                            m.message_id,
                            m.sender_id,
                            "user" if m.role == pb.MESSAGE_ROLE_USER else "assistant",
                            m.text,
                            m.sent_at.ToDatetime().astimezone(),
                        )
                        for m in r.messages
                    ),
                ),
                Budget(2.0),
            )

        await open_loop(lambda i: call(count + i), rate_per_s=rate, count=100)
        lat, err, wall = await open_loop(call, rate_per_s=rate, count=count)
        return summarize("floor Ingest (direct)", lat, err, wall)
    finally:
        await pool.close()


async def throughput(target: Target, count: int, sessions: int) -> dict[str, float]:
    """Send `count` ingests as fast as they are acknowledged, then wait until all are done."""
    metadata = (("x-api-key", target.api_key),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        started = time.perf_counter()
        ids = []
        for start in range(0, count, 50):
            replies = await asyncio.gather(
                *(
                    stub.Ingest(request(30_000_000 + i, sessions), metadata=metadata, timeout=5)
                    for i in range(start, min(count, start + 50))
                )
            )
            ids.extend(r.ingest_id for r in replies)
        acked = time.perf_counter() - started
        # Poll in submission order, a few at a time, from the oldest still pending: jobs are
        # done roughly in that order, and asking for hundreds of statuses twice a second took
        # a large share of the server's event loop, more the longer extraction ran.
        pending = list(ids)
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
            finished = {
                s.ingest_id
                for s in states
                if s.state in (pb.INGEST_STATE_DONE, pb.INGEST_STATE_DEAD)
            }
            pending = [i for i in pending if i not in finished]
        total = time.perf_counter() - started
    messages = count * 2
    return {
        "ingests": count,
        "messages": messages,
        "ack_seconds": acked,
        "done_seconds": total,
        "messages_per_s": messages / total,
        "user_messages_per_s": count / total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--throughput-count", type=int, default=1000)
    args = parser.parse_args()
    results: list[Summary] = []
    with served_stack({"MEMSVC_RUN_WORKERS": "false"}) as target:
        results.append(
            asyncio.run(
                ack_latency(
                    target, args.rate, args.count, args.sessions, "grpc Ingest (workers off)"
                )
            )
        )
        results.append(asyncio.run(floor_latency(target, args.rate, args.count, args.sessions)))
    with served_stack() as target:
        results.append(
            asyncio.run(
                ack_latency(
                    target, args.rate, args.count, args.sessions, "grpc Ingest (workers on)"
                )
            )
        )
    with served_stack() as target:
        tp = asyncio.run(throughput(target, args.throughput_count, args.sessions))
    for r in results:
        print(r.line())
    print(
        f"service / floor (workers off): p50 x{results[0].p50_ms / results[1].p50_ms:.2f}, "
        f"p99 x{results[0].p99_ms / results[1].p99_ms:.2f}"
    )
    print(
        f"extraction throughput (rules, end to end until done): {tp['messages_per_s']:.1f} "
        f"messages/s ({tp['ingests']} ingests of 2 messages in {tp['done_seconds']:.1f}s; "
        f"acknowledged in {tp['ack_seconds']:.1f}s)"
    )
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"ingest-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {"args": vars(args), "results": [r.as_dict() for r in results], "throughput": tp},
            indent=2,
        )
    )
    print(f"written {out}")


if __name__ == "__main__":
    main()
