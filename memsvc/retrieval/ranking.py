"""Final ordering after fusion: relevance first, nudged by salience and recency (pure).

The fused RRF score stays the main signal; the boosts multiply it by at most a small
factor, so a clearly better match is never overtaken by a merely recent or confident one.
The query's route plan (route_effects) multiplies it again where the route has an effect.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from memsvc.governance import trust
from memsvc.retrieval.fusion import Fused
from memsvc.retrieval.query import ItemKind
from memsvc.retrieval.route_effects import NEUTRAL, RoutePlan
from memsvc.storage.model import MemoryRecord

SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class RankWeights:
    """How much each salience signal can add to the fused score (as a fraction of it)."""

    confidence: float = 0.2
    role: float = 0.1
    pinned: float = 0.1
    recency: float = 0.1
    half_life_days: float = 30.0
    # Facts carry a confidence; other kinds count as this (neutral).
    neutral_confidence: float = 0.5


@dataclass(frozen=True)
class Ranked:
    fused: Fused
    score: float
    # A fact's confidence decayed to the read's time (None for other kinds).
    effective_confidence: float | None = None
    # Relevance to the query, 0..1 (retrieval.relevance); set by Recall after ordering.
    relevance: float = 0.0

    @functools.cached_property
    def memory(self) -> MemoryRecord | None:
        """The fact's record with its effective confidence filled, built on first use: only
        the items that make the answer pay for a record, not every candidate."""
        record = self.fused.hit.memory
        if record is None or self.effective_confidence is None:
            return record
        return replace(record, effective_confidence=self.effective_confidence)


def decay(age_days: float, half_life_days: float) -> float:
    """0.5 ** (age / half-life): 1 now, 0.5 after one half-life; the future counts as now."""
    return float(0.5 ** (max(0.0, age_days) / half_life_days))


def role_bonus(role: str, role_order: Sequence[str]) -> float:
    """1 for the first (most important) role of the vocabulary, down to 0 for the last."""
    if role not in role_order or len(role_order) < 2:
        return 0.0
    return 1.0 - role_order.index(role) / (len(role_order) - 1)


def final_order(
    fused: Sequence[Fused],
    *,
    now: datetime,
    role_order: Sequence[str],
    plan: RoutePlan = NEUTRAL,
    weights: RankWeights = RankWeights(),
    trust_policy: trust.TrustPolicy | None = None,
    trust_now: datetime | None = None,
) -> list[Ranked]:
    """Score = fused * (1 + boosts) * route factor; best first, ties by fused score then
    item key.

    A fact's confidence boost uses its effective confidence (decayed to ``trust_now``, the
    as_of time of the read, or ``now``) when a trust policy is given.
    """
    ranked: list[Ranked] = []
    for item in fused:
        hit = item.hit
        age_days = (now - hit.occurred_at).total_seconds() / SECONDS_PER_DAY
        boost = weights.recency * decay(age_days, weights.half_life_days)
        effective: float | None = None
        if hit.kind is ItemKind.FACT and hit.confidence is not None:
            confidence = hit.confidence
            if trust_policy is not None:
                confidence = effective = trust.effective_confidence(
                    hit.confidence,
                    category=hit.category,
                    pinned=hit.pinned,
                    origin=hit.origin,
                    recorded_at=hit.occurred_at,
                    last_reinforced_at=hit.last_reinforced_at,
                    now=trust_now or now,
                    policy=trust_policy,
                )
            boost += weights.confidence * confidence
            boost += weights.role * role_bonus(hit.role, role_order)
            boost += weights.pinned * (1.0 if hit.pinned else 0.0)
        else:
            boost += weights.confidence * weights.neutral_confidence
        ranked.append(Ranked(item, item.fused_score * (1.0 + boost) * plan.factor(hit), effective))
    ranked.sort(key=lambda r: (-r.score, -r.fused.fused_score, r.fused.hit.key))
    return ranked
