"""Reciprocal Rank Fusion: pure, with per-leg weights and deterministic tie-breaks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from memsvc.retrieval.query import Hit


@dataclass(frozen=True)
class Fused:
    """One item after fusion: its RRF score and its 1-based rank in each leg that found it."""

    hit: Hit
    fused_score: float
    ranks: Mapping[str, int] = field(default_factory=dict)

    def rank_in(self, leg: str) -> int:
        """1-based rank in that leg; 0 when the leg did not return the item."""
        return self.ranks.get(leg, 0)


def rrf(
    legs: Mapping[str, Sequence[Hit]],
    *,
    k: int,
    weights: Mapping[str, float] | None = None,
) -> list[Fused]:
    """Fuse ranked lists: score(item) = sum over legs of weight / (k + rank).

    Each list must already be in its leg's best-first order; an item listed twice in one
    leg keeps its best rank. Ties are broken by the best single-leg rank, then by the number
    of legs that found the item, then by the item's key, so equal inputs always give the
    same order.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    scores: dict[tuple[str, str, str], float] = {}
    ranks: dict[tuple[str, str, str], dict[str, int]] = {}
    first_hit: dict[tuple[str, str, str], Hit] = {}
    for leg in sorted(legs):
        weight = 1.0 if weights is None else weights.get(leg, 1.0)
        for position, hit in enumerate(legs[leg], start=1):
            key = hit.key
            leg_ranks = ranks.setdefault(key, {})
            if leg in leg_ranks:
                continue
            leg_ranks[leg] = position
            first_hit.setdefault(key, hit)
            scores[key] = scores.get(key, 0.0) + weight / (k + position)
    fused = [Fused(first_hit[key], scores[key], ranks[key]) for key in scores]
    fused.sort(key=lambda f: (-f.fused_score, min(f.ranks.values()), -len(f.ranks), f.hit.key))
    return fused
