"""Guardrails for candidate facts: confidence floor, then dedup decisions (pure functions).

The quota, the third guard, needs the database and lives in the pipeline; it runs after
these, so a reinforcement never consumes quota.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memsvc.extraction.base import CandidateFact, Decision, DecisionResult, ExistingFact
from memsvc.extraction.rules import HISTORICAL_OF, SINGLE_VALUED


@dataclass(frozen=True)
class Thresholds:
    """Calibrated on MiniLM cosine similarities of paraphrases vs. distinct facts."""

    confidence_floor: float = 0.5
    # Cosine at or above: the same fact said again (reinforce).
    dedup_upper: float = 0.92
    # Cosine below: a different fact (add). Between: the gray zone, decided by the model or rules.
    dedup_lower: float = 0.75


@dataclass(frozen=True)
class Verdict:
    """The dedup outcome for one candidate; `gray` means a decider should settle it."""

    decision: Decision
    target: ExistingFact | None = None
    gray: bool = False
    reason: str = ""


def passes_floor(candidate: CandidateFact, thresholds: Thresholds) -> bool:
    return candidate.confidence >= thresholds.confidence_floor


def _same(a: str, b: str) -> bool:
    return a.strip().casefold() == b.strip().casefold()


def classify(
    candidate: CandidateFact,
    *,
    exact: ExistingFact | None,
    same_predicate: Sequence[ExistingFact],
    nearest: Sequence[ExistingFact],
    thresholds: Thresholds,
) -> Verdict:
    """Decide ADD / NOOP (reinforce) / UPDATE / CONFLICT, or flag the gray zone.

    Structured knowledge goes first (a new city for a single-valued "lives_in" is an update
    however dissimilar the sentences), then similarity.
    """
    if exact is not None:
        return Verdict(Decision.NOOP, exact, reason="exact")
    predicate = candidate.predicate
    if candidate.negated:
        for fact in same_predicate:
            if _same(fact.object, candidate.object):
                return Verdict(Decision.CONFLICT, fact, reason="negates")
        return Verdict(Decision.ADD, reason="negation of nothing stored")
    if candidate.historical:
        current = HISTORICAL_OF.get(predicate)
        for fact in same_predicate:
            # "I used to live in Delhi" ends a stored "Lives in Delhi"; it never ends another city.
            if (
                current is not None
                and fact.predicate == current
                and _same(fact.object, candidate.object)
            ):
                return Verdict(Decision.CONFLICT, fact, reason="now historical")
            if fact.predicate == predicate and _same(fact.object, candidate.object):
                return Verdict(Decision.NOOP, fact, reason="same historical fact")
        return Verdict(Decision.ADD, reason="historical")
    if predicate in SINGLE_VALUED:
        for fact in same_predicate:
            if fact.predicate != predicate:
                continue
            if _same(fact.object, candidate.object):
                return Verdict(Decision.NOOP, fact, reason="same value")
            return Verdict(Decision.UPDATE, fact, reason="new value of a single-valued fact")
    else:
        for fact in same_predicate:
            if fact.predicate == predicate and _same(fact.object, candidate.object):
                if _opposite(candidate, fact):
                    return Verdict(Decision.CONFLICT, fact, reason="reversed")
                return Verdict(Decision.NOOP, fact, reason="same value")
    best = max(nearest, key=lambda f: f.similarity, default=None)
    if best is None or best.similarity < thresholds.dedup_lower:
        return Verdict(Decision.ADD, reason="new")
    if best.similarity >= thresholds.dedup_upper:
        return Verdict(Decision.NOOP, best, reason="near duplicate")
    return Verdict(Decision.ADD, best, gray=True, reason="gray zone")


def _opposite(candidate: CandidateFact, fact: ExistingFact) -> bool:
    return {candidate.predicate, fact.predicate} == {"likes", "dislikes"}


def rules_decision(candidate: CandidateFact, nearest: ExistingFact) -> DecisionResult:
    """The gray zone without a model: keep both unless the structure says otherwise.

    Adding is the safe default: a wrong ADD is a near-duplicate a later pass can merge; a
    wrong UPDATE silently retires a true fact.
    """
    if candidate.predicate and nearest.predicate == candidate.predicate:
        if _same(nearest.object, candidate.object):
            return DecisionResult(Decision.NOOP, nearest.memory_id, reason="same triple")
        if candidate.predicate in SINGLE_VALUED and not candidate.historical:
            return DecisionResult(Decision.UPDATE, nearest.memory_id, reason="single-valued")
    return DecisionResult(Decision.ADD, reason="rules: distinct enough")
