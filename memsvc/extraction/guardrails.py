"""Guardrails for candidate facts: confidence floor, then dedup decisions (pure functions).

The quota, the third guard, needs the database and lives in the pipeline; it runs after
these, so a reinforcement never consumes quota.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memsvc.extraction.base import CandidateFact, Decision, DecisionResult, ExistingFact
from memsvc.extraction.predicates import HISTORICAL_OF, OPPOSITE, SINGLE_VALUED, negation_of


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


# Below this confidence a statement is hedged ("I might move to Oslo"): it never replaces a fact.
CERTAIN = 0.75


def passes_floor(candidate: CandidateFact, thresholds: Thresholds) -> bool:
    return candidate.confidence >= thresholds.confidence_floor


def _same(a: str, b: str) -> bool:
    return a.strip().casefold() == b.strip().casefold()


def _same_thing(a: str, b: str) -> bool:
    """The same value named shorter or longer ("Santa Maria" / "Santa Maria hospital")."""
    x, y = set(a.casefold().split()), set(b.casefold().split())
    return bool(x and y) and (x <= y or y <= x)


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
    however dissimilar the sentences), then similarity. Nothing said before a stored fact
    became true ends it (an older conversation ingested late).
    """
    verdict = _classify(
        candidate,
        exact=exact,
        same_predicate=same_predicate,
        nearest=nearest,
        thresholds=thresholds,
    )
    supersedes = verdict.decision in (Decision.UPDATE, Decision.CONFLICT)
    if supersedes and verdict.target is not None and _said_before(candidate, verdict.target):
        return Verdict(Decision.ADD, reason=f"said before the stored fact ({verdict.reason})")
    return verdict


def _classify(
    candidate: CandidateFact,
    *,
    exact: ExistingFact | None,
    same_predicate: Sequence[ExistingFact],
    nearest: Sequence[ExistingFact],
    thresholds: Thresholds,
) -> Verdict:
    if exact is not None:
        return Verdict(Decision.NOOP, exact, reason="exact")
    predicate = candidate.predicate
    negation = negation_of(predicate)
    if candidate.negated:
        for fact in same_predicate:
            if not _same(fact.subject, candidate.subject):
                continue
            if fact.predicate == predicate and _same_thing(fact.object, candidate.object):
                return Verdict(Decision.CONFLICT, fact, reason="negates")
            if fact.predicate == negation and _same(fact.object, candidate.object):
                return Verdict(Decision.NOOP, fact, reason="same negation")
        return Verdict(Decision.ADD, reason="negation of nothing stored")
    if candidate.planned:
        # A plan never replaces a current value; the same plan said again reinforces it.
        for fact in same_predicate:
            if fact.predicate == predicate and _same(fact.object, candidate.object):
                return Verdict(Decision.NOOP, fact, reason="same plan")
        return Verdict(Decision.ADD, reason="plan")
    if candidate.historical:
        current = HISTORICAL_OF.get(predicate)
        for fact in same_predicate:
            # "I used to live in Delhi" ends a stored "Lives in Delhi"; it never ends another city.
            if (
                current is not None
                and fact.predicate == current
                and _same(fact.subject, candidate.subject)
                and _same(fact.object, candidate.object)
            ):
                return Verdict(Decision.CONFLICT, fact, reason="now historical")
            if fact.predicate == predicate and _same(fact.object, candidate.object):
                return Verdict(Decision.NOOP, fact, reason="same historical fact")
        return Verdict(Decision.ADD, reason="historical")
    for fact in same_predicate:
        # "I eat meat again" ends "The user no longer eats meat".
        if (
            predicate
            and fact.predicate == negation
            and _same(fact.subject, candidate.subject)
            and _same(fact.object, candidate.object)
            and candidate.confidence >= CERTAIN
        ):
            return Verdict(Decision.CONFLICT, fact, reason="affirmed again")
    if predicate in SINGLE_VALUED:
        for fact in same_predicate:
            if fact.predicate != predicate or not _same(fact.subject, candidate.subject):
                continue
            if _same(fact.object, candidate.object):
                return Verdict(Decision.NOOP, fact, reason="same value")
            if may_supersede(candidate, fact):
                return Verdict(Decision.UPDATE, fact, reason="new value of a single-valued fact")
    else:
        for fact in same_predicate:
            if not _same(fact.object, candidate.object) or not _same(
                fact.subject, candidate.subject
            ):
                continue
            if fact.predicate == OPPOSITE.get(predicate):
                # "I don't like coffee anymore" ends "likes coffee".
                return Verdict(Decision.CONFLICT, fact, reason="reversed")
            if fact.predicate == predicate:
                return Verdict(Decision.NOOP, fact, reason="same value")
    best = max(nearest, key=lambda f: f.similarity, default=None)
    if best is None or best.similarity < thresholds.dedup_lower:
        return Verdict(Decision.ADD, reason="new")
    if best.similarity >= thresholds.dedup_upper:
        return Verdict(Decision.NOOP, best, reason="near duplicate")
    return Verdict(Decision.ADD, best, gray=True, reason="gray zone")


def may_supersede(candidate: CandidateFact, target: ExistingFact) -> bool:
    """Whether a candidate may retire a stored fact as its new value (an UPDATE): only a
    current, affirmative, certain statement of the same single-valued predicate about the
    same subject. Whatever a model or a similarity says, nothing else replaces a fact."""
    return (
        candidate.predicate in SINGLE_VALUED
        and candidate.predicate == target.predicate
        and _same(candidate.subject, target.subject)
        and not _same(candidate.object, target.object)
        and not (candidate.negated or candidate.historical or candidate.planned)
        and candidate.confidence >= CERTAIN
        and not _said_before(candidate, target)
    )


def _said_before(candidate: CandidateFact, target: ExistingFact) -> bool:
    """An older conversation ingested late: what was said then is not news about now."""
    said = candidate.said_at or candidate.valid_from
    return said is not None and target.valid_from is not None and said < target.valid_from


def may_conflict(candidate: CandidateFact, target: ExistingFact) -> bool:
    """Whether a candidate may end a stored fact (a CONFLICT): a statement about the same
    subject and predicate; a negation must name the same value."""
    if not candidate.predicate or target.predicate not in (
        candidate.predicate,
        negation_of(candidate.predicate),
    ):
        return False
    if not _same(candidate.subject, target.subject) or candidate.planned:
        return False
    if _said_before(candidate, target):
        return False
    return not candidate.negated or _same_thing(candidate.object, target.object)


def guard_decision(
    candidate: CandidateFact, target: ExistingFact, result: DecisionResult
) -> DecisionResult:
    """A decider's answer held to the never-corrupt rules: an UPDATE or CONFLICT the rules do
    not allow becomes an ADD (keeping both is recoverable; retiring a true fact is not)."""
    if result.decision is Decision.UPDATE and not may_supersede(candidate, target):
        return DecisionResult(Decision.ADD, reason=f"kept both: {result.reason}"[:200])
    if result.decision is Decision.CONFLICT and not may_conflict(candidate, target):
        return DecisionResult(Decision.ADD, reason=f"kept both: {result.reason}"[:200])
    return result


def rules_decision(candidate: CandidateFact, nearest: ExistingFact) -> DecisionResult:
    """The gray zone without a model: keep both unless the structure says otherwise.

    Adding is the safe default: a wrong ADD is a near-duplicate a later pass can merge; a
    wrong UPDATE silently retires a true fact.
    """
    if (
        candidate.predicate
        and nearest.predicate == candidate.predicate
        and _same(nearest.subject, candidate.subject)
    ):
        if _same(nearest.object, candidate.object):
            return DecisionResult(Decision.NOOP, nearest.memory_id, reason="same triple")
        if may_supersede(candidate, nearest):
            return DecisionResult(Decision.UPDATE, nearest.memory_id, reason="single-valued")
    return DecisionResult(Decision.ADD, reason="rules: distinct enough")
