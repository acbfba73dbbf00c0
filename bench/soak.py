"""Soak: mixed Recall / Prefetch / Ingest at a fixed open-loop rate for minutes, on loopback.

    python -m bench.soak [--minutes 5] [--rate 40] [--mix recall=40,prefetch=20,ingest=40]
                         [--users 200] [--memories-per-user 5] [--window-s 30]

memsvc runs as its own process (`memsvc serve`, workers on, bench/harness.py); this process
seeds every user with a few memories through Remember, then sends calls at a fixed rate
whether or not earlier ones returned, each RPC drawn from the mix. Reported, and written to
bench/results/soak-*.json:

- per 30-second window (of scheduled time) and RPC: calls, latency p50/p95/p99 over every
  call (from its scheduled start; a failed or late call counted at its deadline) and over
  the calls answered in time, errors by status code, degraded answers, Prefetch cache
  outcomes; plotted over time with the server's RSS (soak-*.png);
- errors by status code over the whole run;
- the server process's RSS (VmRSS) every few seconds, its growth, and the outbox backlog;
- at the end, once the workers have drained: every acknowledged Ingest is DONE (by
  GetIngestStatus, attempts >= 1) and has exactly one extraction_runs row per human
  speaker (by SQL on the harness's database).

Deadlines: Recall and Prefetch 1 s, Ingest 2 s. Client, server, workers and PostgreSQL share
the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp

from bench import corpus
from bench.harness import (
    LATE,
    Target,
    paced,
    result_paths,
    served_stack,
    summarize,
    write_result,
)
from bench.plots import latency_over_time
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc

RPCS = ("Recall", "Prefetch", "Ingest")
DEADLINE_S = {"Recall": 1.0, "Prefetch": 1.0, "Ingest": 2.0}
TENANT = "bench"  # the tenant of the harness's API key
USER_TURNS = [
    "I live in {city} now.",
    "I'm allergic to {allergen}.",
    "I love {hobby} on weekends.",
    "My {relation} is named {name}.",
    "I work as a {job}.",
    "Can you hear me?",
    "I'm planning to visit {city} in {month}.",
    "Thanks, that helps a lot.",
    "I drink {drink} every morning.",
]
CACHE = {
    pb.CACHE_STATUS_HIT: "hit",
    pb.CACHE_STATUS_MISS: "miss",
    pb.CACHE_STATUS_BYPASSED: "bypassed",
    pb.CACHE_STATUS_SKIPPED: "skipped",
}


def parse_mix(raw: str) -> dict[str, float]:
    """ "recall=40,prefetch=20,ingest=40" -> weights by RPC name (normalised)."""
    weights: dict[str, float] = {}
    for part in raw.split(","):
        name, _, value = part.partition("=")
        rpc = {r.lower(): r for r in RPCS}.get(name.strip().lower())
        if rpc is None or not value:
            raise SystemExit(f"--mix: expected recall=N,prefetch=N,ingest=N, got {raw!r}")
        weights[rpc] = float(value)
    total = sum(weights.values())
    if total <= 0:
        raise SystemExit("--mix: the weights must add up to more than 0")
    return {rpc: w / total for rpc, w in weights.items()}


@dataclass
class Outcome:
    """One call: which RPC, when it was due (s from the start), how long, how it ended."""

    rpc: str
    scheduled_s: float
    latency_s: float
    code: str
    degraded: bool = False
    cache: str = ""


@dataclass
class Soak:
    outcomes: list[Outcome] = field(default_factory=list)
    # ingest_id -> the human speakers it carried (what extraction must have run for).
    acked_ingests: dict[str, set[str]] = field(default_factory=dict)
    duplicates: int = 0
    rss: list[tuple[float, float]] = field(default_factory=list)
    backlog: list[tuple[float, int]] = field(default_factory=list)
    late_starts: int = 0


class Client:
    def __init__(self, target: Target, users: int, seed: int) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{target.port}")
        self.stub = memory_pb2_grpc.MemoryServiceStub(self.channel)
        self.metadata = (("x-api-key", target.api_key),)
        self.users = [f"user-{u:04d}" for u in range(users)]
        self.rng = random.Random(seed)
        self.queries = corpus.queries(50_000, seed=seed)

    def user(self) -> str:
        return self.rng.choice(self.users)

    def ingest_request(self, i: int) -> tuple[pb.IngestRequest, str]:
        user = self.user()
        sent = Timestamp()
        sent.GetCurrentTime()
        text = self.rng.choice(USER_TURNS).format(
            city=self.rng.choice(corpus.CITIES),
            allergen=self.rng.choice(corpus.ALLERGENS),
            hobby=self.rng.choice(corpus.HOBBIES),
            relation=self.rng.choice(corpus.RELATIONS),
            name=self.rng.choice(corpus.NAMES),
            job=self.rng.choice(corpus.JOBS),
            month=self.rng.choice(corpus.MONTHS),
            drink=self.rng.choice(corpus.DRINKS),
        )
        request = pb.IngestRequest(
            scope=pb.Scope(user_id=user),
            # A session per user and minute: episodes grow over a few turns, then a new one.
            session_id=f"s-{user}-{int(time.time() // 60)}",
            idempotency_key=uuid.uuid4().hex,
            messages=[
                pb.Message(
                    message_id=f"m{i}-u",
                    sender_id=user,
                    role=pb.MESSAGE_ROLE_USER,
                    text=text,
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
        return request, user

    async def call(self, i: int, rpc: str, soak: Soak) -> Outcome:
        timeout = DEADLINE_S[rpc]
        if rpc == "Recall":
            recall = pb.RecallRequest(
                scope=pb.Scope(user_id=self.user()), query=self.queries[i % len(self.queries)]
            )
            reply = await self.stub.Recall(recall, metadata=self.metadata, timeout=timeout)
            return Outcome(rpc, 0, 0, "OK", degraded=reply.degraded)
        if rpc == "Prefetch":
            prefetch = pb.PrefetchRequest(
                scope=pb.Scope(user_id=self.user()),
                session_id=f"call-{i}",
                hint=self.rng.choice(corpus.TOPICS),
            )
            packet = await self.stub.Prefetch(prefetch, metadata=self.metadata, timeout=timeout)
            return Outcome(rpc, 0, 0, "OK", degraded=packet.degraded, cache=CACHE[packet.cache])
        request, speaker = self.ingest_request(i)
        ack = await self.stub.Ingest(request, metadata=self.metadata, timeout=timeout)
        if ack.duplicate:
            soak.duplicates += 1
        soak.acked_ingests.setdefault(ack.ingest_id, set()).add(speaker)
        return Outcome(rpc, 0, 0, "OK")


async def seed(client: Client, per_user: int, concurrency: int = 8) -> dict[str, Any]:
    """Every user gets `per_user` distinct memories through Remember (the real write path)."""
    rng = random.Random(1)
    work = [
        (user, text)
        for user in client.users
        for text in corpus.distinct_sentences(corpus.FACT_TEMPLATES, per_user, rng)
    ]
    queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    for item in work:
        queue.put_nowait(item)
    errors: Counter[str] = Counter()
    started = time.perf_counter()

    async def worker() -> None:
        while not queue.empty():
            user, text = queue.get_nowait()
            request = pb.RememberRequest(scope=pb.Scope(user_id=user), content=text)
            try:
                await client.stub.Remember(request, metadata=client.metadata, timeout=10)
            except grpc.aio.AioRpcError as exc:
                errors[exc.code().name] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {
        "memories": len(work),
        "errors": dict(errors),
        "seconds": round(time.perf_counter() - started, 1),
    }


async def drive(
    client: Client, soak: Soak, mix: dict[str, float], rate: float, seconds: float
) -> None:
    """Open loop: call i is due at i / rate whatever happened to the others."""
    rpcs, weights = list(mix), list(mix.values())
    interval = 1.0 / rate
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int, rpc: str, due: float) -> None:
        try:
            outcome = await client.call(i, rpc, soak)
        except grpc.aio.AioRpcError as exc:
            outcome = Outcome(rpc, 0, 0, exc.code().name)
        outcome.scheduled_s = i * interval
        outcome.latency_s = time.perf_counter() - due
        if outcome.code == "OK" and outcome.latency_s > DEADLINE_S[rpc]:
            outcome.code = LATE  # answered, but after the caller's deadline
        soak.outcomes.append(outcome)

    def start_call(i: int, due: float) -> None:
        if time.perf_counter() - due > interval:
            soak.late_starts += 1  # the client itself fell behind (shows in latency too)
        task = asyncio.create_task(one(i, client.rng.choices(rpcs, weights)[0], due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    await paced(start_call, rate_per_s=rate, count=int(seconds * rate))
    if tasks:
        await asyncio.wait(set(tasks))


def read_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


async def sample(target: Target, soak: Soak, every_s: float, stop: asyncio.Event) -> None:
    """The server's RSS and the outbox backlog, every `every_s`, until stopped."""
    conn = await asyncpg.connect(target.pg_dsn)
    start = time.perf_counter()
    try:
        while True:
            t = time.perf_counter() - start
            rss = read_rss_mb(target.server_pid)
            if rss is not None:
                soak.rss.append((round(t, 1), round(rss, 1)))
            backlog = await conn.fetchval(
                "SELECT count(*) FROM ingest_outbox WHERE state IN ('pending', 'processing')"
            )
            soak.backlog.append((round(t, 1), int(backlog)))
            try:
                await asyncio.wait_for(stop.wait(), timeout=every_s)
                return
            except TimeoutError:
                pass
    finally:
        await conn.close()


def _rounded(value: object) -> object:
    """A figure for the JSON: floats to 0.1 ms, none (null) where there was no call."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 1)
    return value


def rpc_summary(rpc: str, outcomes: list[Outcome], wall_s: float) -> dict[str, Any]:
    """One RPC's calls: percentiles over all of them (a failed or late call at the RPC's
    deadline) and over the OK ones, errors by code, degraded answers, cache outcomes."""
    figures = summarize(
        rpc,
        [o.latency_s for o in outcomes],
        ["ok" if o.code == "OK" else o.code for o in outcomes],
        DEADLINE_S[rpc],
        wall_s,
    ).as_dict()
    ok = [o for o in outcomes if o.code == "OK"]
    summary: dict[str, Any] = {
        **{k: _rounded(v) for k, v in figures.items()},
        "errors_by_code": dict(Counter(o.code for o in outcomes if o.code != "OK")),
        "degraded": sum(o.degraded for o in ok),
    }
    caches = Counter(o.cache for o in ok if o.cache)
    if caches:
        summary["cache"] = dict(caches)
    return summary


def windows(outcomes: list[Outcome], window_s: float) -> list[dict[str, Any]]:
    by_window: dict[int, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_window[int(o.scheduled_s // window_s)].append(o)
    out = []
    for w in sorted(by_window):
        calls = by_window[w]
        out.append(
            {
                "start_s": w * window_s,
                "rpcs": {
                    rpc: rpc_summary(rpc, [o for o in calls if o.rpc == rpc], window_s)
                    for rpc in RPCS
                    if any(o.rpc == rpc for o in calls)
                },
            }
        )
    return out


def rss_summary(rss: list[tuple[float, float]], settle_s: float) -> dict[str, Any]:
    """Growth over the whole run, per window, and the trend after the first window."""
    if not rss:
        return {}
    values = [v for _, v in rss]
    settled = [(t, v) for t, v in rss if t >= settle_s]
    slope = None
    if len(settled) >= 3:
        ts, vs = zip(*settled, strict=True)
        slope = round(float(np.polyfit(np.asarray(ts) / 60, np.asarray(vs), 1)[0]), 2)
    by_window: dict[int, list[float]] = defaultdict(list)
    for t, v in rss:
        by_window[int(t // settle_s)].append(v)
    # Per window, from the previous window's last sample: a leak keeps growing, warm-up slows.
    growth_by_window, last = [], values[0]
    for w in sorted(by_window):
        growth_by_window.append(round(by_window[w][-1] - last, 1))
        last = by_window[w][-1]
    return {
        "start_mb": values[0],
        "end_mb": values[-1],
        "max_mb": max(values),
        "growth_mb": round(values[-1] - values[0], 1),
        "growth_after_first_window_mb": round(settled[-1][1] - settled[0][1], 1)
        if settled
        else None,
        "trend_after_first_window_mb_per_min": slope,
        "growth_by_window_mb": growth_by_window,
    }


async def wait_drained(target: Target, timeout_s: float) -> float | None:
    """Seconds until the outbox has no pending or processing job (None: not in time)."""
    conn = await asyncpg.connect(target.pg_dsn)
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < timeout_s:
            left = await conn.fetchval(
                "SELECT count(*) FROM ingest_outbox WHERE state IN ('pending', 'processing')"
            )
            if left == 0:
                return round(time.perf_counter() - started, 1)
            await asyncio.sleep(0.5)
    finally:
        await conn.close()
    return None


async def check_exactly_once(client: Client, target: Target, soak: Soak) -> dict[str, Any]:
    """Every acknowledged Ingest DONE (GetIngestStatus) with one extraction run per speaker."""
    states: Counter[str] = Counter()
    not_done: list[str] = []
    no_attempt: list[str] = []
    semaphore = asyncio.Semaphore(16)

    async def status(ingest_id: str) -> None:
        async with semaphore:
            reply = await client.stub.GetIngestStatus(
                pb.GetIngestStatusRequest(ingest_id=ingest_id), metadata=client.metadata, timeout=5
            )
        states[pb.IngestState.Name(reply.state)] += 1
        if reply.state != pb.INGEST_STATE_DONE:
            not_done.append(ingest_id)
        elif reply.attempts < 1:
            no_attempt.append(ingest_id)

    await asyncio.gather(*(status(i) for i in soak.acked_ingests))

    conn = await asyncpg.connect(target.pg_dsn)
    try:
        rows = await conn.fetch(
            "SELECT ingest_id::text, user_id, count(*) FROM extraction_runs"
            " WHERE tenant_id = $1 GROUP BY ingest_id, user_id",
            TENANT,
        )
        dead = await conn.fetchval(
            "SELECT count(*) FROM ingest_outbox WHERE tenant_id = $1 AND state = 'dead'", TENANT
        )
    finally:
        await conn.close()
    runs = {(r[0], r[1]): int(r[2]) for r in rows}
    expected = {(i, s) for i, speakers in soak.acked_ingests.items() for s in speakers}
    missing = sorted(expected - runs.keys())
    repeated = sorted(k for k in expected if runs.get(k, 0) > 1)
    unacknowledged = len({i for i, _ in runs} - soak.acked_ingests.keys())
    return {
        "acknowledged": len(soak.acked_ingests),
        "duplicate_acks": soak.duplicates,
        "states": dict(states),
        "not_done": not_done[:20],
        "done_without_attempt": no_attempt[:20],
        "speaker_runs_expected": len(expected),
        "speaker_runs_missing": [list(k) for k in missing[:20]],
        "speaker_runs_repeated": [list(k) for k in repeated[:20]],
        "runs_of_unacknowledged_ingests": unacknowledged,
        "dead_jobs": int(dead),
        "exactly_once": not not_done and not no_attempt and not missing and not repeated,
    }


def print_windows(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'window':>8} {'rpc':<9} {'n':>5} {'p50':>7} {'p95':>7} {'p99':>7} {'OK p99':>7} "
        f"{'max':>7}  errors (p50-p99: all calls, a failed or late one at its deadline)"
    )
    for row in rows:
        for rpc, s in row["rpcs"].items():
            cells = [
                f"{s[k]:7.1f}" if s[k] is not None else f"{'-':>7}"
                for k in ("p50_ms", "p95_ms", "p99_ms", "ok_p99_ms", "max_ms")
            ]
            extra = dict(s["errors_by_code"])
            if s["degraded"]:
                extra["degraded"] = s["degraded"]
            print(
                f"{row['start_s']:>7.0f}s {rpc:<9} {s['calls']:>5} {' '.join(cells)}  {extra or ''}"
            )


def plot(path: Path, result: dict[str, Any]) -> None:
    """p50 and p99 (all calls) of each RPC per window, over the server's RSS."""
    rows = result["windows"]
    lines = [
        (
            f"{rpc} {p}",
            [row["rpcs"][rpc][f"{p}_ms"] if rpc in row["rpcs"] else None for row in rows],
        )
        for rpc in RPCS
        for p in ("p50", "p99")
        if any(rpc in row["rpcs"] for row in rows)
    ]
    config = result["config"]
    latency_over_time(
        path,
        [row["start_s"] for row in rows],
        lines,
        title=(
            f"Soak: {config['rate_per_s']:g} calls/s for {config['minutes']:g} min, latency per "
            f"{config['window_s']:g} s window (failed or late calls at the deadline)"
        ),
        rss=result["server_rss"]["samples"],
        traffic_s=result["traffic_s"],
    )


def report(result: dict[str, Any]) -> dict[str, Any]:
    """What bench/RESULTS.md shows of a soak."""
    config, rss, once = result["config"], result["server_rss"], result["exactly_once"]
    mix = ", ".join(f"{rpc} {share:.0%}" for rpc, share in config["mix"].items())
    return {
        "title": (
            f"Soak, {config['rate_per_s']:g} calls/s open loop for {config['minutes']:g} min "
            f"({mix}), workers on"
        ),
        "rows": [result["overall"][rpc] for rpc in RPCS if result["overall"][rpc]["calls"]],
        "ratios": [],
        "notes": [
            f"errors by status: {result['errors_by_status'] or 'none'}",
            f"server RSS {rss.get('start_mb')} -> {rss.get('end_mb')} MB, trend after the "
            f"first window {rss.get('trend_after_first_window_mb_per_min')} MB/min",
            f"outbox drained {result['outbox_drained_after_s']} s after the traffic stopped; "
            f"exactly once: {once['exactly_once']} ({once['acknowledged']} acknowledged, "
            f"{once['dead_jobs']} dead)",
        ],
    }


async def run(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    mix = parse_mix(args.mix)
    client = Client(target, args.users, seed=args.seed)
    soak = Soak()
    try:
        seeded = await seed(client, args.memories_per_user)
        print(f"seeded {seeded}")
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample(target, soak, args.rss_every_s, stop))
        started = time.perf_counter()
        await drive(client, soak, mix, args.rate, args.minutes * 60)
        traffic_s = time.perf_counter() - started
        drained_s = await wait_drained(target, args.drain_timeout_s)
        stop.set()
        await sampler
        final = await check_exactly_once(client, target, soak)
    finally:
        await client.channel.close(None)

    per_window = windows(soak.outcomes, args.window_s)
    print_windows(per_window)
    overall = {
        rpc: rpc_summary(rpc, [o for o in soak.outcomes if o.rpc == rpc], traffic_s) for rpc in RPCS
    }
    errors = dict(Counter(o.code for o in soak.outcomes if o.code != "OK"))
    rss = rss_summary(soak.rss, settle_s=args.window_s)
    print("overall:", json.dumps(overall))
    print("errors by status:", errors or "none")
    print("server RSS:", json.dumps(rss))
    print(f"outbox drained {drained_s} s after the traffic stopped")
    print("exactly once:", json.dumps({k: v for k, v in final.items() if k != "not_done"}))
    return {
        "config": {
            "minutes": args.minutes,
            "rate_per_s": args.rate,
            "mix": mix,
            "users": args.users,
            "memories_per_user": args.memories_per_user,
            "window_s": args.window_s,
            "deadlines_s": DEADLINE_S,
        },
        "seed": seeded,
        "traffic_s": round(traffic_s, 1),
        "calls": len(soak.outcomes),
        "client_late_starts": soak.late_starts,
        "overall": overall,
        "errors_by_status": errors,
        "windows": per_window,
        "server_rss": {**rss, "samples": soak.rss},
        "outbox_backlog": soak.backlog,
        "outbox_drained_after_s": drained_s,
        "exactly_once": final,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=40.0, help="calls per second, all RPCs")
    parser.add_argument("--mix", default="recall=40,prefetch=20,ingest=40")
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--memories-per-user", type=int, default=5)
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--rss-every-s", type=float, default=5.0)
    parser.add_argument("--drain-timeout-s", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    parse_mix(args.mix)  # fail before starting anything
    with served_stack() as target:
        result = asyncio.run(run(target, args))
    out, png = result_paths("soak")
    write_result(out, result, report(result))
    plot(png, result)
    print(f"written {png}")
    if not result["exactly_once"]["exactly_once"]:
        raise SystemExit("not every acknowledged Ingest was extracted exactly once")


if __name__ == "__main__":
    main()
