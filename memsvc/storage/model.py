"""Domain types of the memory tier, independent of gRPC and SQL."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol


class Row(Protocol):
    """A database row, read by column name (asyncpg's Record, or a mapping)."""

    def __getitem__(self, key: str, /) -> Any: ...


@dataclass(frozen=True)
class Scope:
    """Whose memory: tenant (from credentials) plus the request's exact user/persona/agent."""

    tenant_id: str
    user_id: str
    persona_id: str = ""
    agent_id: str = ""

    @property
    def key(self) -> tuple[str, str, str, str]:
        """(tenant, user, persona, agent): the $1..$4 of every scoped SQL statement."""
        return (self.tenant_id, self.user_id, self.persona_id, self.agent_id)

    @classmethod
    def from_row(cls, row: Row) -> Scope:
        """The scope a row was written in (its tenant_id, user_id, persona_id, agent_id)."""
        return cls(row["tenant_id"], row["user_id"], row["persona_id"], row["agent_id"])


@dataclass(frozen=True)
class Sharing:
    """Explicit sharing declared on write; never implied by an empty scope field."""

    all_agents: bool = False
    all_personas: bool = False


@dataclass(frozen=True)
class NewMemory:
    """A validated memory about to be written."""

    content: str
    category: str
    role: str
    confidence: float
    pinned: bool = False
    subject: str = ""
    predicate: str = ""
    object: str = ""
    source_message_ids: tuple[str, ...] = ()
    session_id: str = ""
    sharing: Sharing = Sharing()
    valid_from: datetime | None = None
    origin: str = "explicit"
    # Retention: "user-controlled" (never expires), "session" or "ttl". The row expires at
    # ``expires_at`` when given (Correct keeps its version's), else now + ``expires_in_s``.
    retention_policy: str = "user-controlled"
    expires_in_s: float | None = None
    expires_at: datetime | None = None


# A negated statement is stored under the negated predicate ("I don't work at Google" ->
# user | not_works_at | Google): a reader of subject/predicate/object never sees a positive
# triple for it.
NEGATION_PREFIX = "not_"


@dataclass(frozen=True)
class MemoryRecord:
    """One stored memory row (one version of a memory)."""

    scope: Scope
    memory_id: uuid.UUID
    lineage_id: uuid.UUID
    content: str
    category: str
    role: str
    confidence: float
    reinforced_count: int
    pinned: bool
    valid_from: datetime
    recorded_at: datetime
    status: str
    origin: str
    subject: str = ""
    predicate: str = ""
    object: str = ""
    invalid_at: datetime | None = None
    supersedes_id: uuid.UUID | None = None
    superseded_by_id: uuid.UUID | None = None
    source_message_ids: tuple[str, ...] = ()
    session_id: str = ""
    sharing: Sharing = Sharing()
    correction_reason: str = ""
    retention_policy: str = "user-controlled"
    # When it expires (never: None); an expired row is never returned.
    expires_at: datetime | None = None
    # Trust over time (governance.trust) and the core-memory limit (governance.compaction).
    last_reinforced_at: datetime | None = None
    last_referenced_at: datetime | None = None
    demoted_at: datetime | None = None
    # The role it had in the core block before compaction demoted it ("" if never demoted).
    demoted_role: str = ""
    # When UpdateMemory last changed it in place (None: never).
    updated_at: datetime | None = None
    # Filled by the service answering (trust.decorate); None: not computed.
    effective_confidence: float | None = None

    @property
    def negated(self) -> bool:
        """Whether the fact says its triple does not hold (predicate "not_…")."""
        return self.predicate.startswith(NEGATION_PREFIX)


# The fields UpdateMemory may change, in the order an edit lists them.
UPDATE_PATHS = ("pinned", "category", "role", "sharing", "retention_policy", "ttl", "confidence")


@dataclass(frozen=True)
class MemoryUpdate:
    """A validated UpdateMemory: the mask paths (in UPDATE_PATHS order) and their new values
    (a value outside ``paths`` is ignored)."""

    paths: tuple[str, ...]
    pinned: bool = False
    category: str = ""
    role: str = ""
    sharing: Sharing = Sharing()
    retention_policy: str = ""
    # Seconds the memory lives from now: the ttl, or the session backstop for SESSION.
    expires_in_s: float | None = None
    confidence: float = 0.0
    reason: str = ""


@dataclass(frozen=True)
class MemoryEdit:
    """One in-place change of a memory version (UpdateMemory), as stored in memory_edits."""

    edit_id: uuid.UUID
    memory_id: uuid.UUID
    edited_at: datetime
    fields: tuple[str, ...]
    before: dict[str, str]
    after: dict[str, str]
    reason: str = ""


@dataclass(frozen=True)
class ListQuery:
    """A page request over one exact scope."""

    page_size: int
    include_superseded: bool = False
    categories: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    pinned_only: bool = False
    session_id: str = ""
    # Keyset cursor: (recorded_at, memory_id) of the last row of the previous page.
    after: tuple[datetime, uuid.UUID] | None = None


@dataclass(frozen=True)
class Page:
    memories: list[MemoryRecord] = field(default_factory=list)
    next_after: tuple[datetime, uuid.UUID] | None = None


@dataclass(frozen=True)
class CandidateEpisode:
    """An episode as an extractor proposes it and storage writes it."""

    title: str
    summary: str
    excerpt: str
    source_message_ids: tuple[str, ...]


@dataclass(frozen=True)
class ExistingFact:
    """An active stored fact near a candidate, as shown to a decider."""

    memory_id: uuid.UUID
    content: str
    subject: str
    predicate: str
    object: str
    similarity: float
    # When the stored fact became true: a statement said before it never replaces it.
    valid_from: datetime | None = None
    # Its category ("event" facts are never ended by a change: what happened stays true).
    category: str = ""


@dataclass(frozen=True)
class EpisodeRecord:
    """A finished conversation as extraction summarised it."""

    scope: Scope
    episode_id: uuid.UUID
    session_id: str
    title: str
    summary: str
    excerpt: str
    source_message_ids: tuple[str, ...]
    started_at: datetime
    ended_at: datetime
    # When it expires with its source messages (never: None).
    expires_at: datetime | None = None
    # What it was about ("Porto", "Stripe job"), where the read asked for it.
    topics: tuple[str, ...] = ()
