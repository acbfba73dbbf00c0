"""A validated Recall request and the hits the legs return (domain values, no I/O)."""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import numpy.typing as npt

from memsvc.storage.model import MemoryRecord, Scope


class ItemKind(enum.StrEnum):
    FACT = "fact"
    EPISODE = "episode"
    MESSAGE = "message"


class Mode(enum.StrEnum):
    HYBRID = "hybrid"
    DENSE = "dense"
    LEXICAL = "lexical"


DEFAULT_KINDS = (ItemKind.FACT, ItemKind.EPISODE)
# How a fact was written (RecallFilters.origins): Remember, Correct, the Ingest workers, core
# compaction.
ORIGINS = ("explicit", "correction", "extraction", "compaction")


@dataclass(frozen=True)
class RecallFilters:
    """Narrowing applied in SQL on both legs (every set filter must match; within one, any
    value). Fact-only filters (categories, roles, origins) leave other kinds out when set."""

    categories: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()
    session_ids: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None

    @property
    def fact_only(self) -> bool:
        return bool(self.categories or self.roles or self.origins)

    @property
    def shape(self) -> tuple[bool, ...]:
        """Which filters are set: the SQL text depends on it (one cached statement each)."""
        return (
            bool(self.categories),
            bool(self.roles),
            bool(self.origins),
            bool(self.session_ids),
            self.since is not None,
            self.until is not None,
        )

    def kinds(self, requested: tuple[ItemKind, ...]) -> tuple[ItemKind, ...]:
        """The requested kinds these filters can match."""
        if self.fact_only:
            return tuple(k for k in requested if k is ItemKind.FACT)
        return requested


NO_FILTERS = RecallFilters()


@dataclass(frozen=True)
class RecallQuery:
    """What to look for, where, and how many; built by validation only."""

    scope: Scope
    text: str
    vector: npt.NDArray[np.float32] | None
    top_k: int
    kinds: tuple[ItemKind, ...]
    mode: Mode
    as_of: datetime | None = None
    filters: RecallFilters = NO_FILTERS
    # Items whose relevance (0..1) is below this are not returned; 0: no minimum.
    min_relevance: float = 0.0
    # Episodes' own minimum when the caller set none (a summary of a whole conversation is
    # further from any one question than a fact is); None: min_relevance.
    min_relevance_episode: float | None = None
    # The server's default minimum (the caller set none) applies to the answer as a whole:
    # it is empty when none of its best items reaches its kind's minimum, and otherwise
    # returned as ranked (see retrieval.recall.RELEVANCE_GATE_ITEMS).
    relevance_gate: bool = False

    def minimum(self, kind: ItemKind) -> float:
        """The relevance an item of this kind needs to be returned."""
        if kind is ItemKind.EPISODE and self.min_relevance_episode is not None:
            return self.min_relevance_episode
        return self.min_relevance

    @property
    def search_kinds(self) -> tuple[ItemKind, ...]:
        """The kinds the legs search: the requested ones the filters can match."""
        return self.filters.kinds(self.kinds)

    @property
    def wants_dense(self) -> bool:
        return self.mode in (Mode.HYBRID, Mode.DENSE)

    @property
    def wants_lexical(self) -> bool:
        # A vector-only query has nothing for the lexical leg to match: that leg is not
        # "missing", it does not apply.
        return self.mode in (Mode.HYBRID, Mode.LEXICAL) and bool(self.text)


@dataclass(frozen=True)
class Hit:
    """One row a leg found, with the scope columns it was stored under (for the post-filter).

    ``score`` is the leg's own measure: cosine distance for the dense leg (lower is better),
    text-match score for the lexical leg (higher is better). A fact carries the few columns
    ranking needs; its full MemoryRecord is built only when asked for (``memory``), which
    happens for the items that make the answer, not for every candidate.
    """

    kind: ItemKind
    id: str
    text: str
    session_id: str
    occurred_at: datetime
    scope: Scope
    shared_all_agents: bool
    shared_all_personas: bool
    score: float
    sender_id: str = ""
    sender_name: str = ""
    # Message role (user, assistant...) for messages; the memory role for facts.
    role: str = ""
    confidence: float | None = None
    pinned: bool = False
    # Facts: the inputs of the effective (decayed) confidence, so ranking needs no record.
    category: str = ""
    origin: str = ""
    last_reinforced_at: datetime | None = None
    # Lexical leg: share of the query's distinct lexemes the item contains (0..1), and the
    # item's stored embedding (hybrid mode), so relevance is computable for lexical-only hits.
    coverage: float | None = None
    embedding: npt.NDArray[np.float32] | None = field(default=None, repr=False)
    # Builds the fact's MemoryRecord (from the row the leg fetched); None for other kinds.
    record_factory: Callable[[], MemoryRecord] | None = field(default=None, repr=False)

    @functools.cached_property
    def memory(self) -> MemoryRecord | None:
        return None if self.record_factory is None else self.record_factory()

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity across legs: ids of different kinds may collide, and a caller's message
        id is unique only within its session."""
        session = self.session_id if self.kind is ItemKind.MESSAGE else ""
        return (self.kind.value, session, self.id)
