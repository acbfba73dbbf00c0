"""Fair extraction under a noisy neighbour (issue 31, item 1).

    python -m bench.fairness [--seconds 60] [--flood-users 24] [--b-ingest-every 3]
                             [--b-recall-rate 4] [--server-path DIR] [--env NAME=VALUE]

Against `memsvc serve` with its workers on and default settings, tenant B ingests one user
message every few seconds (time from the Ingest to DONE) and recalls at a steady rate
(latency, degraded answers), first alone ("idle"), then while tenant A floods ("flood"): from
the start of the phase, Ingests of the largest size one job may have (8 messages of 8,000
characters) for many users, one more every two seconds, so A's backlog lasts the whole phase.
Issue 31 asks that B's figures under the flood stay within 2x of idle.

``--server-path``: run the server from another checkout (PYTHONPATH), e.g. main, for the
figures before the change.

Results: bench/results/fairness-*.json, and the figures printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp

from bench.harness import Target, result_paths, served_stack, write_result
from memsvc.storage import api_keys
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc

FLOOD_TEXT = (
    "I moved to Lisbon last spring with my sister and we rented a flat near the river. "
    "My favourite food is grilled sardines, and on weekends I go sailing with friends. "
    "I work at a bank as an analyst, and I am planning to visit Kyoto next year. "
) * 40
CITIES = ["Lisbon", "Oslo", "Kyoto", "Accra", "Quito", "Perth", "Lima", "Turin"]
RECALL_DEADLINE_S = 2.0
FLOOD_MESSAGES = 8
FLOOD_CHARS = 8_000
FLOOD_EVERY_S = 2.0
B_USERS = 8


def now() -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(datetime.now(UTC))
    return ts


def ingest_request(user: str, texts: list[str], session: str) -> pb.IngestRequest:
    return pb.IngestRequest(
        scope=pb.Scope(user_id=user),
        session_id=session,
        idempotency_key=uuid.uuid4().hex,
        messages=[
            pb.Message(
                message_id=f"m-{uuid.uuid4().hex[:12]}",
                sender_id=user,
                role=pb.MESSAGE_ROLE_USER,
                text=text,
                sent_at=now(),
            )
            for text in texts
        ],
    )


async def second_key(dsn: str, tenant: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        return await api_keys.create_key(conn, tenant, "bench")
    finally:
        await conn.close()


class TenantB:
    """The steady tenant: its Ingests' time to DONE, its Recalls' latency."""

    def __init__(self, stub: Any, key: str) -> None:
        self.stub = stub
        self.md = (("x-api-key", key),)
        self.done_s: list[float] = []
        self.ack_ms: list[float] = []
        self.ingest_errors: Counter[str] = Counter()
        self.unfinished = 0
        self.recall_ms: list[float] = []
        self.degraded = 0
        self.recall_errors: Counter[str] = Counter()
        self.n = 0

    async def one_ingest(self, wait_limit_s: float) -> None:
        self.n += 1
        city = CITIES[self.n % len(CITIES)]
        # Users in turn: one user's jobs run one after another, so a single user's queue
        # would measure itself once a job took longer than the period.
        user = f"b{self.n % B_USERS}"
        started = time.perf_counter()
        try:
            reply = await self.stub.Ingest(
                ingest_request(user, [f"I live in {city} now, number {self.n}."], "steady"),
                metadata=self.md,
                timeout=10,
            )
        except grpc.aio.AioRpcError as err:
            self.ingest_errors[err.code().name] += 1
            return
        self.ack_ms.append((time.perf_counter() - started) * 1000)
        while time.perf_counter() - started < wait_limit_s:
            state = await self.stub.GetIngestStatus(
                pb.GetIngestStatusRequest(ingest_id=reply.ingest_id), metadata=self.md, timeout=5
            )
            if state.state in (pb.INGEST_STATE_DONE, pb.INGEST_STATE_DEAD):
                self.done_s.append(time.perf_counter() - started)
                return
            await asyncio.sleep(0.05)
        self.unfinished += 1

    async def one_recall(self, i: int) -> None:
        started = time.perf_counter()
        try:
            reply = await self.stub.Recall(
                pb.RecallRequest(
                    scope=pb.Scope(user_id=f"b{i % B_USERS}"),
                    query=f"where does the user live, {i}",
                ),
                metadata=self.md,
                timeout=RECALL_DEADLINE_S,
            )
        except grpc.aio.AioRpcError as err:
            self.recall_errors[err.code().name] += 1
            self.recall_ms.append(RECALL_DEADLINE_S * 1000)
            return
        self.recall_ms.append((time.perf_counter() - started) * 1000)
        self.degraded += reply.degraded

    def figures(self) -> dict[str, Any]:
        done = np.array(self.done_s) if self.done_s else np.array([np.nan])
        recall = np.array(self.recall_ms) if self.recall_ms else np.array([np.nan])
        ack = np.array(self.ack_ms) if self.ack_ms else np.array([np.nan])
        return {
            "ingests": len(self.done_s) + self.unfinished,
            "unfinished": self.unfinished,
            "ingest_errors": dict(self.ingest_errors),
            "ack_p50_ms": round(float(np.percentile(ack, 50)), 1),
            "ack_p95_ms": round(float(np.percentile(ack, 95)), 1),
            "done_p50_s": round(float(np.percentile(done, 50)), 2),
            "done_p95_s": round(float(np.percentile(done, 95)), 2),
            "done_max_s": round(float(np.max(done)), 2),
            "recalls": len(self.recall_ms),
            "recall_p50_ms": round(float(np.percentile(recall, 50)), 1),
            "recall_p95_ms": round(float(np.percentile(recall, 95)), 1),
            "recall_p99_ms": round(float(np.percentile(recall, 99)), 1),
            "degraded": self.degraded,
            "recall_errors": dict(self.recall_errors),
        }


async def flood(stub: Any, key: str, users: int, stop: asyncio.Event, ids: list[str]) -> None:
    """Tenant A: ``users`` largest Ingests at once, then one more every FLOOD_EVERY_S."""
    md = (("x-api-key", key),)
    texts = [FLOOD_TEXT[:FLOOD_CHARS]] * FLOOD_MESSAGES
    i = 0

    async def send() -> None:
        nonlocal i
        i += 1
        try:
            reply = await stub.Ingest(
                ingest_request(f"a{i}", texts, "flood"), metadata=md, timeout=10
            )
            ids.append(reply.ingest_id)
        except grpc.aio.AioRpcError as err:
            print(f"flood Ingest refused: {err.code().name} {err.details()}")

    await asyncio.gather(*(send() for _ in range(users)))
    while not stop.is_set():
        try:
            async with asyncio.timeout(FLOOD_EVERY_S):
                await stop.wait()
        except TimeoutError:
            await send()


async def phase(
    target: Target, key_a: str, *, flooding: bool, args: argparse.Namespace
) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        b = TenantB(stub, target.api_key)
        stop = asyncio.Event()
        flood_ids: list[str] = []
        flooder = (
            asyncio.ensure_future(flood(stub, key_a, args.flood_users, stop, flood_ids))
            if flooding
            else None
        )
        tasks: list[asyncio.Task[None]] = []
        started = time.perf_counter()
        next_ingest = started
        recall_period = 1.0 / args.b_recall_rate
        next_recall = started
        i = 0
        while time.perf_counter() - started < args.seconds:
            t = time.perf_counter()
            if t >= next_ingest:
                tasks.append(asyncio.ensure_future(b.one_ingest(args.seconds + 120)))
                next_ingest += args.b_ingest_every
            if t >= next_recall:
                i += 1
                tasks.append(asyncio.ensure_future(b.one_recall(i)))
                next_recall += recall_period
            await asyncio.sleep(max(0.0, min(next_ingest, next_recall) - time.perf_counter()))
        stop.set()
        await asyncio.gather(*tasks)
        a_done = 0
        if flooder is not None:
            await flooder
            md = (("x-api-key", key_a),)
            for ingest_id in flood_ids:
                state = await stub.GetIngestStatus(
                    pb.GetIngestStatusRequest(ingest_id=ingest_id), metadata=md, timeout=5
                )
                a_done += state.state == pb.INGEST_STATE_DONE
    figures = b.figures()
    if flooding:
        figures |= {"a_ingests": len(flood_ids), "a_done_by_end": a_done}
    return figures


async def warm_up(target: Target) -> None:
    """Parser process started, models loaded, the embedder's timing learnt: not measured."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        b = TenantB(memory_pb2_grpc.MemoryServiceStub(channel), target.api_key)
        for _ in range(3):
            await b.one_ingest(300)
        for i in range(40):
            await b.one_recall(-i)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--flood-users", type=int, default=24)
    parser.add_argument("--b-ingest-every", type=float, default=3.0)
    parser.add_argument("--b-recall-rate", type=float, default=4.0)
    parser.add_argument("--server-path", default="")
    parser.add_argument("--server-log", default="", help="keep the server's log in this file")
    parser.add_argument(
        "--load-gates",
        action="store_true",
        help="keep the read gates that answer to the machine's load (off by default: on a "
        "shared machine they measure the other processes, not tenant A)",
    )
    parser.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE for the server (repeatable)"
    )
    args = parser.parse_args()
    if args.server_path:
        # `python -m memsvc` imports from the working directory first, PYTHONPATH after.
        os.environ["PYTHONPATH"] = args.server_path
        os.chdir(args.server_path)
    env = (
        {}
        if args.load_gates
        else {
            "MEMSVC_READS_MAX_CPU_BUSY": "0",
            "MEMSVC_READS_MAX_QUEUE_MS": "0",
            "MEMSVC_READS_DEGRADE_QUEUE_MS": "0",
        }
    )
    env |= dict(item.split("=", 1) for item in args.env)
    log_path = Path(args.server_log).resolve() if args.server_log else None
    with served_stack(env, log_path=log_path) as target:
        key_a = asyncio.run(second_key(target.pg_dsn, "bench-a"))
        asyncio.run(warm_up(target))
        idle = asyncio.run(phase(target, key_a, flooding=False, args=args))
        print("idle ", idle, "load average", os.getloadavg())
        flooded = asyncio.run(phase(target, key_a, flooding=True, args=args))
        print("flood", flooded, "load average", os.getloadavg())
    ratios = {
        name: round(flooded[name] / idle[name], 2) if idle[name] else None
        for name in ("done_p50_s", "done_p95_s", "recall_p50_ms", "recall_p95_ms")
    }
    print("flood / idle", ratios)
    out, _ = result_paths("fairness")
    write_result(
        out,
        {"args": vars(args), "idle": idle, "flood": flooded, "ratios": ratios},
        {
            "title": (
                f"Tenant B beside tenant A's flood of {FLOOD_MESSAGES}x{FLOOD_CHARS}-character "
                f"Ingests ({args.seconds:g} s a phase)"
            ),
            "rows": [],
            "notes": [
                f"B time to DONE p50/p95: idle {idle['done_p50_s']}/{idle['done_p95_s']} s, "
                f"flood {flooded['done_p50_s']}/{flooded['done_p95_s']} s; Recall p50/p95: "
                f"idle {idle['recall_p50_ms']}/{idle['recall_p95_ms']} ms, flood "
                f"{flooded['recall_p50_ms']}/{flooded['recall_p95_ms']} ms",
            ],
        },
    )


if __name__ == "__main__":
    main()
