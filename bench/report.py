"""Writes bench/RESULTS.md from the newest JSON result of each benchmark in bench/results/.

    python -m bench.report [--results-dir bench/results] [--out bench/RESULTS.md]

`make bench` runs it last. Each benchmark's JSON carries its provenance (command, commit,
CPU, date) and a ``report`` block (title, rows, ratios to the floor, notes); this module
only lays them out.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from bench.harness import RESULTS_DIR

BENCHMARKS = (
    "remember",
    "ingest",
    "recall",
    "calls",
    "soak",
    "overload-p1",
    "overload-p2",
    "scale",
    "valkey-cluster-recall",
    "citus-recall",
    "chaos-p1",
    "chaos-p2",
    "chaos-citus",
)
OUT = Path(__file__).parent / "RESULTS.md"

PREAMBLE = """# Benchmark results

Written by `python -m bench.report` (the last step of `make bench`) from the newest JSON of
each benchmark in `bench/results/` (not committed; the plots are there too). Do not edit by
hand: run `make bench` again.

How to read the tables: latencies are milliseconds from each call's *scheduled* start (open
loop: calls are sent at a fixed rate whether or not earlier ones returned). **All calls**
percentiles count a call that failed, or answered after its deadline, at that deadline;
**OK** percentiles are over the calls answered in time. The **floor** is the same work done
the fastest direct way from the client's process at the same rate and with the same
concurrency (the embedding and the SQL and Redis calls, no gRPC and no memsvc code around
them); **service / floor** divides the all-calls percentiles. Client, server, PostgreSQL
and valkey share one machine: on a 2-core machine that others use at the same time the
figures are noisy, so compare runs of one commit with care.
"""


def newest(results_dir: Path, kind: str) -> Path | None:
    files = sorted(results_dir.glob(f"{kind}-*.json"))
    return files[-1] if files else None


def _ms(value: object) -> str:
    if not isinstance(value, int | float) or math.isnan(value):
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _ratio(value: object) -> str:
    return f"x{value:.2f}" if isinstance(value, int | float) else "-"


def section(path: Path) -> list[str]:
    data: dict[str, Any] = json.loads(path.read_text())
    prov, report = data.get("provenance"), data.get("report")
    if prov is None or report is None:
        return [f"## {path.name}", "", "(written before results carried a report: run again)", ""]
    lines = [
        f"## {report['title']}",
        "",
        f"`{prov['command']}` · commit {prov['commit']} · {prov['cpu']} · {prov['date']}"
        + (f" · load average {prov['load_1m']:.2f} when written" if "load_1m" in prov else "")
        + f" · `bench/results/{path.name}`",
        "",
    ]
    if report.get("rows"):
        lines += [
            "| phase | calls | errors | deadline | p50 | p95 | p99 | OK p50 | OK p95 | OK p99 "
            "| max |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for row in report["rows"]:
            cells = [
                row["name"],
                str(row["calls"]),
                str(row["errors"]),
                f"{row['deadline_ms']:g}",
                *(
                    _ms(row[k])
                    for k in (
                        "p50_ms",
                        "p95_ms",
                        "p99_ms",
                        "ok_p50_ms",
                        "ok_p95_ms",
                        "ok_p99_ms",
                        "max_ms",
                    )
                ),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if report.get("ratios"):
        lines += [
            "| service / floor (all calls) | p50 | p95 | p99 |",
            "|---|--:|--:|--:|",
        ]
        for r in report["ratios"]:
            lines.append(
                f"| {r['phase']} / {r['floor']} | {_ratio(r['p50'])} | {_ratio(r['p95'])} "
                f"| {_ratio(r['p99'])} |"
            )
        lines.append("")
    lines += [f"- {note}" for note in report.get("notes", [])]
    if report.get("notes"):
        lines.append("")
    return lines


def render(results_dir: Path) -> str:
    lines = [PREAMBLE]
    for kind in BENCHMARKS:
        path = newest(results_dir, kind)
        if path is None:
            lines += [f"## {kind}", "", "No result yet.", ""]
            continue
        lines += section(path)
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.write_text(render(args.results_dir))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
