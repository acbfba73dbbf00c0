"""Capacity and overload: the highest Recall rate memsvc serves well, then 2x, 4x and 8x it.

    python -m bench.overload [--processes 1] [--workers] [--factors 2,4,8]
                             [--capacity-rates 50,75,100,...] [--capacity RATE]
                             [--users 1000] [--memories-per-user 100] [--messages-per-user 50]
                             [--seconds 10] [--server-env MEMSVC_X=value ...]

memsvc runs as its own process (`memsvc serve --processes N`; ``--workers``: the extraction
workers in the serving processes too, as `memsvc dev` runs them), this process seeds the corpus
(bench/corpus.py) and is the load generator: open loop, every query distinct (each costs an
embedding), users drawn at random. Client, server, PostgreSQL and valkey share the machine.

1. capacity: text Recall at rising rates with 2 s deadlines; the capacity is the highest rate
   whose p99 over every call is <= 200 ms with no error and every answer whole (a degraded
   one, without its dense leg, says the server was already shedding work: counting those
   would measure how fast it answers worse; ``--capacity`` skips the climb);
2. overload: each factor times the capacity for ``--seconds``, 200 ms deadlines. Every answer
   is classified: OK, OK but degraded (a leg missing: counted as OK), DEADLINE_EXCEEDED,
   RESOURCE_EXHAUSTED, late (an OK answer received after the deadline), other. Targets: no
   DEADLINE_EXCEEDED and nothing late at any factor, at least 70% OK at 4x.

The server's log is kept beside the result (bench/results/overload-*.log) and searched for
exceptions nobody retrieved ("never retrieved") and tracebacks: each is a defect.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

from bench import corpus
from bench.harness import (
    LATE,
    OK_OUTCOMES,
    Call,
    Phase,
    Target,
    free_ports,
    result_paths,
    served_stack,
    write_result,
)
from bench.plots import latency_cdf
from bench.recall import Client, server_recall_codes
from memsvc.v1 import memory_pb2 as pb

CAPACITY_P99_MS = 200.0
CAPACITY_DEADLINE_S = 2.0
OVERLOAD_DEADLINE_S = 0.2
STEP_SECONDS = 8.0
# What the server log must not contain.
LOG_DEFECTS = {
    "never retrieved": re.compile(r"never retrieved"),
    "traceback": re.compile(r"^Traceback", re.MULTILINE),
}


def tree_cpu_s(pid: int, *, descendants: bool = True) -> float:
    """CPU seconds (user + system) of a process and its descendants alive now."""
    if not pid:
        return 0.0
    try:
        root = psutil.Process(pid)
        total = 0.0
        for proc in (root, *(root.children(recursive=True) if descendants else ())):
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                continue
        return total
    except psutil.NoSuchProcess:
        return 0.0


def cpu_snapshot(target: Target) -> dict[str, float]:
    """CPU seconds so far of memsvc, PostgreSQL, valkey and this load generator (a backend
    that exits between two snapshots takes its time with it: PostgreSQL's pooled
    connections live on, so that is rare)."""
    return {
        "memsvc": tree_cpu_s(target.server_pid),
        "postgresql": tree_cpu_s(target.pg_pid),
        "valkey": tree_cpu_s(target.valkey_pid),
        # Not its children: the servers are this process's children.
        "load generator": tree_cpu_s(os.getpid(), descendants=False),
    }


def cpu_per_call_ms(
    before: dict[str, float], after: dict[str, float], calls: int
) -> dict[str, float]:
    return {k: round((after[k] - before[k]) * 1000 / max(1, calls), 3) for k in before}


def _rates(raw: str) -> list[float]:
    return [float(r) for r in raw.split(",")]


async def _phase(
    client: Client, name: str, call: Call, rate: float, seconds: float, deadline_s: float
) -> Phase:
    from bench.recall import run_phase

    return await run_phase(client, name, call, rate, max(1, int(rate * seconds)), deadline_s)


def server_codes(metrics_port: int, processes: int) -> Counter[str]:
    """Recall answers by code, summed over the serving processes (process i serves metrics
    on the port + i)."""
    total: Counter[str] = Counter()
    for i in range(processes):
        total.update(server_recall_codes(metrics_port + i))
    return total


def missing_legs(metrics_port: int, processes: int) -> Counter[str]:
    """Recall legs missing from answers so far, as "leg:reason" (late, failed, overload),
    summed over the serving processes: says what a degraded answer waited for."""
    total: Counter[str] = Counter()
    for i in range(processes):
        url = f"http://127.0.0.1:{metrics_port + i}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            if family.name == "memsvc_recall_missing_legs":
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        leg, reason = sample.labels["leg"], sample.labels["reason"]
                        total[f"{leg}:{reason}"] += int(sample.value)
    return total


def ok_share(phase: Phase) -> float:
    """Answers in time (degraded ones included) over all calls."""
    counts = phase.outcome_counts()
    ok = sum(n for outcome, n in counts.items() if outcome in OK_OUTCOMES)
    return ok / max(1, len(phase.outcomes))


async def drive(target: Target, args: argparse.Namespace, metrics_port: int) -> dict[str, Any]:
    # Four connections per serving process: the kernel hands each to one of them.
    client = Client(target, args.users, seed=23, channels=4 * args.processes)
    texts = iter(corpus.queries(400_000, seed=7))

    def recall_text(timeout_s: float) -> Call:
        async def call(_i: int) -> str:
            request = pb.RecallRequest(scope=pb.Scope(user_id=client.user()), query=next(texts))
            return await client.recall(request, timeout_s)

        return call

    try:
        await _phase(
            client, "warm-up", recall_text(CAPACITY_DEADLINE_S), 20, 5, CAPACITY_DEADLINE_S
        )
        steps: list[dict[str, Any]] = []
        capacity = args.capacity
        if not capacity:
            for rate in args.capacity_rates:
                await asyncio.sleep(2.0)  # the previous step's stragglers
                cpu_before = cpu_snapshot(target)
                phase = await _phase(
                    client,
                    f"capacity {rate:g}/s",
                    recall_text(CAPACITY_DEADLINE_S),
                    rate,
                    STEP_SECONDS,
                    CAPACITY_DEADLINE_S,
                )
                summary = phase.summary()
                cpu = cpu_per_call_ms(cpu_before, cpu_snapshot(target), len(phase.outcomes))
                print(f"    CPU ms per call {cpu}")
                degraded = phase.outcome_counts().get("degraded", 0)
                good = summary.errors == 0 and summary.p99_ms <= CAPACITY_P99_MS and not degraded
                steps.append(
                    {"rate_per_s": rate, "ok": good, "cpu_ms_per_call": cpu, **phase.as_dict()}
                )
                if good:
                    capacity = rate
                elif summary.p99_ms > 4 * CAPACITY_P99_MS:
                    break  # far past saturation
        print(
            f"capacity: {capacity:g} Recalls/s "
            f"(p99 <= {CAPACITY_P99_MS:g} ms, no error, none degraded)"
        )
        if not capacity:
            # Not even the lowest rate was served well: multiples of nothing say nothing.
            print("no capacity found (a busy machine?): overload phases skipped")
            return {"capacity_per_s": 0.0, "steps": steps, "overloads": [], "phases": []}
        overloads: list[dict[str, Any]] = []
        phases: list[Phase] = []
        for factor in args.factors:
            await asyncio.sleep(3.0)
            rate = factor * capacity
            before = server_codes(metrics_port, args.processes)
            legs_before = missing_legs(metrics_port, args.processes)
            cpu_before = cpu_snapshot(target)
            phase = await _phase(
                client,
                f"{factor:g}x ({rate:g}/s) 200ms",
                recall_text(OVERLOAD_DEADLINE_S),
                rate,
                args.seconds,
                OVERLOAD_DEADLINE_S,
            )
            cpu = cpu_per_call_ms(cpu_before, cpu_snapshot(target), len(phase.outcomes))
            server_side = server_codes(metrics_port, args.processes)
            server_side.subtract(before)
            legs = missing_legs(metrics_port, args.processes)
            legs.subtract(legs_before)
            share = ok_share(phase)
            counts = phase.outcome_counts()
            print(
                f"  {factor:g}x: OK share {share:.1%}, DEADLINE_EXCEEDED "
                f"{counts.get('DEADLINE_EXCEEDED', 0)}, late {counts.get(LATE, 0)} "
                f"({phase.late_from_send()} of them late from the send); "
                f"as the server answered: {dict(+server_side)}; CPU ms per call {cpu}; "
                f"load generator's start lag ms {phase.start_lag_ms()}; missing legs "
                f"{dict(+legs)}; refused because {dict(phase.refusals.most_common())}"
            )
            phases.append(phase)
            overloads.append(
                {
                    "factor": factor,
                    "ok_share": round(share, 4),
                    "server_codes": dict(+server_side),
                    "missing_legs": dict(+legs),
                    "cpu_ms_per_call": cpu,
                    **phase.as_dict(),
                }
            )
        return {
            "capacity_per_s": capacity,
            "steps": steps,
            "overloads": overloads,
            "phases": phases,
        }
    finally:
        await client.close()


def log_defects(path: Path) -> dict[str, int]:
    text = path.read_text(errors="replace") if path.exists() else ""
    return {name: len(pattern.findall(text)) for name, pattern in LOG_DEFECTS.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    corpus.add_arguments(parser, users=1000, memories_per_user=100, messages_per_user=50)
    parser.add_argument("--processes", type=int, default=1, help="memsvc serve --processes")
    parser.add_argument(
        "--workers", action="store_true", help="extraction workers in the serving processes"
    )
    parser.add_argument("--factors", type=_rates, default=[2.0, 4.0, 8.0])
    parser.add_argument(
        "--capacity-rates",
        type=_rates,
        default=[25.0, 50.0, 75.0, 100.0, 125.0, 150.0, 200.0, 250.0],
    )
    parser.add_argument("--capacity", type=float, default=0.0, help="skip the climb")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each overload")
    parser.add_argument("--server-env", action="append", default=[], metavar="MEMSVC_X=value")
    args = parser.parse_args()

    metrics_port = free_ports(args.processes)
    server_env = {
        "MEMSVC_RUN_WORKERS": "true" if args.workers else "false",
        "MEMSVC_METRICS_PORT": str(metrics_port),
    }
    for pair in args.server_env:
        name, _, value = pair.partition("=")
        server_env[name] = value
    # One kind per process count: bench/report.py shows the newest result of each.
    out, plot = result_paths(f"overload-p{args.processes}")
    log_path = out.with_suffix(".log")
    with served_stack(
        server_env, serve_args=("--processes", str(args.processes)), log_path=log_path
    ) as target:
        seeded = corpus.seed_from_args(target.pg_dsn, args)
        found = asyncio.run(drive(target, args, metrics_port))
    defects = log_defects(log_path)
    print(f"server log {log_path}: {defects}")
    phases: list[Phase] = found.pop("phases")
    at_4x = next((o for o in found["overloads"] if o["factor"] == 4.0), None)
    notes = [
        f"{args.processes} serving process(es), workers {'on' if args.workers else 'off'}; "
        f"corpus {seeded.memories:,} memories, {seeded.messages:,} messages, {args.users:,} users",
        f"capacity: {found['capacity_per_s']:g} Recalls/s "
        f"(p99 <= {CAPACITY_P99_MS:g} ms, no error, none degraded)",
        *(
            f"{o['factor']:g}x = {o['rate_per_s']:g}/s: {o['outcomes']}, OK share "
            f"{o['ok_share']:.1%}"
            for o in found["overloads"]
        ),
        f"server log: {defects}",
    ]
    if at_4x is not None:
        notes.append(f"target at 4x: >= 70% OK; measured {at_4x['ok_share']:.1%}")
    write_result(
        out,
        {"args": dict(vars(args)), "server_env": server_env, "log_defects": defects, **found},
        {
            "title": f"Recall capacity and overload, {args.processes} process(es)",
            "rows": [p.summary().as_dict() for p in phases],
            "notes": notes,
        },
    )
    latency_cdf(
        plot,
        [(p.name, p.counted_ms()) for p in phases],
        title="Recall under overload (200 ms deadlines): failed or late calls at the deadline",
    )


if __name__ == "__main__":
    main()
