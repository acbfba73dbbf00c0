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
    # Message role (user, assistant...) for messages; the memory role for facts.
    role: str = ""
    confidence: float | None = None
    pinned: bool = False
    # Facts: the inputs of the effective (decayed) confidence, so ranking needs no record.
    category: str = ""
    origin: str = ""
    last_reinforced_at: datetime | None = None
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
