"""Time to memory after the final transcript: RecallStream against a plain Recall at the final.

    python -m bench.recall_stream [--data ../shared/data/locomo] [--conversations 2]
                                  [--questions 80] [--wpm 150] [--interim-ms 200]
                                  [--endpoint-ms 200] [--deadline-ms 200]
                                  [--server-env NAME=VALUE ...]

Utterances: questions of the LoCoMo development split (read from the shared folder, never
copied into the project), asked of their conversation, which is ingested first as messages
(one Ingest per session, as bench/locomo_eval.py does; Recall types=[MESSAGE]). Each question
is spoken word by word at --wpm: every --interim-ms the transcript so far is sent as an interim
(an unchanged one is not sent again), and the final transcript --endpoint-ms after the last
word's interim (a transcriber's end-of-speech wait). Time to memory: from sending the final to
its answer. The baseline: a plain Recall of the final text, sent at the final, with the same
deadline (--deadline-ms for both).

Two transcript styles: ``exact``, the interims are the final's words (the final is the last
interim); ``normalized``, the interims are lowercase without punctuation while the final has
the question's casing and punctuation (what many transcribers do), so the work ahead cannot be
used and the final is recalled afresh.

Each pass has its own `memsvc serve` over the same database (the query-embedding cache lives
in the process: a second pass in the same process would find every vector cached). Answers are
compared item by item (type, id, order) with the plain Recall's. Results:
bench/results/recall_stream-*.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from bench.harness import (
    RESULTS_DIR,
    Target,
    embedded_stack,
    free_port,
    memsvc_server,
    write_result,
)
from bench.locomo_eval import DEFAULT_DATA, ingest_all, wait_done
from memsvc.client import MemoryClient, MemsvcCallError
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc

Question = tuple[str, str]  # (the conversation's user id, the question)
Answer = list[tuple[int, str]]


def questions(samples: list[dict[str, Any]], count: int, seed: int) -> list[Question]:
    pool = [
        (str(sample["sample_id"]), str(qa["question"]).strip())
        for sample in samples
        for qa in sample["qa"]
        if str(qa.get("question", "")).strip()
    ]
    return random.Random(seed).sample(pool, min(count, len(pool)))


def normalized(text: str) -> str:
    """A transcriber's interim: lowercase words, no punctuation."""
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


def answer(reply: pb.RecallResponse) -> Answer:
    return [(item.type, item.id) for item in reply.items]


def request_fields(user: str) -> dict[str, Any]:
    return {"scope": pb.Scope(user_id=user), "top_k": 10, "types": [pb.ITEM_TYPE_MESSAGE]}


async def plain_pass(
    client: MemoryClient, asked: list[Question], deadline_s: float
) -> tuple[list[float], list[Answer], list[bool]]:
    ms: list[float] = []
    answers: list[Answer] = []
    degraded: list[bool] = []
    failed: list[str] = []
    for user, text in asked:
        started = time.perf_counter()
        try:
            reply = await client.recall(
                pb.RecallRequest(query=text, **request_fields(user)), timeout=deadline_s
            )
        except MemsvcCallError as exc:
            # As a final unanswered in time (stream_pass): counted, no items.
            ms.append((time.perf_counter() - started) * 1000)
            answers.append([])
            degraded.append(True)
            failed.append(exc.code.name)
            continue
        ms.append((time.perf_counter() - started) * 1000)
        answers.append(answer(reply))
        degraded.append(reply.degraded)
    if failed:
        print(f"plain: {len(failed)} calls unanswered ({', '.join(sorted(set(failed)))})")
    return ms, answers, degraded


async def stream_pass(
    client: MemoryClient,
    asked: list[Question],
    args: argparse.Namespace,
    style: str,
) -> tuple[list[float], list[Answer], list[bool]]:
    ms: list[float] = []
    answers: list[Answer] = []
    degraded: list[bool] = []
    failed: list[str] = []
    word_s = 60 / args.wpm
    tick_s = args.interim_ms / 1000
    for user, text in asked:
        words = text.split() if style == "exact" else normalized(text).split()
        request = pb.RecallStreamRequest(
            final_deadline_ms=args.deadline_ms,
            **request_fields(user),
        )
        async with client.recall_stream(request) as stream:
            started = time.perf_counter()
            last_tick = 0.0
            while True:
                elapsed = time.perf_counter() - started
                heard = min(len(words), int(elapsed / word_s) + 1)
                await stream.interim(" ".join(words[:heard]))
                last_tick = time.perf_counter()
                if heard == len(words):
                    break
                await asyncio.sleep(tick_s)
            await asyncio.sleep(
                max(0.0, args.endpoint_ms / 1000 - (time.perf_counter() - last_tick))
            )
            sent = time.perf_counter()
            try:
                reply = await stream.final(text)
            except (TimeoutError, MemsvcCallError) as exc:
                # No answer by the final's deadline (and the client's slack): counted at the
                # time it gave up, with no items; the pass goes on.
                ms.append((time.perf_counter() - sent) * 1000)
                answers.append([])
                degraded.append(True)
                failed.append(type(exc).__name__)
                continue
            ms.append((time.perf_counter() - sent) * 1000)
        answers.append(answer(reply))
        degraded.append(reply.degraded)
    if failed:
        print(f"{style}: {len(failed)} finals unanswered ({', '.join(sorted(set(failed)))})")
    return ms, answers, degraded


def percentiles(ms: list[float]) -> dict[str, float]:
    values = np.asarray(ms)
    return {
        "p50_ms": round(float(np.percentile(values, 50)), 2),
        "p99_ms": round(float(np.percentile(values, 99)), 2),
        "mean_ms": round(float(values.mean()), 2),
    }


def ahead_outcomes(metrics_text: str) -> dict[str, float]:
    """The work ahead's outcomes, and why answers were degraded (missing legs) or lighter
    (legs skipped by the voice policy), from the pass's server."""
    found: dict[str, float] = {}
    for line in metrics_text.splitlines():
        match = re.match(
            r"memsvc_recall_(ahead|missing_legs|skipped_legs)_total\{([^}]*)\} ([0-9.e+]+)",
            line,
        )
        if match:
            labels = ",".join(v for v in re.findall(r'="([^"]*)"', match.group(2)))
            found[f"{match.group(1)}:{labels}"] = float(match.group(3))
    return found


async def ingest(target: Target, samples: list[dict[str, Any]]) -> None:
    metadata = (("x-api-key", target.api_key),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        started = time.perf_counter()
        ids = await ingest_all(stub, metadata, samples)
        await wait_done(stub, metadata, ids, timeout_s=1800)
        print(f"ingested {len(ids)} sessions in {time.perf_counter() - started:.0f} s", flush=True)


async def one_pass(
    target: Target, asked: list[Question], args: argparse.Namespace, kind: str
) -> tuple[list[float], list[Answer], list[bool]]:
    async with MemoryClient(f"127.0.0.1:{target.port}", api_key=target.api_key) as client:
        # Warm the channel and the server's statements on another question each.
        for user, text in asked[:3]:
            await client.recall(
                pb.RecallRequest(query=f"{text} warm", **request_fields(user)), timeout=2.0
            )
        if kind == "plain":
            return await plain_pass(client, asked, args.deadline_ms / 1000)
        return await stream_pass(client, asked, args, kind)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--conversations", type=int, default=2)
    parser.add_argument("--questions", type=int, default=80)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--wpm", type=float, default=150)
    parser.add_argument("--interim-ms", type=int, default=200)
    parser.add_argument("--endpoint-ms", type=int, default=200)
    parser.add_argument("--deadline-ms", type=int, default=200)
    parser.add_argument("--styles", default="exact,normalized")
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for every timed pass's server (e.g. MEMSVC_READS_MAX_CPU_BUSY=0 on a "
        "machine other processes keep busy: the CPU gate would shed every embedding)",
    )
    args = parser.parse_args()
    samples = json.loads((args.data / "locomo-dev.json").read_text())[: args.conversations]
    asked = questions(samples, args.questions, args.seed)
    kinds = ["plain", *args.styles.split(",")]
    results: dict[str, Any] = {}
    answers: dict[str, list[Answer]] = {}
    degraded: dict[str, list[bool]] = {}
    with embedded_stack() as stack:
        with memsvc_server(stack) as target:
            asyncio.run(ingest(target, samples))
        for kind in kinds:
            # Workers off: nothing else runs on the server while the pass is timed.
            metrics_port = free_port()
            env = {"MEMSVC_RUN_WORKERS": "false", "MEMSVC_METRICS_PORT": str(metrics_port)}
            env.update(item.split("=", 1) for item in args.server_env)
            with memsvc_server(stack, env) as target:
                ms, got, flags = asyncio.run(one_pass(target, asked, args, kind))
                outcomes = ahead_outcomes(_metrics(metrics_port))
            answers[kind] = got
            degraded[kind] = flags
            results[kind] = {**percentiles(ms), "degraded": sum(flags), "ahead": outcomes}
            print(kind, results[kind], flush=True)
    for kind in kinds[1:]:
        equal = sum(a == b for a, b in zip(answers[kind], answers["plain"], strict=True))
        results[kind]["equal_to_plain"] = round(equal / len(asked), 4)
        results[kind]["equal_to_plain_count"] = equal
        # Why an answer differs: either side degraded (a leg missing: they are not the same
        # computation), or not (then the streamed answer is wrong).
        unequal = [
            i
            for i, (a, b) in enumerate(zip(answers[kind], answers["plain"], strict=True))
            if a != b
        ]
        results[kind]["unequal_either_degraded"] = sum(
            degraded[kind][i] or degraded["plain"][i] for i in unequal
        )
    rows = [
        {"phase": kind, **{k: v for k, v in results[kind].items() if k != "ahead"}}
        for kind in kinds
    ]
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"recall_stream-{time.strftime('%Y%m%d-%H%M%S')}.json"
    write_result(
        path,
        {"args": vars(args), "questions": len(asked), "results": results},
        {
            "title": "RecallStream: time to memory after the final transcript",
            "rows": rows,
            "notes": [
                f"{len(asked)} LoCoMo dev questions, {args.wpm:g} wpm, an interim every "
                f"{args.interim_ms} ms, the final {args.endpoint_ms} ms after the last word, "
                f"deadline {args.deadline_ms} ms"
            ],
        },
    )


def _metrics(port: int) -> str:
    """The server's Prometheus text."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


if __name__ == "__main__":
    main()
