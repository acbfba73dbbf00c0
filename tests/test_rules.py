"""The rules extractor, the quality gate and the dedup guardrails, as pure functions."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import pytest

from memsvc.extraction.base import CandidateFact, Decision, ExistingFact, ExtractionInput, Turn
from memsvc.extraction.gate import is_phatic
from memsvc.extraction.guardrails import Thresholds, classify, rules_decision
from memsvc.extraction.rules import RulesExtractor, clauses, facts_from_clause


def facts(text: str) -> list[tuple[str, str, bool, bool]]:
    return [
        (f.content, f.predicate, f.historical, f.negated)
        for c in clauses(text)
        for f in facts_from_clause(c)
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Remember that I'm a vegetarian and my daughter is named Maya.",
            [
                ("Is vegetarian", "diet", False, False),
                ("Daughter is named Maya", "family", False, False),
            ],
        ),
        ("I don't take sugar.", [("Does not take sugar", "avoids", False, False)]),
        ("I used to live in Delhi.", [("Used to live in Delhi", "lived_in", True, False)]),
        ("I lived in Delhi in 2022.", [("Used to live in Delhi in 2022", "lived_in", True, False)]),
        ("I live in Singapore now.", [("Lives in Singapore", "lives_in", False, False)]),
        ("We moved to Lisbon last year", [("Lives in Lisbon", "lives_in", False, False)]),
        ("I no longer live in Paris", [("No longer lives in Paris", "lives_in", False, True)]),
        ("I'm not vegetarian anymore", [("Is no longer vegetarian", "diet", False, True)]),
        ("my name is priya", [("Name is Priya", "name", False, False)]),
        ("I'm allergic to peanuts", [("Is allergic to peanuts", "allergy", False, False)]),
        ("I hate cilantro", [("Dislikes cilantro", "dislikes", False, False)]),
        ("I work at Siemens", [("Works at Siemens", "works_at", False, False)]),
        ("I'm a software engineer", [("Works as a software engineer", "occupation", False, False)]),
        ("My dog's name is Rex", [("Dog is named Rex", "pet", False, False)]),
        ("I'm planning to run a marathon", [("Plans to run a marathon", "plans", False, False)]),
        ("My goal is to learn Spanish", [("Goal: learn Spanish", "goal", False, False)]),
        (
            "Please remember that the gate code is on the fridge",
            [("The gate code is on the fridge", "note", False, False)],
        ),
    ],
)
def test_first_person_statements(text: str, expected: list[tuple[str, str, bool, bool]]) -> None:
    assert facts(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "I want to know my balance",  # a request, not a goal
        "My son is tall",  # not a name
        "The weather is nice",  # not about the speaker
        "Do you live in Paris?",
        "My daughter is named after her grandmother",
    ],
)
def test_non_facts_yield_nothing(text: str) -> None:
    assert facts(text) == []


@pytest.mark.parametrize(
    ("text", "phatic"),
    [
        ("can you hear me?", True),
        ("Hello? Can you hear me now?", True),
        ("Thanks, bye!", True),
        ("ok", True),
        ("Good morning everyone!", True),
        ("...", True),
        ("Thanks, I live in Paris", False),
        ("I am a vegetarian", False),
        ("bye " * 100, False),  # long: not checked, and never slow
    ],
)
def test_quality_gate(text: str, phatic: bool) -> None:
    started = time.perf_counter()
    assert is_phatic(text) is phatic
    assert time.perf_counter() - started < 0.5  # no catastrophic backtracking


async def test_extract_keeps_sources_and_caps_facts() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    turns = tuple(Turn(f"m{i}", f"I love sport number {i}.", at) for i in range(5))
    out = await RulesExtractor().extract(
        ExtractionInput("alice", "s", turns, ("preference", "context"), ("context",), max_facts=3)
    )
    assert [f.source_message_ids for f in out.facts] == [("m0",), ("m1",), ("m2",)]
    assert out.episode is not None and out.episode.source_message_ids == tuple(
        f"m{i}" for i in range(5)
    )
    assert out.topics == ("interests",)


def candidate(content: str, predicate: str, obj: str, **kw: object) -> CandidateFact:
    return CandidateFact(
        content=content,
        category="profile",
        role="core",
        confidence=0.9,
        source_message_ids=("m",),
        predicate=predicate,
        object=obj,
        **kw,
    )  # type: ignore[arg-type]


def existing(content: str, predicate: str, obj: str, similarity: float = 0.5) -> ExistingFact:
    return ExistingFact(uuid.uuid4(), content, "user", predicate, obj, similarity)


T = Thresholds()


def test_single_valued_fact_updates_however_dissimilar() -> None:
    old = existing("Lives in Delhi", "lives_in", "Delhi")
    v = classify(
        candidate("Lives in Singapore", "lives_in", "Singapore"),
        exact=None,
        same_predicate=[old],
        nearest=[],
        thresholds=T,
    )
    assert (v.decision, v.target) == (Decision.UPDATE, old)


def test_historical_never_overwrites_a_different_current_value() -> None:
    current = existing("Lives in Singapore", "lives_in", "Singapore")
    v = classify(
        candidate("Used to live in Delhi", "lived_in", "Delhi", historical=True),
        exact=None,
        same_predicate=[current],
        nearest=[current],
        thresholds=T,
    )
    assert v.decision is Decision.ADD


def test_historical_ends_the_same_current_value() -> None:
    current = existing("Lives in Delhi", "lives_in", "Delhi")
    v = classify(
        candidate("Used to live in Delhi", "lived_in", "Delhi", historical=True),
        exact=None,
        same_predicate=[current],
        nearest=[],
        thresholds=T,
    )
    assert (v.decision, v.target) == (Decision.CONFLICT, current)


def test_negation_conflicts_with_the_positive() -> None:
    pos = existing("Is vegetarian", "diet", "vegetarian")
    v = classify(
        candidate("Is no longer vegetarian", "diet", "vegetarian", negated=True),
        exact=None,
        same_predicate=[pos],
        nearest=[],
        thresholds=T,
    )
    assert (v.decision, v.target) == (Decision.CONFLICT, pos)


@pytest.mark.parametrize(
    ("similarity", "decision", "gray"),
    [
        (0.95, Decision.NOOP, False),
        (0.80, Decision.ADD, True),
        (0.60, Decision.ADD, False),
    ],
)
def test_similarity_thresholds(similarity: float, decision: Decision, gray: bool) -> None:
    near = existing("Enjoys long walks", "likes", "long walks", similarity)
    v = classify(
        candidate("Loves walking", "likes", "walking"),
        exact=None,
        same_predicate=[],
        nearest=[near],
        thresholds=T,
    )
    assert (v.decision, v.gray) == (decision, gray)


def test_exact_match_wins_first() -> None:
    same = existing("Is vegetarian", "diet", "vegetarian", 1.0)
    v = classify(
        candidate("Is vegetarian", "diet", "vegetarian"),
        exact=same,
        same_predicate=[same],
        nearest=[same],
        thresholds=T,
    )
    assert (v.decision, v.target) == (Decision.NOOP, same)


def test_rules_decision_in_the_gray_zone() -> None:
    near = existing("Favorite color is blue", "favorite_color", "blue", 0.8)
    assert (
        rules_decision(candidate("Favorite color is navy", "favorite_color", "navy"), near).decision
        is Decision.ADD
    )
    assert (
        rules_decision(
            candidate("Favorite color is blue!", "favorite_color", "blue"), near
        ).decision
        is Decision.NOOP
    )
    city = existing("Lives in New York", "lives_in", "New York", 0.8)
    assert (
        rules_decision(candidate("Lives in NYC", "lives_in", "NYC"), city).decision
        is Decision.UPDATE
    )
