"""Retrieval quality on the LoCoMo development split, through the public gRPC API.

    python -m bench.locomo_eval [--data ../shared/data/locomo] [--modes hybrid,dense,lexical]
                                [--routing on,off] [--server-env MEMSVC_RRF_K=60 ...]

Protocol (the LoCoMo paper's, see the data folder's README): one unit per turn, text
`{speaker} said, "{text}"` (+ ` and shared {blip_caption}` for image turns), one index per
conversation (here: one user scope per conversation). Every turn is ingested as a message
(one Ingest per session, as a gateway would at the end of a session) whose text is the turn's
text (+ the caption) and whose sender_name is the speaker: the server makes the unit
(storage.messages.UNIT_SQL) and the workers index it. ``--speakers id`` sends the name as
sender_id only (no sender_name), ``--speakers none`` opaque sender ids (a gateway that knows
no names: the units are the texts alone).
Each question is a Recall with types=[MESSAGE]; Recall@k is the share of the question's
evidence dia_ids among the top-k messages (a question without evidence counts as 1).
The data is read from the shared folder and never copied into the project.

Minimum relevance (``--min-scores 0,0.1,...``): every question is asked once with
``filters.min_score = 0`` and top_k 100, and each threshold is applied to the items'
``relevance`` (what the server does before its top-k cut): Recall@k of the questions with
evidence at each threshold, and the share of OFF_TOPIC questions (written for this check,
about things no LoCoMo conversation is about) that return no items at all, asked of every
conversation both over messages and over the default kinds (facts and episodes).

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

from bench.harness import Target, embedded_stack, memsvc_server, write_eval
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
# Questions unrelated to any of the conversations (written for this evaluation, not from a
# benchmark): a good minimum relevance makes them return nothing.
OFF_TOPIC = (
    "What is the capital of Peru?",
    "How many moons does Jupiter have?",
    "What is the boiling point of mercury?",
    "Who wrote the Treaty of Westphalia?",
    "What is the airspeed velocity of a swallow?",
    "How do I reset a Cisco router to factory settings?",
    "What is the population of Mongolia?",
    "Which enzyme breaks down lactose?",
    "What is the tallest mountain in Africa?",
    "How is the Black-Scholes formula derived?",
    "What is the atomic number of tungsten?",
    "When did the Byzantine empire fall?",
    "What is the exchange rate of the Swiss franc?",
    "How does a diesel engine's fuel injector work?",
    "What is the time complexity of heapsort?",
    "Which river flows through Baghdad?",
    "How many bones are in the human hand?",
    "What is the GDP of Norway?",
    "What is the chemical formula of sulfuric acid?",
    "Who won the 1954 football world cup?",
)


def turn_text(turn: dict[str, Any]) -> str:
    text = str(turn["text"])
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


async def ingest_all(
    stub: Any, metadata: Any, samples: list[dict[str, Any]], speakers: str = "name"
) -> list[str]:
    ids: list[str] = []
    for sample in samples:
        user = sample["sample_id"]
        conversation = sample["conversation"]
        opaque = {conversation["speaker_a"]: "speaker-1", conversation["speaker_b"]: "speaker-2"}
        for n, when, turns in sessions_of(conversation):
            messages = []
            for k, turn in enumerate(turns):
                sent = Timestamp()
                sent.FromDatetime(when + timedelta(seconds=k))
                speaker = str(turn["speaker"])
                messages.append(
                    pb.Message(
                        message_id=turn["dia_id"],
                        sender_id=opaque.get(speaker, "speaker-0")
                        if speakers == "none"
                        else sender_id(speaker),
                        sender_name=speaker if speakers == "name" else "",
                        role=pb.MESSAGE_ROLE_USER,
                        text=turn_text(turn),
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
    min_scores: list[float] | None = None,
) -> dict[str, Any]:
    if min_scores:
        return await evaluate_thresholds(stub, metadata, samples, mode, deadline_s, min_scores)
    per_cat: dict[str, list[list[float]]] = defaultdict(list)
    routes: dict[str, Counter[str]] = defaultdict(Counter)
    latencies: list[float] = []
    degraded = 0
    skipped = 0
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
            skipped += bool(reply.skipped_legs)
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
        "skipped_dense": skipped,
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


async def evaluate_thresholds(
    stub: Any,
    metadata: Any,
    samples: list[dict[str, Any]],
    mode: str,
    deadline_s: float,
    min_scores: list[float],
) -> dict[str, Any]:
    """Recall@k with each minimum relevance, and how often unrelated questions get nothing."""

    async def ask(user: str, question: str, types: list[pb.ItemType.ValueType]) -> list[Any]:
        reply = await stub.Recall(
            pb.RecallRequest(
                scope=pb.Scope(user_id=user),
                query=question,
                top_k=100,
                types=types,
                mode=MODES[mode],
                filters=pb.RecallFilters(min_score=0.0),
            ),
            metadata=metadata,
            timeout=deadline_s,
        )
        return list(reply.items)

    per_t: dict[float, dict[str, list[list[float]]]] = {t: defaultdict(list) for t in min_scores}
    empty_real: dict[float, int] = dict.fromkeys(min_scores, 0)
    evidence_relevance: list[float] = []
    # Per question: [relevance, dense_rank, lexical_rank, is_evidence] of its top 50 items,
    # then [-1, 0, 0, number of evidence ids] (for trying other rules offline).
    raw: list[list[list[float]]] = []
    questions = 0
    for sample in samples:
        user = sample["sample_id"]
        for qa in sample["qa"]:
            evidence = list(qa.get("evidence") or [])
            if not evidence:
                continue
            questions += 1
            items = await ask(user, str(qa["question"]), [pb.ITEM_TYPE_MESSAGE])
            evidence_relevance += [i.relevance for i in items if i.id in evidence]
            raw.append(
                [
                    [round(i.relevance, 4), i.dense_rank, i.lexical_rank, int(i.id in evidence)]
                    for i in items[:50]
                ]
                + [[-1.0, 0, 0, len(evidence)]]
            )
            category = CATEGORIES.get(int(qa["category"]), str(qa["category"]))
            for t in min_scores:
                found = [i.id for i in items if i.relevance >= t]
                empty_real[t] += not found
                scores = [recall_at(found, evidence, k) for k in KS]
                per_t[t]["all"].append(scores)
                per_t[t][category].append(scores)
    off_topic: dict[str, dict[float, float]] = {}
    off_max: dict[str, list[float]] = {}
    off_raw: list[list[list[float]]] = []
    for label_, types in (
        ("messages", [pb.ITEM_TYPE_MESSAGE]),
        ("facts+episodes", [pb.ITEM_TYPE_FACT, pb.ITEM_TYPE_EPISODE]),
    ):
        tops: list[float] = []
        for sample in samples:
            for question in OFF_TOPIC:
                items = await ask(sample["sample_id"], question, types)
                tops.append(max((i.relevance for i in items), default=0.0))
                off_raw.append(
                    [[round(i.relevance, 4), i.dense_rank, i.lexical_rank, 0] for i in items[:10]]
                )
        off_topic[label_] = {
            t: round(100 * sum(top < t for top in tops) / len(tops), 1) for t in min_scores
        }
        off_max[label_] = sorted(round(x, 3) for x in tops)
    return {
        "mode": mode,
        "questions_with_evidence": questions,
        "recall_by_min_score": {
            str(t): {
                cat: {
                    f"R@{k}": round(100 * float(np.mean([s[i] for s in rows])), 1)
                    for i, k in enumerate(KS)
                }
                | {"n": len(rows)}
                for cat, rows in per_t[t].items()
            }
            for t in min_scores
        },
        "real_questions_empty_pct": {
            str(t): round(100 * empty_real[t] / max(questions, 1), 1) for t in min_scores
        },
        "off_topic_empty_pct": {k: {str(t): v for t, v in d.items()} for k, d in off_topic.items()},
        "off_topic_top_relevance": off_max,
        "raw": raw,
        "off_topic_raw": off_raw,
        "evidence_relevance_pct": {
            f"p{p}": round(float(np.percentile(evidence_relevance, p)), 3)
            for p in (1, 5, 10, 25, 50)
        }
        if evidence_relevance
        else {},
    }


async def run(
    target: Target,
    samples: list[dict[str, Any]],
    modes: list[str],
    deadline_s: float,
    *,
    routing: str,
    ingest: bool,
    min_scores: list[float] | None = None,
    speakers: str = "name",
) -> list[dict[str, Any]]:
    metadata = (("x-api-key", target.api_key),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        if ingest:
            started = time.perf_counter()
            ids = await ingest_all(stub, metadata, samples, speakers)
            await wait_done(stub, metadata, ids, timeout_s=1800)
            print(
                f"ingested and indexed {len(ids)} sessions in {time.perf_counter() - started:.1f}s",
                flush=True,
            )
        return [
            await evaluate(stub, metadata, samples, mode, deadline_s, routing, min_scores)
            for mode in modes
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
        "--speakers",
        choices=("name", "id", "none"),
        default="name",
        help="how a turn names its speaker: sender_name (default), a name-like sender_id "
        "only, or opaque sender ids",
    )
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
    parser.add_argument(
        "--min-scores",
        default="",
        help="comma-separated minimum relevances to compare (e.g. 0,0.1,0.2,0.3): Recall@k "
        "per threshold and the share of unrelated questions answered with nothing",
    )
    args = parser.parse_args()
    min_scores = [float(x) for x in args.min_scores.split(",") if x.strip()]
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
                        min_scores=min_scores,
                        speakers=args.speakers,
                    )
                )
    if min_scores:
        report_thresholds(results, args)
        return
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
            f"dense leg skipped {r['skipped_dense']}, "
            f"latency p50 {lat['p50']:.1f} ms p95 {lat['p95']:.1f} ms p99 {lat['p99']:.1f} ms"
        )
    write_eval("locomo", args, results)


def report_thresholds(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    for r in results:
        print(f"\n{r['mode']}: {r['questions_with_evidence']} questions with evidence")
        print(
            f"{'min_score':>10}{'R@5':>8}{'R@10':>8}{'R@25':>8}{'real empty %':>14}"
            + "".join(f"{'off-topic empty % ' + k:>34}" for k in r["off_topic_empty_pct"])
        )
        for t, rec in r["recall_by_min_score"].items():
            row = rec["all"]
            print(
                f"{t:>10}{row['R@5']:>8.1f}{row['R@10']:>8.1f}{row['R@25']:>8.1f}"
                f"{r['real_questions_empty_pct'][t]:>14.1f}"
                + "".join(f"{d[t]:>34.1f}" for d in r["off_topic_empty_pct"].values())
            )
        print(f"evidence relevance percentiles: {r['evidence_relevance_pct']}")
    write_eval("locomo-min-score", args, results)


if __name__ == "__main__":
    main()
