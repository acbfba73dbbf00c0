"""Which current facts a statement of change ends (pure functions).

A change names what it ends (`Ends`, from changes.py or a model); this module finds those
states among the subject's current facts: by the triple's object, or, for a fact stored as
free text, by its words. Events are never ended (what happened stays true), nor negations
(they already say a state does not hold), nor facts of another subject.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memsvc.extraction.base import CandidateFact, Ends, ExistingFact
from memsvc.extraction.predicates import is_negation

_WORD = re.compile(r"[a-zà-ÿ0-9]+", re.IGNORECASE)
_SUFFIXES = ("ing", "es", "ed", "s")


def _stem(word: str) -> str:
    word = word.casefold().removesuffix("'s")
    for suffix in _SUFFIXES:
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def _stems(text: str) -> set[str]:
    return {_stem(w) for w in _WORD.findall(text)}


def names(text: str, term: str) -> bool:
    """Whether `text` names `term` (every word of it, inflection aside)."""
    wanted = _stems(term)
    return bool(wanted) and wanted <= _stems(text)


def _matches(ends: Ends, fact: ExistingFact) -> bool:
    if fact.subject.strip().casefold() != ends.subject.strip().casefold():
        return False
    if fact.category == "event" or is_negation(fact.predicate):
        return False
    if fact.predicate:
        if ends.predicates and fact.predicate not in ends.predicates:
            return False
        if not ends.terms:
            return bool(ends.predicates)
        return any(names(fact.object, t) for t in ends.terms) or (
            not ends.predicates
            and any(names(fact.content, t) for t in ends.terms)
            and any(names(fact.content, c) for c in ends.cues)
        )
    if not ends.terms or not any(names(fact.content, t) for t in ends.terms):
        return False
    return not ends.cues or any(names(fact.content, c) for c in ends.cues)


def ended_by(candidate: CandidateFact, facts: Sequence[ExistingFact]) -> list[ExistingFact]:
    """The current facts the candidate's `ends` name, in the order given. Nothing said before
    a stored fact became true ends it (an older conversation ingested late)."""
    if not candidate.ends or candidate.planned or candidate.historical:
        return []
    said = candidate.said_at or candidate.valid_from
    out: list[ExistingFact] = []
    for fact in facts:
        if said is not None and fact.valid_from is not None and said < fact.valid_from:
            continue
        if any(_matches(e, fact) for e in candidate.ends):
            out.append(fact)
    return out


def reason_of(candidate: CandidateFact) -> str:
    return "; ".join(e.reason for e in candidate.ends if e.reason) or "state ended"
