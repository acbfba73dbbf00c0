"""Domain values of Prefetch: the request, the rows the walk reads, and the built packet."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from memsvc.storage.model import EpisodeRecord, MemoryRecord, Scope

PERSONA = "persona"
CORE = "core"
RELEVANT = "relevant"
EPISODES = "episodes"
# The core blocks' text (their counts are characters, not items).
PERSONA_BLOCK = "persona_block"
HUMAN_BLOCK = "human_block"


@dataclass(frozen=True)
class PrefetchQuery:
    """A validated Prefetch request. ``tokens`` 0 means no token limit."""

    scope: Scope
    session_id: str
    hint: str
    chars: int
    tokens: int = 0

    def shape(self) -> str:
        """Everything but the user that changes the packet body (the cache key's shape).

        The session id is not part of it: it only appears in the header line, which is
        added when answering, so a packet built for one session serves the next ones too.
        """
        parts = (self.scope.persona_id, self.scope.agent_id, self.hint, self.chars, self.tokens)
        return "\x1f".join(str(p) for p in parts)


@dataclass(frozen=True)
class TopicRow:
    """A topic of the scope with its match against the hint (None: no match / no hint)."""

    topic_id: uuid.UUID
    name: str
    weight: float
    last_episode_at: datetime | None
    distance: float | None = None
    lexical: float | None = None


@dataclass(frozen=True)
class EdgeRow:
    """An episode reached from a ranked topic (topic_id None: included as a recent one)."""

    episode: EpisodeRecord
    topic_id: uuid.UUID | None
    weight: float


@dataclass(frozen=True)
class FactCandidate:
    """A fact with the two keys it is ordered by after its role: weight and score."""

    record: MemoryRecord
    weight: float
    score: float


@dataclass(frozen=True)
class SectionCount:
    shown: int
    total: int


@dataclass(frozen=True)
class Packet:
    """A built packet. ``body`` is the text without the session header; empty when there is
    nothing to say."""

    body: str
    facts: tuple[MemoryRecord, ...]
    episodes: tuple[EpisodeRecord, ...]
    counts: dict[str, SectionCount]
    withheld: tuple[str, ...]
    version: int
    degraded: bool = False
    built_at: datetime | None = None
