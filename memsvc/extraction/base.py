"""The Extractor protocol and the values extractors exchange with the pipeline."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

# Stored shapes that extractors exchange with the pipeline, re-exported for implementations.
from memsvc.storage.model import CandidateEpisode as CandidateEpisode
from memsvc.storage.model import ExistingFact as ExistingFact


class ExtractionError(Exception):
    """An extractor could not produce a valid result; the job is retried, nothing is written."""


@dataclass(frozen=True)
class Turn:
    """One kept message of the speaker being processed."""

    message_id: str
    text: str
    sent_at: datetime


@dataclass(frozen=True)
class ExtractionInput:
    """Everything an extractor may look at for one speaker of one ingest job."""

    speaker_id: str
    session_id: str
    turns: tuple[Turn, ...]
    categories: tuple[str, ...]
    roles: tuple[str, ...]
    max_facts: int
    # The speaker's name as the caller sent it (Message.sender_name), "" when none was.
    speaker_name: str = ""


@dataclass(frozen=True)
class Ends:
    """A state a statement of change ends among the current facts of `subject` ("I sold my
    car" ends "The user drives a Toyota"; "Luna passed away" ends the user's cat Luna).

    A stored fact is ended when its object names one of `terms`, or, as free text, its
    content names one of `terms` and one of `cues` (the verb of the state: "drive", "play").
    `predicates`, when given, limits it to facts of those predicates. Events are never ended:
    what happened stays true."""

    subject: str
    terms: tuple[str, ...]
    cues: tuple[str, ...] = ()
    predicates: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class CandidateFact:
    """A fact an extractor proposes; the pipeline's guardrails decide whether it is stored."""

    content: str
    category: str
    role: str
    confidence: float
    source_message_ids: tuple[str, ...]
    subject: str = "user"
    predicate: str = ""
    object: str = ""
    # "I used to live in Delhi": true of the past, never overwrites a current fact.
    historical: bool = False
    # "I no longer eat meat": contradicts the positive form of the same predicate/object.
    negated: bool = False
    # "I'm moving to Tokyo next year": a plan or a future, never the current value of a
    # single-valued predicate (its predicate is "plans", its object what is planned).
    planned: bool = False
    # When the statement became true: the message's `sent_at`, or the absolute date the
    # statement names ("yesterday" in a message of 8 May 2023 -> 7 May 2023).
    valid_from: datetime | None = None
    # When it was said (the message's `sent_at`): "I moved here three years ago", said today,
    # is news about now even though it became true before a stored fact did.
    said_at: datetime | None = None
    # The states this statement ends beyond its own predicate (changes.py).
    ends: tuple[Ends, ...] = ()


@dataclass(frozen=True)
class Extraction:
    episode: CandidateEpisode | None
    facts: tuple[CandidateFact, ...] = ()
    topics: tuple[str, ...] = ()


class Decision(enum.StrEnum):
    """What to do with a candidate that resembles stored facts (the gray zone of dedup)."""

    ADD = "add"
    UPDATE = "update"
    NOOP = "noop"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class DecisionResult:
    decision: Decision
    # The existing fact an UPDATE / NOOP / CONFLICT refers to.
    target_id: uuid.UUID | None = None
    reason: str = ""
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Reading:
    """What the rules read in some turns: their facts, and what was said without being
    asserted (a wish, a condition, someone else's words, sarcasm, a joke taken back) as
    (message id, text)."""

    facts: tuple[CandidateFact, ...] = ()
    unasserted: tuple[tuple[str, str], ...] = ()


class FactReader(Protocol):
    """Reads some turns by rules (RulesExtractor.read): what a model's facts are held to
    (grounding.py)."""

    async def read(self, data: ExtractionInput) -> Reading: ...


@runtime_checkable
class Extractor(Protocol):
    """Pluggable extraction. Implementations: rules (default, offline), openai (chat model)."""

    @property
    def name(self) -> str: ...

    async def extract(self, data: ExtractionInput) -> Extraction:
        """Propose an episode, facts and topics; raise ExtractionError on an unusable answer."""
        ...

    async def decide(
        self, candidate: CandidateFact, existing: Sequence[ExistingFact]
    ) -> DecisionResult | None:
        """Decide a gray-zone candidate; None means "no model here, use the rules"."""
        ...

    async def aclose(self) -> None: ...
