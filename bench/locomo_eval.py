"""Retrieval quality on the LoCoMo development split, through the public gRPC API.

    python -m bench.locomo_eval [--data ../shared/data/locomo] [--modes hybrid,dense,lexical]
                                [--routing on,off] [--server-env MEMSVC_RRF_K=60 ...]

Protocol (the LoCoMo paper's, see the data folder's README): one unit per turn, text
`{speaker} said, "{text}"` (+ ` and shared {blip_caption}` for image turns), one index per
conversation (here: one user scope per conversation). Every turn is ingested as a message
(one Ingest per session, as a gateway would at the end of a session); the workers index them.
Each question is a Recall with types=[MESSAGE]; Recall@k is the share of the question's
evidence dia_ids among the top-k messages (a question without evidence counts as 1).
The data is read from the shared folder and never copied into the project.

The conversations are ingested once; then each --routing value (MEMSVC_ROUTING) gets its own
`memsvc serve` over the same database, and every mode is asked every question. The answers'
`route` is counted per category (how the classifier spreads each category over routes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp

from bench.harness import RESULTS_DIR, Target, embedded_stack, memsvc_server
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
MODES = {
    "hybrid": pb.RECALL_MODE_HYBRID,
    "dense": pb.RECALL_MODE_DENSE,
    "lexical": pb.RECALL_MODE_LEXICAL,
}
KS = (5, 10, 25)


def unit_text(turn: dict[str, Any]) -> str:
    text = f'{turn["speaker"]} said, "{turn["text"]}"'
    if turn.get("blip_caption"):
        text += f" and shared {turn['blip_caption']}"
    return text


def session_time(raw: str) -> datetime:
    """'1:56 pm on 8 May, 2023' -> an aware datetime."""
    return datetime.strptime(raw.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def sessions_of(conversation: dict[str, Any]) -> list[tuple[int, datetime, list[dict[str, Any]]]]:
    out = []
    n = 1
    while f"session_{n}" in conversation:
        turns = conversation[f"session_{n}"]
        when = session_time(conversation[f"session_{n}_date_time"])
        if turns:
            out.append((n, when, turns))
        n += 1
    return out


def sender_id(speaker: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in speaker).strip("-") or "speaker"


async def ingest_all(stub: Any, metadata: Any, samples: list[dict[str, Any]]) -> list[str]:
    ids: list[str] = []
    for sample in samples:
        user = sample["sample_id"]
        for n, when, turns in sessions_of(sample["conversation"]):
            messages = []
            for k, turn in enumerate(turns):
                sent = Timestamp()
                sent.FromDatetime(when + timedelta(seconds=k))
                messages.append(
                    pb.Message(
                        message_id=turn["dia_id"],
                        sender_id=sender_id(turn["speaker"]),
                        role=pb.MESSAGE_ROLE_USER,
                        text=unit_text(turn),
                        sent_at=sent,
                    )
                )
            reply = await stub.Ingest(
                pb.IngestRequest(
                    scope=pb.Scope(user_id=user),
                    session_id=f"{user}/session_{n}",
                    messages=messages,
                    end_of_session=True,
                    idempotency_key=f"locomo/{user}/session_{n}",
                ),
                metadata=metadata,
                timeout=30,
            )
            ids.append(reply.ingest_id)
    return ids


async def wait_done(stub: Any, metadata: Any, ids: list[str], timeout_s: float) -> None:
    pending = set(ids)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for ingest_id in list(pending):
            status = await stub.GetIngestStatus(
                pb.GetIngestStatusRequest(ingest_id=ingest_id), metadata=metadata, timeout=10
            )
            if status.state == pb.INGEST_STATE_DONE:
                pending.discard(ingest_id)
            elif status.state == pb.INGEST_STATE_DEAD:
                raise RuntimeError(f"ingest {ingest_id} is dead: {status.last_error}")
        if pending:
            await asyncio.sleep(1)
    if pending:
        raise RuntimeError(f"{len(pending)} ingests not done after {timeout_s}s")


def recall_at(found: list[str], evidence: list[str], k: int) -> float:
    if not evidence:
        return 1.0
    top = set(found[:k])
    return sum(1 for e in evidence if e in top) / len(evidence)


async def evaluate(
    stub: Any,
    metadata: Any,
    samples: list[dict[str, Any]],
    mode: str,
    deadline_s: float,
    routing: str,
) -> dict[str, Any]:
    per_cat: dict[str, list[list[float]]] = defaultdict(list)
    routes: dict[str, Counter[str]] = defaultdict(Counter)
    latencies: list[float] = []
    degraded = 0
    for sample in samples:
        user = sample["sample_id"]
        for qa in sample["qa"]:
            started = time.perf_counter()
            reply = await stub.Recall(
                pb.RecallRequest(
                    scope=pb.Scope(user_id=user),
                    query=str(qa["question"]),
                    top_k=max(KS),
                    types=[pb.ITEM_TYPE_MESSAGE],
                    mode=MODES[mode],
                ),
                metadata=metadata,
                timeout=deadline_s,
            )
            latencies.append(time.perf_counter() - started)
            degraded += reply.degraded
            found = [item.id for item in reply.items]
            scores = [recall_at(found, list(qa.get("evidence") or []), k) for k in KS]
            category = CATEGORIES.get(int(qa["category"]), str(qa["category"]))
            per_cat["all"].append(scores)
            per_cat[category].append(scores)
            routes["all"][reply.route] += 1
            routes[category][reply.route] += 1
    ms = np.asarray(latencies) * 1000
    return {
        "mode": mode,
        "routing": routing,
        "questions": len(per_cat["all"]),
        "degraded": degraded,
        "latency_ms": {
            "p50": float(np.percentile(ms, 50)),
            "p95": float(np.percentile(ms, 95)),
            "p99": float(np.percentile(ms, 99)),
        },
        "recall": {
            cat: {
                f"R@{k}": round(100 * float(np.mean([s[i] for s in rows])), 1)
                for i, k in enumerate(KS)
            }
            | {"n": len(rows)}
            for cat, rows in per_cat.items()
        },
        "routes": {cat: dict(sorted(counts.items())) for cat, counts in routes.items()},
    }


async def run(
    target: Target,
    samples: list[dict[str, Any]],
    modes: list[str],
    deadline_s: float,
    *,
    routing: str,
    ingest: bool,
) -> list[dict[str, Any]]:
    metadata = (("x-api-key", target.api_key),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        if ingest:
            started = time.perf_counter()
            ids = await ingest_all(stub, metadata, samples)
            await wait_done(stub, metadata, ids, timeout_s=1800)
            print(
                f"ingested and indexed {len(ids)} sessions in {time.perf_counter() - started:.1f}s",
                flush=True,
            )
        return [
            await evaluate(stub, metadata, samples, mode, deadline_s, routing) for mode in modes
        ]


def label(result: dict[str, Any]) -> str:
    return f"{result['mode']} routing {result['routing']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA,
        help="folder holding locomo-dev.json (default: ../shared/data/locomo)",
    )
    parser.add_argument("--modes", default="hybrid,dense,lexical")
    parser.add_argument(
        "--routing",
        default="on,off",
        help="MEMSVC_ROUTING values to evaluate, each on its own server over one ingest",
    )
    parser.add_argument("--conversations", type=int, default=0, help="only the first N")
    parser.add_argument(
        "--deadline-ms",
        type=float,
        default=800,
        help="Recall deadline per question (chat preset: 800)",
    )
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="MEMSVC_X=value",
        help="extra server setting for every server (repeatable), e.g. MEMSVC_RRF_K=60",
    )
    args = parser.parse_args()
    server_env = dict(pair.partition("=")[::2] for pair in args.server_env)
    samples = json.loads((args.data / "locomo-dev.json").read_text())
    if args.conversations:
        samples = samples[: args.conversations]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    routings = [r.strip() for r in args.routing.split(",") if r.strip()]
    results: list[dict[str, Any]] = []
    with embedded_stack() as stack:
        for i, routing in enumerate(routings):
            with memsvc_server(stack, server_env | {"MEMSVC_ROUTING": routing}) as target:
                results += asyncio.run(
                    run(
                        target,
                        samples,
                        modes,
                        args.deadline_ms / 1000,
                        routing=routing,
                        ingest=i == 0,
                    )
                )
    header = f"{'mode':<22}" + "".join(f"{c:>14}" for c in ["all", *CATEGORIES.values()])
    for k in KS:
        print(f"\nRecall@{k}\n{header}")
        for r in results:
            cells = "".join(
                f"{r['recall'].get(c, {}).get(f'R@{k}', float('nan')):>14.1f}"
                for c in ["all", *CATEGORIES.values()]
            )
            print(f"{label(r):<22}{cells}")
    for r in results[:1]:
        print(f"\nroutes per category ({label(r)})")
        for cat in ["all", *CATEGORIES.values()]:
            counts = r["routes"].get(cat, {})
            print(f"{cat:<14}" + "  ".join(f"{route} {n}" for route, n in counts.items()))
    for r in results:
        lat = r["latency_ms"]
        print(
            f"{label(r)}: {r['questions']} questions, degraded {r['degraded']}, "
            f"latency p50 {lat['p50']:.1f} ms p95 {lat['p95']:.1f} ms p99 {lat['p99']:.1f} ms"
        )
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"locomo-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2
        )
    )
    print(f"written {out}")


if __name__ == "__main__":
    main()
