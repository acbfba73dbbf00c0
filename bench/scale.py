"""One node at scale: a million memories over 10,000 users, then Recall at a steady rate.

    python -m bench.scale [--users 10000] [--memories-per-user 100] [--messages-per-user 10]
                          [--rate 50] [--count 1500] [--processes 1]

The embedded PostgreSQL and valkey, `memsvc serve` in its own process (workers off), this
process seeding (bench/corpus.py: COPY, then each HNSW index built in bulk, timed) and then
the load generator: open loop at ``--rate``, every query distinct, users at random, 800 ms
deadlines (a chat call: the latency is measured, not cut). Reported: Recall p50/p95/p99 over
every call (targets at 50/s: p50 <= 15 ms, p99 <= 50 ms), the same with a caller-supplied
vector (no embedding), the seeding and index build times, the database's size on disk (and
its largest tables), and the server's resident memory after the run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from bench import corpus
from bench.harness import Call, Phase, Target, free_port, result_paths, served_stack, write_result
from bench.plots import latency_cdf
from bench.recall import Client, client_vectors, run_phase
from memsvc.v1 import memory_pb2 as pb

DEADLINE_S = 0.8
TARGET_P50_MS = 15.0
TARGET_P99_MS = 50.0


async def database_size(dsn: str) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    try:
        total = await conn.fetchval("SELECT pg_database_size(current_database())")
        rows = await conn.fetch(
            "SELECT relname, pg_total_relation_size(c.oid) AS bytes"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind = 'r'"
            " ORDER BY bytes DESC LIMIT 6"
        )
        return {
            "database_mb": round(total / 2**20, 1),
            "largest_tables_mb": {r["relname"]: round(r["bytes"] / 2**20, 1) for r in rows},
        }
    finally:
        await conn.close()


def server_rss_mb(pid: int) -> float:
    """Resident memory of the serving process and its children (with --processes)."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    return round(float(sum(p.memory_info().rss for p in procs)) / 2**20, 1)


async def drive(target: Target, args: argparse.Namespace) -> list[Phase]:
    client = Client(target, args.users, seed=31)
    texts = iter(corpus.queries(200_000, seed=13))
    vectors = await client_vectors(500)
    rng = random.Random(5)

    async def recall_text(_i: int) -> str:
        request = pb.RecallRequest(scope=pb.Scope(user_id=client.user()), query=next(texts))
        return await client.recall(request, DEADLINE_S)

    async def recall_vector(_i: int) -> str:
        request = pb.RecallRequest(
            scope=pb.Scope(user_id=client.user()), query_vector=rng.choice(vectors)
        )
        return await client.recall(request, DEADLINE_S)

    calls: list[tuple[str, Call]] = [("Recall text", recall_text), ("Recall vector", recall_vector)]
    try:
        await run_phase(client, "warm-up", recall_text, args.rate, 200, DEADLINE_S)
        return [
            await run_phase(client, name, call, args.rate, args.count, DEADLINE_S)
            for name, call in calls
        ]
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    corpus.add_arguments(parser, users=10_000, memories_per_user=100, messages_per_user=10)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--count", type=int, default=1500)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="keep the servers' data here: a later run with the same folder skips the seeding "
        "(its seeding and index figures are then those of the run that seeded)",
    )
    args = parser.parse_args()
    server_env = {"MEMSVC_RUN_WORKERS": "false", "MEMSVC_METRICS_PORT": str(free_port())}
    out, plot = result_paths("scale")
    with served_stack(
        server_env, serve_args=("--processes", str(args.processes)), data_dir=args.data_dir
    ) as target:
        seeded = asyncio.run(corpus.seeded_before(target.pg_dsn)) if args.data_dir else None
        if seeded is None:
            seeded = corpus.seed_from_args(target.pg_dsn, args)
        else:
            print(f"corpus kept in {args.data_dir}: {seeded}")
        size = asyncio.run(database_size(target.pg_dsn))
        print(f"on disk: {size}")
        phases = asyncio.run(drive(target, args))
        rss_mb = server_rss_mb(target.server_pid)
        print(f"server RSS after the run: {rss_mb} MB")
    text = phases[0].summary()
    notes = [
        f"{seeded.memories:,} memories, {seeded.messages:,} messages, {seeded.episodes:,} "
        f"episodes over {seeded.users:,} users; "
        + (
            f"seeded in {seeded.seconds:.0f} s"
            if seeded.seconds
            else f"seeded by an earlier run into {args.data_dir} (see its result)"
        ),
        f"HNSW index builds (s): {seeded.index_build_s or 'see the run that seeded'}",
        f"database {size['database_mb']} MB; largest tables (MB, with indexes): "
        f"{size['largest_tables_mb']}",
        f"server RSS after the run: {rss_mb} MB ({args.processes} process(es))",
        f"Recall text at {args.rate:g}/s: p50 {text.p50_ms:.1f} ms (target <= "
        f"{TARGET_P50_MS:g}), p99 {text.p99_ms:.1f} ms (target <= {TARGET_P99_MS:g})",
    ]
    for note in notes:
        print(note)
    write_result(
        out,
        {
            "args": dict(vars(args)),
            "corpus": asdict(seeded),
            "size": size,
            "server_rss_mb": rss_mb,
            "phases": {p.name: p.as_dict() for p in phases},
        },
        {
            "title": f"Recall over {seeded.memories:,} memories on one node, {args.rate:g}/s",
            "rows": [p.summary().as_dict() for p in phases],
            "notes": notes,
        },
    )
    latency_cdf(
        plot,
        [(p.name, p.counted_ms()) for p in phases],
        title=f"Recall over {seeded.memories:,} memories, open loop at {args.rate:g}/s",
    )


if __name__ == "__main__":
    main()
