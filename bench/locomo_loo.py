"""Leave-one-conversation-out check of the read path's fitted constants (LoCoMo dev split).

    python -m bench.locomo_loo [--data ../shared/data/locomo] [--deadline-ms 800]

The fusion and routing constants (MEMSVC_RRF_K, MEMSVC_RRF_DENSE_WEIGHT, the route's date and
"when" weights) were chosen on the development split. To see how much of their gain is the
split's, every question is asked once per leg through the gRPC API (DENSE and LEXICAL modes,
routing off, no minimum relevance, top 100), and the legs' lists are then fused and ordered
here with memsvc's own code (retrieval.fusion.rrf, retrieval.route_effects) for every
combination of a grid of constants. For each development conversation in turn, the
combination best on the other four is chosen and scored on it: the spread of those scores
(and of the production defaults per conversation) is what to expect of a conversation the
constants never saw. Ingests exactly as bench/locomo_eval.py does (sender_name on).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from bench.harness import Target, embedded_stack, memsvc_server, result_paths
from bench.locomo_eval import CATEGORIES, DEFAULT_DATA, ingest_all, recall_at, wait_done
from bench.provenance import provenance
from memsvc.config import Settings
from memsvc.retrieval.fusion import rrf
from memsvc.retrieval.query import Hit, ItemKind
from memsvc.retrieval.route_effects import RouteWeights, plan
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc

K = 10
GRID = {
    "rrf_k": (5, 10, 20, 60),
    "dense_weight": (0.3, 0.5, 0.7, 1.0),
    "when_weight": (0.0, 0.25, 0.5, 1.0),
    "date_weight": (0.0, 0.5, 1.0),
}


@dataclass(frozen=True)
class Question:
    conversation: str
    text: str
    evidence: tuple[str, ...]
    category: str
    legs: dict[str, list[Hit]]


def _hit(item: pb.RecallItem, user: str) -> Hit:
    return Hit(
        kind=ItemKind.MESSAGE,
        id=item.id,
        text=item.text,
        session_id=item.session_id,
        occurred_at=item.occurred_at.ToDatetime(tzinfo=UTC),
        scope=Scope("", user, "", ""),
        shared_all_agents=False,
        shared_all_personas=False,
        score=item.score,
    )


async def collect(
    target: Target, samples: list[dict[str, Any]], deadline_s: float
) -> list[Question]:
    metadata = (("x-api-key", target.api_key),)
    questions: list[Question] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        ids = await ingest_all(stub, metadata, samples)
        await wait_done(stub, metadata, ids, timeout_s=1800)
        for sample in samples:
            user = sample["sample_id"]
            for qa in sample["qa"]:
                legs: dict[str, list[Hit]] = {}
                for leg, mode in (
                    ("dense", pb.RECALL_MODE_DENSE),
                    ("lexical", pb.RECALL_MODE_LEXICAL),
                ):
                    reply = await stub.Recall(
                        pb.RecallRequest(
                            scope=pb.Scope(user_id=user),
                            query=str(qa["question"]),
                            top_k=100,
                            types=[pb.ITEM_TYPE_MESSAGE],
                            mode=mode,
                            filters=pb.RecallFilters(min_score=0.0),
                        ),
                        metadata=metadata,
                        timeout=deadline_s,
                    )
                    legs[leg] = [_hit(item, user) for item in reply.items]
                questions.append(
                    Question(
                        user,
                        str(qa["question"]),
                        tuple(qa.get("evidence") or ()),
                        CATEGORIES.get(int(qa["category"]), str(qa["category"])),
                        legs,
                    )
                )
    return questions


def ordered(question: Question, combo: dict[str, float]) -> list[str]:
    """The ids as Recall orders them with these constants (fusion, then the route factor;
    the salience nudges are the same for every message of a conversation)."""
    fused = rrf(
        question.legs,
        k=int(combo["rrf_k"]),
        weights={"dense": combo["dense_weight"], "lexical": 1.0},
    )
    route = plan(
        question.text,
        weights=RouteWeights(date_weight=combo["date_weight"], when_weight=combo["when_weight"]),
    )
    scored = sorted(
        fused, key=lambda f: (-f.fused_score * route.factor(f.hit), -f.fused_score, f.hit.key)
    )
    return [f.hit.id for f in scored]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--deadline-ms", type=float, default=800)
    args = parser.parse_args()
    samples = json.loads((args.data / "locomo-dev.json").read_text())
    with embedded_stack() as stack, memsvc_server(stack, {"MEMSVC_ROUTING": "false"}) as target:
        questions = asyncio.run(collect(target, samples, args.deadline_ms / 1000))
    conversations = sorted({q.conversation for q in questions})
    combos = [dict(zip(GRID, values, strict=True)) for values in itertools.product(*GRID.values())]
    # R@10 summed per conversation, for every combination.
    sums = np.zeros((len(combos), len(conversations)))
    counts = np.zeros(len(conversations))
    for q in questions:
        c = conversations.index(q.conversation)
        counts[c] += 1
        for i, combo in enumerate(combos):
            sums[i, c] += recall_at(ordered(q, combo), list(q.evidence), K)
    defaults = Settings()
    production = next(
        i
        for i, combo in enumerate(combos)
        if combo["rrf_k"] == defaults.rrf_k
        and combo["dense_weight"] == defaults.rrf_dense_weight
        and (combo["when_weight"], combo["date_weight"])
        == (RouteWeights().when_weight, RouteWeights().date_weight)
    )
    overall = 100 * sums.sum(axis=1) / counts.sum()
    best = int(np.argmax(overall))
    print(f"R@{K} over {int(counts.sum())} questions, {len(combos)} combinations of {list(GRID)}")
    print(f"production defaults {combos[production]}: {overall[production]:.1f}")
    print(f"best in the split {combos[best]}: {overall[best]:.1f}")
    left_out: list[dict[str, Any]] = []
    for c, name in enumerate(conversations):
        others = [d for d in range(len(conversations)) if d != c]
        train = 100 * sums[:, others].sum(axis=1) / counts[others].sum()
        chosen = int(np.argmax(train))
        score = 100 * sums[chosen, c] / counts[c]
        default_score = 100 * sums[production, c] / counts[c]
        left_out.append(
            {"conversation": name, "chosen": combos[chosen], "r10": round(score, 1),
             "production_r10": round(default_score, 1), "questions": int(counts[c])}
        )  # fmt: skip
        print(
            f"left out {name}: chosen on the others {combos[chosen]}, R@{K} on it {score:.1f}"
            f" (production defaults {default_score:.1f})"
        )
    loo_mean = sum(r["r10"] * r["questions"] for r in left_out) / counts.sum()
    spread = [r["r10"] for r in left_out]
    print(
        f"left-one-out mean {loo_mean:.1f} (spread {min(spread):.1f}..{max(spread):.1f});"
        f" in-split best {overall[best]:.1f}; production {overall[production]:.1f}"
    )
    out, _ = result_paths("locomo-loo")
    out.write_text(
        json.dumps(
            {
                "provenance": provenance(),
                "grid": GRID,
                "production": combos[production],
                "production_r10": round(float(overall[production]), 1),
                "best": combos[best],
                "best_r10": round(float(overall[best]), 1),
                "left_out": left_out,
                "loo_mean_r10": round(float(loo_mean), 1),
                "per_combination": [
                    {**combo, "r10": round(float(overall[i]), 2)} for i, combo in enumerate(combos)
                ],
            },
            indent=2,
        )
    )
    print(f"written {out}")


if __name__ == "__main__":
    main()
