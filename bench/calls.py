"""Call pattern: many users each holding calls one after another, as a gateway drives memsvc.

    python -m bench.calls [--users 40] [--sessions 4] [--turns 5] [--turn-s 2.0] [--gap-s 4.0]

Every user runs ``--sessions`` calls in a row. A call is: session setup (a hint-less Prefetch,
as a gateway does before the first words), then ``--turns`` turns, each a Recall on what the
user said (chat deadline) followed by the Ingest of the turn, one every ``--turn-s`` seconds;
the last Ingest says ``end_of_session``. The next call starts ``--gap-s`` seconds later. Users
start spread over one turn interval, so the load is steady: about ``2 * users / turn_s`` calls
a second. `memsvc serve` runs in its own process with its ingest workers on (bench/harness.py).

What it reports (bench/results/calls-*.json): latency of each RPC over every call (a failed
or late call counted at its deadline), and what matters here, the packet cache at call setup:
the share of setup Prefetches answered from the cache (HIT) from each user's second call on
(a user's first call has never been prefetched, so nothing could be ready for it).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from bench import corpus
from bench.harness import Target, result_paths, served_stack, summarize, write_result
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc

DEADLINE_S = {"Prefetch": 0.2, "Recall": 0.8, "Ingest": 2.0}
RPCS = tuple(DEADLINE_S)
CACHE = {
    pb.CACHE_STATUS_HIT: "hit",
    pb.CACHE_STATUS_MISS: "miss",
    pb.CACHE_STATUS_BYPASSED: "bypassed",
    pb.CACHE_STATUS_SKIPPED: "skipped",
}
SAID = [
    "I live in {city} now.",
    "I'm allergic to {allergen}.",
    "I love {hobby} on weekends.",
    "My {relation} is named {name}.",
    "I work as a {job}.",
    "I'm planning to visit {city} in {month}.",
    "I drink {drink} every morning.",
]


@dataclass
class Calls:
    """Every call's RPC, latency and status; the setup Prefetches' cache outcome by call."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in RPCS})
    outcomes: dict[str, list[str]] = field(default_factory=lambda: {r: [] for r in RPCS})
    # (call number of the user, cache outcome) of every setup Prefetch answered.
    setups: list[tuple[int, str]] = field(default_factory=list)


class User:
    def __init__(self, name: str, stub: Any, metadata: Any, seed: int) -> None:
        self.name = name
        self.stub = stub
        self.metadata = metadata
        self.rng = random.Random(seed)

    def said(self) -> str:
        r = self.rng
        return r.choice(SAID).format(
            city=r.choice(corpus.CITIES),
            allergen=r.choice(corpus.ALLERGENS),
            hobby=r.choice(corpus.HOBBIES),
            relation=r.choice(corpus.RELATIONS),
            name=r.choice(corpus.NAMES),
            job=r.choice(corpus.JOBS),
            month=r.choice(corpus.MONTHS),
            drink=r.choice(corpus.DRINKS),
        )

    async def timed(self, calls: Calls, rpc: str, request: Any) -> Any:
        started = time.perf_counter()
        try:
            reply = await getattr(self.stub, rpc)(
                request, metadata=self.metadata, timeout=DEADLINE_S[rpc]
            )
            code = "ok"
        except grpc.aio.AioRpcError as exc:
            reply, code = None, exc.code().name
        calls.latencies[rpc].append(time.perf_counter() - started)
        calls.outcomes[rpc].append(code)
        return reply

    async def session(self, calls: Calls, number: int, turns: int, turn_s: float) -> None:
        scope = pb.Scope(user_id=self.name)
        session_id = f"{self.name}-call-{number}"
        packet = await self.timed(
            calls, "Prefetch", pb.PrefetchRequest(scope=scope, session_id=session_id)
        )
        if packet is not None:
            calls.setups.append((number, CACHE[packet.cache]))
        for turn in range(turns):
            began = time.perf_counter()
            text = self.said()
            await self.timed(calls, "Recall", pb.RecallRequest(scope=scope, query=text))
            sent = Timestamp()
            sent.GetCurrentTime()
            messages = [
                pb.Message(
                    message_id=f"t{turn}-u",
                    sender_id=self.name,
                    role=pb.MESSAGE_ROLE_USER,
                    text=text,
                    sent_at=sent,
                ),
                pb.Message(
                    message_id=f"t{turn}-a",
                    sender_id="agent",
                    role=pb.MESSAGE_ROLE_ASSISTANT,
                    text="Got it, I'll keep that in mind.",
                    sent_at=sent,
                ),
            ]
            await self.timed(
                calls,
                "Ingest",
                pb.IngestRequest(
                    scope=scope,
                    session_id=session_id,
                    idempotency_key=uuid.uuid4().hex,
                    messages=messages,
                    end_of_session=turn == turns - 1,
                ),
            )
            await asyncio.sleep(max(0.0, turn_s - (time.perf_counter() - began)))

    async def run(self, calls: Calls, args: argparse.Namespace, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        for number in range(args.sessions):
            await self.session(calls, number, args.turns, args.turn_s)
            await asyncio.sleep(args.gap_s)


async def run(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{target.port}")
    stub = memory_pb2_grpc.MemoryServiceStub(channel)
    metadata = (("x-api-key", target.api_key),)
    users = [User(f"caller-{u:04d}", stub, metadata, seed=u) for u in range(args.users)]
    calls = Calls()
    started = time.perf_counter()
    try:
        await asyncio.gather(
            *(u.run(calls, args, delay_s=args.turn_s * i / args.users) for i, u in enumerate(users))
        )
    finally:
        await channel.close(None)
    wall_s = time.perf_counter() - started
    rows = {
        rpc: summarize(
            f"calls {rpc}", calls.latencies[rpc], calls.outcomes[rpc], DEADLINE_S[rpc], wall_s
        ).as_dict()
        for rpc in RPCS
    }
    later = Counter(outcome for number, outcome in calls.setups if number > 0)
    first = Counter(outcome for number, outcome in calls.setups if number == 0)
    answered = sum(later.values())
    hit_rate = later["hit"] / answered if answered else None
    return {
        "config": vars(args),
        "wall_s": round(wall_s, 1),
        "rows": rows,
        "setup_cache_after_first_call": dict(later),
        "setup_cache_first_call": dict(first),
        "setup_hit_rate": hit_rate,
        "setups_not_answered": args.users * args.sessions - len(calls.setups),
    }


def report(result: dict[str, Any]) -> dict[str, Any]:
    """What bench/RESULTS.md shows of a call-pattern run."""
    c = result["config"]
    rate = result["setup_hit_rate"]
    return {
        "title": (
            f"Call pattern: {c['users']} users x {c['sessions']} calls of {c['turns']} turns "
            f"(a turn every {c['turn_s']:g} s, {c['gap_s']:g} s between calls), workers on"
            + (f", {', '.join(c['server_env'])}" if c["server_env"] else "")
        ),
        "rows": [result["rows"][rpc] for rpc in RPCS],
        "ratios": [],
        "notes": [
            "setup Prefetch from each user's second call on: "
            f"{'n/a' if rate is None else f'{rate:.1%}'} cache hits "
            f"({result['setup_cache_after_first_call']}); first calls: "
            f"{result['setup_cache_first_call']}; setups not answered in 200 ms: "
            f"{result['setups_not_answered']}",
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--sessions", type=int, default=4, help="calls per user, one by one")
    parser.add_argument("--turns", type=int, default=5, help="turns per call")
    parser.add_argument("--turn-s", type=float, default=2.0, help="seconds between turns")
    parser.add_argument("--gap-s", type=float, default=4.0, help="seconds between two calls")
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="MEMSVC_X=value",
        help="extra server setting (repeatable), e.g. MEMSVC_PREFETCH_WARM=false",
    )
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.server_env)
    with served_stack(extra) as target:
        result = asyncio.run(run(target, args))
    out, _ = result_paths("calls")
    write_result(out, result, report(result))
    for rpc in RPCS:
        print(result["rows"][rpc])
    print(report(result)["notes"][0])


if __name__ == "__main__":
    main()
