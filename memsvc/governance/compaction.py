"""The core-memory limit: keep each scope's core block within its character budget.

The core facts of a scope are what Prefetch's core section shows from it: current facts
that are pinned or have the core role (the vocabulary's first). They belong to the scope's
human core block (memories.core_blocks), whose limit covers its written text and its facts
together: the facts may take the tenant's human-block limit (MEMSVC_HUMAN_BLOCK_MAX_CHARS, or
the tenant's `--human-block-chars`) minus the characters of the block's written text, both
read in the compacting transaction. This is how extraction promotes fundamental facts into
the human block within its limit; the persona block holds written text only.

A write that would make the block overflow (Remember pinned or core, Correct of a core
memory, extraction writing a core fact) compacts it in the same transaction, under the
user's advisory lock so concurrent writers see each other's rows:

- Demotion (always available): the lowest-priority items become ordinary facts (role
  "context", unpinned, demoted_at set, their former role kept) until the block fits.
  Priority, lowest first: not pinned before pinned, then lower effective confidence, fewer
  reinforcements, least recently referenced (never first), oldest. The rows just written
  go last: the newest statement wins over older ones.
- Summary (when a summarizer, the openai extractor, is configured): the items chosen for
  demotion are folded by the model into one core fact (origin "compaction", source ids
  their union), which takes their place; the originals are demoted as above. It frees a
  quarter of the limit at once so the next write does not compact again. If the model
  fails, times out or answers too long, plain demotion runs instead.

Nothing is deleted: a demoted memory keeps its id, content and history, and Recall and
ListMemories still return it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

import numpy as np

from memsvc.embedding import Embedder, EmbeddingError
from memsvc.errors import InvalidArgument
from memsvc.governance import trust
from memsvc.observability import metrics
from memsvc.storage import core as store
from memsvc.storage import core_blocks as blocks_store
from memsvc.storage.connection import Connection
from memsvc.storage.locks import lock_user
from memsvc.storage.memories import insert_or_reinforce
from memsvc.storage.model import MemoryRecord, NewMemory, Scope, Sharing
from memsvc.storage.normalize import content_hash, normalize_content

log = logging.getLogger(__name__)

COMPACTION = "compaction"
# A summary needs room to say anything; below this, plain demotion.
MIN_SUMMARY_CHARS = 40
# With a summarizer, compaction leaves this share of the limit free for the summary.
SUMMARY_SHARE = 0.25
_NEVER = datetime.min.replace(tzinfo=UTC)


@runtime_checkable
class CoreSummarizer(Protocol):
    """Folds several core facts into one (implemented by the openai extractor)."""

    async def summarize_core(
        self, facts: Sequence[str], *, max_chars: int, timeout_s: float
    ) -> str | None:
        """One fact of at most ``max_chars`` saying what ``facts`` say; None if it cannot."""
        ...


@dataclass(frozen=True)
class CoreLimits:
    """The server's default character limits of the core blocks (0: no limit; a tenant may
    override each) and the core role."""

    human_chars: int
    persona_chars: int
    core_role: str

    def human_limit(self, tenant_limit: int | None) -> int:
        return self.human_chars if tenant_limit is None else tenant_limit

    def persona_limit(self, tenant_limit: int | None) -> int:
        return self.persona_chars if tenant_limit is None else tenant_limit

    def in_block(self, *, pinned: bool, role: str) -> bool:
        return pinned or role == self.core_role


HUMAN_LIMIT_SETTING = "MEMSVC_HUMAN_BLOCK_MAX_CHARS, or the tenant's --human-block-chars"


@dataclass(frozen=True)
class FactRoom:
    """Room of a scope's core facts: the human block's limit (0: none) less its text."""

    limit: int
    text_chars: int

    @property
    def chars(self) -> int | None:
        """Characters the facts may take; None: no limit."""
        return max(self.limit - self.text_chars, 0) if self.limit else None


@dataclass(frozen=True)
class CompactionResult:
    """What one compaction did: the memories it demoted, as they are now, lowest priority
    first (the order they were displaced in), and the summary written, if any."""

    displaced: tuple[MemoryRecord, ...] = ()
    summary_id: uuid.UUID | None = None

    @property
    def demoted(self) -> tuple[uuid.UUID, ...]:
        return tuple(r.memory_id for r in self.displaced)


def block_chars(records: Iterable[MemoryRecord]) -> int:
    return sum(len(r.content) for r in records)


def demotion_order(
    records: Iterable[MemoryRecord],
    *,
    now: datetime,
    policy: trust.TrustPolicy,
    protect: Collection[uuid.UUID] = (),
) -> list[MemoryRecord]:
    """Lowest priority first (see the module docstring); protected rows last."""
    return sorted(
        records,
        key=lambda r: (
            r.memory_id in protect,
            r.pinned,
            round(trust.of_record(r, now, policy), 6),
            r.reinforced_count,
            r.last_referenced_at or _NEVER,
            r.recorded_at,
            r.memory_id,
        ),
    )


def plan(
    records: Sequence[MemoryRecord],
    target_chars: int,
    *,
    now: datetime,
    policy: trust.TrustPolicy,
    protect: Collection[uuid.UUID] = (),
    allow_protected: bool = True,
) -> list[MemoryRecord]:
    """The fewest lowest-priority items whose removal brings the block to ``target_chars``."""
    size = block_chars(records)
    chosen: list[MemoryRecord] = []
    for record in demotion_order(records, now=now, policy=policy, protect=protect):
        if size <= target_chars:
            break
        if record.memory_id in protect and not allow_protected:
            break
        chosen.append(record)
        size -= len(record.content)
    return chosen


class CoreCompactor:
    """Enforces the limits inside a write's transaction (see the module docstring)."""

    def __init__(
        self,
        limits: CoreLimits,
        policy: trust.TrustPolicy,
        *,
        embedder: Embedder | None = None,
        summarizer: CoreSummarizer | None = None,
        summarize_timeout_s: float = 5.0,
        embed_timeout_s: float = 5.0,
    ) -> None:
        self.limits = limits
        self._policy = policy
        self._embedder = embedder
        self._summarizer = summarizer
        self._summarize_timeout_s = summarize_timeout_s
        self._embed_timeout_s = embed_timeout_s

    async def room(self, conn: Connection, scope: Scope) -> FactRoom:
        """The scope's room for core facts, read in the caller's transaction."""
        found = await blocks_store.human_room(conn, scope)
        return FactRoom(self.limits.human_limit(found.tenant_limit), found.text_chars)

    def precheck(self, scope: Scope, content: str, *, field: str = "content") -> None:
        """Pre-check without the database, against the server's default human-block limit
        only: a tenant's own limit and the block's written text are checked by
        ``check_fits`` inside the write's transaction (which every core writer should call)."""
        self._refuse(FactRoom(self.limits.human_chars, 0), content, field)

    async def check_fits(
        self, conn: Connection, scope: Scope, content: str, *, field: str = "content"
    ) -> None:
        """A single core memory larger than the block's room (the tenant's human-block limit
        less its written text) is refused; call inside the write's transaction, under the
        lock, before writing (nothing is written)."""
        self._refuse(await self.room(conn, scope), content, field)

    def _refuse(self, room: FactRoom, content: str, field: str) -> None:
        if room.chars is not None and len(content) > room.chars:
            taken = (
                f", {room.text_chars:,} of them taken by the block's written text"
                if room.text_chars
                else ""
            )
            raise InvalidArgument(
                f"{field}: {len(content):,} characters do not fit the core-memory limit of "
                f"{room.limit:,} characters of this scope's human block{taken} "
                f"({HUMAN_LIMIT_SETTING}); shorten it, or store it unpinned with a role other "
                f"than {self.limits.core_role!r}"
            )

    async def lock(self, conn: Connection, scope: Scope) -> None:
        """Serialise core writes of one user (the lock extraction holds as well)."""
        await lock_user(conn, scope.tenant_id, scope.user_id)

    async def enforce(
        self,
        conn: Connection,
        scope: Scope,
        *,
        protect: Collection[uuid.UUID] = (),
        path: str,
        budget_s: float | None = None,
    ) -> CompactionResult:
        """Bring the scope's core block within its limit; call inside the write's transaction
        after ``lock``. Returns what was demoted, in the order displaced (and the summary
        written, if any): the caller reports it, so no explicit pin is lost silently."""
        limit = (await self.room(conn, scope)).chars
        if limit is None:
            return CompactionResult()
        records = await store.block(conn, scope, self.limits.core_role)
        if block_chars(records) <= limit:
            return CompactionResult()
        now = datetime.now(UTC)
        result: CompactionResult | None = None
        if self._summarizer is not None:
            result = await self._summarize(conn, scope, records, limit, protect, now, budget_s)
        if result is None:
            chosen = plan(records, limit, now=now, policy=self._policy, protect=protect)
            displaced = await store.demote(conn, scope, [r.memory_id for r in chosen])
            result = CompactionResult(tuple(displaced))
            metrics.CORE_COMPACTIONS.labels(
                "demote" if self._summarizer is None else "fallback"
            ).inc()
        metrics.CORE_DEMOTED.labels(path).inc(len(result.demoted))
        return result

    async def _summarize(
        self,
        conn: Connection,
        scope: Scope,
        records: Sequence[MemoryRecord],
        limit: int,
        protect: Collection[uuid.UUID],
        now: datetime,
        budget_s: float | None,
    ) -> CompactionResult | None:
        assert self._summarizer is not None
        reserve = max(int(limit * SUMMARY_SHARE), MIN_SUMMARY_CHARS)
        chosen = plan(
            records,
            max(limit - reserve, 0),
            now=now,
            policy=self._policy,
            protect=protect,
            allow_protected=False,
        )
        kept = [r for r in records if r.memory_id not in {c.memory_id for c in chosen}]
        room = min(limit - block_chars(kept), block_chars(chosen) - 1)
        if not chosen or room < MIN_SUMMARY_CHARS:
            return None
        timeout_s = self._summarize_timeout_s
        if budget_s is not None:
            timeout_s = min(timeout_s, budget_s / 2)
        try:
            async with asyncio.timeout(timeout_s):
                text = await self._summarizer.summarize_core(
                    [r.content for r in chosen], max_chars=room, timeout_s=timeout_s
                )
        except TimeoutError as exc:
            # The model was late: plain demotion (a summarizer answers None when it cannot,
            # unreachable included). Anything else is a bug and fails the write (a Remember
            # answers INTERNAL; an extraction job is aborted).
            log.warning("core summary failed, demoting instead: %s", type(exc).__name__)
            text = None
        text = normalize_content(text or "")
        if not text or len(text) > room:
            return None
        summary = NewMemory(
            content=text,
            category=Counter(r.category for r in chosen).most_common(1)[0][0],
            role=self.limits.core_role,
            confidence=min(min(trust.of_record(r, now, self._policy) for r in chosen), 1.0),
            source_message_ids=tuple(sorted({s for r in chosen for s in r.source_message_ids})),
            sharing=Sharing(
                all_agents=all(r.sharing.all_agents for r in chosen),
                all_personas=all(r.sharing.all_personas for r in chosen),
            ),
            origin=COMPACTION,
        )
        embedding = await self._embed(text)
        record, _ = await insert_or_reinforce(
            conn,
            scope,
            summary,
            content_hash=content_hash(text),
            embedding=embedding,
            embedding_model=self._embedder.model_id if self._embedder is not None else "",
        )
        displaced = await store.demote(
            conn, scope, [r.memory_id for r in chosen], into=record.memory_id
        )
        metrics.CORE_COMPACTIONS.labels("summarize").inc()
        return CompactionResult(tuple(displaced), record.memory_id)

    async def _embed(self, text: str) -> np.ndarray | None:
        if self._embedder is None:
            return None
        try:
            vectors = await self._embedder.embed([text], timeout_s=self._embed_timeout_s)
        except EmbeddingError as exc:
            log.warning("core summary stored unembedded: %s", type(exc).__name__)
            return None
        vector: np.ndarray = vectors[0]
        return vector
