"""The explicit memory operations, over storage, the embedder and the packet cache."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import NamedTuple

import asyncpg
import numpy as np

from memsvc.cache.invalidation import PacketInvalidator
from memsvc.concurrency.deadline import Budget
from memsvc.embedding import Embedder, EmbeddingError
from memsvc.errors import FailedPrecondition, InvalidArgument, NotFound
from memsvc.governance import trust
from memsvc.governance.compaction import CoreCompactor
from memsvc.governance.guard import PiiGuard
from memsvc.memories import update as updating
from memsvc.retrieval import ReferenceRecorder
from memsvc.storage import changes, edits, erasure, retention, versions
from memsvc.storage import memories as store
from memsvc.storage.locks import lock_user
from memsvc.storage.model import (
    ListQuery,
    MemoryEdit,
    MemoryRecord,
    MemoryUpdate,
    NewMemory,
    Page,
    Scope,
)
from memsvc.storage.normalize import content_hash
from memsvc.storage.pool import acquire

log = logging.getLogger(__name__)

CORRECTED_CONFIDENCE = 1.0


class Remembered(NamedTuple):
    """What Remember did: the row, whether an identical memory was reinforced, the labels
    of the personal data redacted from it, and the memories it displaced from the core
    block (as they are now, in the order displaced)."""

    record: MemoryRecord
    reinforced: bool
    redactions: tuple[str, ...] = ()
    displaced: tuple[MemoryRecord, ...] = ()


class Updated(NamedTuple):
    """What UpdateMemory did: the memory as it is now, the core memories it displaced (in the
    order displaced), and whether anything changed."""

    record: MemoryRecord
    displaced: tuple[MemoryRecord, ...]
    changed: bool


class History(NamedTuple):
    """A memory's supersession chain, oldest first, and the in-place edits of its versions."""

    versions: list[MemoryRecord]
    edits: list[MemoryEdit]


class MemoryService:
    """Remember, Correct, Update, Forget, Get, List and History for one tenant-scoped caller
    at a time."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        embedder: Embedder,
        invalidator: PacketInvalidator,
        *,
        acquire_timeout_s: float,
        embed_timeout_s: float,
        guard: PiiGuard | None = None,
        trust_policy: trust.TrustPolicy | None = None,
        compactor: CoreCompactor | None = None,
        references: ReferenceRecorder | None = None,
    ) -> None:
        self._trust = trust_policy or trust.TrustPolicy()
        # Core-memory limit (None: no limit) and last_referenced_at recording (None: off).
        self._compactor = compactor
        self._references = references
        self._pool = pool
        self._embedder = embedder
        self._invalidator = invalidator
        self._acquire_timeout_s = acquire_timeout_s
        self._embed_timeout_s = embed_timeout_s
        # Each write wakes the user's change watchers where the trigger cannot (Citus).
        self._waker = changes.Waker()
        # The PII screen of every write (default: redact every kind).
        self._guard = guard or PiiGuard.default()

    async def _embed_one(self, text: str, budget: Budget) -> np.ndarray | None:
        """The text's embedding, or None when the embedder failed (the row is marked missing
        and repaired later; the memory is still found by the lexical leg meanwhile)."""
        try:
            vectors = await self._embedder.embed(
                [text], timeout_s=budget.cap(self._embed_timeout_s)
            )
        except EmbeddingError as exc:
            log.warning("embedding failed, storing the memory unembedded: %s", type(exc).__name__)
            return None
        vector: np.ndarray = vectors[0]
        return vector

    async def remember(self, scope: Scope, memory: NewMemory, budget: Budget) -> Remembered:
        """Store a memory, or reinforce the identical active one, after the PII screen."""
        memory, redactions = await self._guard.screen_memory(scope.tenant_id, memory)
        digest = content_hash(memory.content)
        compactor = self._core_compactor(pinned=memory.pinned, role=memory.role)
        async with acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn:
            # An exact duplicate needs no embedding: skip the model call when we can see it.
            duplicate = await store.find_active_duplicate(conn, scope, digest)
            embedding = None if duplicate else await self._embed_one(memory.content, budget)
            async with conn.transaction():
                if compactor is not None:
                    await compactor.lock(conn, scope)
                    # The room left by the human block's text, read under the lock.
                    await compactor.check_fits(conn, scope, memory.content)
                record, reinforced = await store.insert_or_reinforce(
                    conn,
                    scope,
                    memory,
                    content_hash=digest,
                    embedding=embedding,
                    embedding_model=self._embedder.model_id,
                )
                displaced: tuple[MemoryRecord, ...] = ()
                if compactor is not None:
                    compacted = await compactor.enforce(
                        conn,
                        scope,
                        protect={record.memory_id},
                        path="remember",
                        budget_s=budget.remaining(),
                    )
                    displaced = compacted.displaced
                await self._waker.bump(conn, scope.tenant_id, scope.user_id)
        await self._invalidator.drop_user(scope.tenant_id, scope.user_id)
        return Remembered(
            self._decorate(record),
            reinforced,
            redactions,
            tuple(self._decorate(r) for r in displaced),
        )

    async def correct(
        self, scope: Scope, memory_id: uuid.UUID, new_content: str, reason: str, budget: Budget
    ) -> MemoryRecord:
        """Supersede a memory by a corrected version (confidence 1.0); nothing is deleted."""
        new_content, reason = await self._screen_correction(
            scope, memory_id, new_content, reason, budget
        )
        digest = content_hash(new_content)
        embedding = await self._embed_one(new_content, budget)
        async with (
            acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn,
            conn.transaction(),
        ):
            if self._compactor is not None:
                # Before any row lock: the order every core writer takes them in.
                await self._compactor.lock(conn, scope)
            old = await store.get_owned(conn, scope, memory_id, for_update=True)
            if old is None:
                raise NotFound("memory_id: no memory with this id in this scope")
            compactor = self._core_compactor(pinned=old.pinned, role=old.role)
            if compactor is not None:
                await compactor.check_fits(conn, old.scope, new_content, field="new_content")
            if old.invalid_at is not None:
                raise FailedPrecondition(
                    f"memory_id: already superseded by {old.superseded_by_id}; "
                    "correct the current version instead"
                )
            if content_hash(old.content) == digest:
                raise InvalidArgument("new_content: identical to the memory's current content")
            if await store.find_active_duplicate(conn, old.scope, digest) is not None:
                raise FailedPrecondition(
                    "new_content: an active memory with exactly this content already exists "
                    "in this scope; forget this one instead"
                )
            # Close the old version first: the dedup index only covers active rows.
            new_id = uuid.uuid4()
            await store.mark_superseded(conn, old, new_id)
            corrected = NewMemory(
                content=new_content,
                category=old.category,
                role=old.role,
                confidence=CORRECTED_CONFIDENCE,
                pinned=old.pinned,
                source_message_ids=old.source_message_ids,
                session_id=old.session_id,
                sharing=old.sharing,
                origin="correction",
                # A correction keeps the retention of the version it supersedes.
                retention_policy=old.retention_policy,
                expires_at=old.expires_at,
            )
            record, _ = await store.insert_or_reinforce(
                conn,
                old.scope,
                corrected,
                content_hash=digest,
                embedding=embedding,
                embedding_model=self._embedder.model_id,
                memory_id=new_id,
                lineage_id=old.lineage_id,
                supersedes_id=old.memory_id,
                correction_reason=reason,
            )
            if compactor is not None:
                await compactor.enforce(
                    conn,
                    old.scope,
                    protect={record.memory_id},
                    path="correct",
                    budget_s=budget.remaining(),
                )
            await self._waker.bump(conn, scope.tenant_id, scope.user_id)
        await self._invalidator.drop_user(scope.tenant_id, scope.user_id)
        return self._decorate(record)

    async def _screen_correction(
        self, scope: Scope, memory_id: uuid.UUID, new_content: str, reason: str, budget: Budget
    ) -> tuple[str, str]:
        """The PII screen of a correction; whether the memory is core is read only when the
        tenant's policy would keep some personal data."""

        async def corrects_core() -> bool:
            async with acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn:
                old = await store.get_owned(conn, scope, memory_id)
            return old is not None and self._guard.is_core(old.role, old.pinned)

        return await self._guard.screen_correction(
            scope.tenant_id, new_content, reason, corrects_core
        )

    async def forget(
        self,
        scope: Scope,
        budget: Budget,
        *,
        memory_ids: Sequence[uuid.UUID] = (),
        all_in_scope: bool = False,
        erase_user: bool = False,
    ) -> int:
        """Hard-delete memories with every version and everything derived from them (source
        messages, episode and topic text, pending work for a scope or user); returns memory
        rows deleted."""
        async with (
            acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn,
            conn.transaction(),
        ):
            if erase_user:
                deleted = await erasure.erase_user(conn, scope.tenant_id, scope.user_id)
            elif all_in_scope:
                deleted = await erasure.erase_scope(conn, scope)
            else:
                found = await store.owned_lineages(conn, scope, memory_ids)
                missing = [i for i, m in enumerate(memory_ids) if m not in found]
                if missing:
                    raise NotFound(
                        f"memory_ids[{missing[0]}]: no memory with this id in this scope"
                        + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                        + "; nothing was deleted"
                    )
                deleted = await erasure.erase_memories(conn, scope, list(set(found.values())))
            if not erase_user:
                await versions.bump_version(conn, scope.tenant_id, scope.user_id)
            # Erasure too: its one 'erased' change is news to every watcher of the user.
            await self._waker.user(conn, scope.tenant_id, scope.user_id)
        await self._invalidator.drop_user(scope.tenant_id, scope.user_id)
        return deleted

    async def list_page(self, scope: Scope, query: ListQuery, budget: Budget) -> Page:
        async with acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn:
            page = await store.list_page(conn, scope, query)
        if self._references is not None:
            self._references.record(
                scope.tenant_id, scope.user_id, (r.memory_id for r in page.memories)
            )
        return replace(page, memories=[self._decorate(r) for r in page.memories])

    async def history(self, scope: Scope, memory_id: uuid.UUID, budget: Budget) -> History:
        """The supersession chain holding the memory, oldest first, with its edits."""
        async with acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn:
            record = await store.get_visible(conn, scope, memory_id)
            if record is None:
                raise NotFound("memory_id: no memory with this id in this scope")
            versions_ = await store.lineage(conn, scope, record.lineage_id)
            found = await edits.edits_of(
                conn, scope.tenant_id, scope.user_id, [r.memory_id for r in versions_]
            )
        return History([self._decorate(r) for r in versions_], found)

    async def get(self, scope: Scope, memory_id: uuid.UUID, budget: Budget) -> MemoryRecord:
        """One memory, current or superseded, written in the scope or shared into it."""
        async with acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn:
            record = await store.get_visible(conn, scope, memory_id)
        if record is None:
            raise NotFound("memory_id: no memory with this id in this scope")
        if self._references is not None:
            self._references.record(scope.tenant_id, scope.user_id, (record.memory_id,))
        return self._decorate(record)

    async def update(
        self, scope: Scope, memory_id: uuid.UUID, update: MemoryUpdate, budget: Budget
    ) -> Updated:
        """Change pinned, category, role, sharing, retention or confidence of one current
        memory of exactly this scope in place, recording the edit; a memory that joins the
        core block compacts it. Values equal to the stored ones write nothing."""
        reason = await self._screen_reason(scope.tenant_id, update.reason)
        async with (
            acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn,
            conn.transaction(),
        ):
            # Before the row lock: the order every core writer takes them in.
            await lock_user(conn, scope.tenant_id, scope.user_id)
            old = await store.get_owned(conn, scope, memory_id, for_update=True)
            if old is None:
                raise NotFound("memory_id: no memory with this id in this scope")
            if old.invalid_at is not None:
                raise FailedPrecondition(
                    f"memory_id: superseded by {old.superseded_by_id}; "
                    "update the current version instead"
                )
            plan = updating.plan(old, update, datetime.now(UTC))
            if not plan.changed:
                return Updated(self._decorate(old), (), False)
            compactor = self._joins_core(old, plan)
            if compactor is not None:
                field = "pinned" if plan.pinned and not old.pinned else "role"
                await compactor.check_fits(conn, old.scope, old.content, field=field)
                await self._check_core_content(old, field)
            record = await edits.update_in_place(
                conn,
                old,
                pinned=plan.pinned,
                category=plan.category,
                role=plan.role,
                sharing=plan.sharing,
                retention_policy=plan.retention_policy,
                confidence=plan.confidence,
                rearm_expiry=plan.rearm_expiry,
                expires_in_s=plan.expires_in_s,
                confirmed=plan.confirmed,
                into_core=compactor is not None,
            )
            await edits.insert_edit(
                conn, old, fields=plan.fields, before=plan.before, after=plan.after, reason=reason
            )
            if plan.rearm_expiry:
                # Every version of a memory shares its retention (its chain expires as one).
                await retention.align_lineage(conn, scope.tenant_id, scope.user_id, old.lineage_id)
            displaced: tuple[MemoryRecord, ...] = ()
            if compactor is not None:
                compacted = await compactor.enforce(
                    conn,
                    old.scope,
                    protect={old.memory_id},
                    path="update",
                    budget_s=budget.remaining(),
                )
                displaced = compacted.displaced
            await self._waker.bump(conn, scope.tenant_id, scope.user_id)
        await self._invalidator.drop_user(scope.tenant_id, scope.user_id)
        return Updated(self._decorate(record), tuple(self._decorate(r) for r in displaced), True)

    def _joins_core(self, old: MemoryRecord, plan: updating.Plan) -> CoreCompactor | None:
        """The compactor when the update brings the memory into the core block."""
        if self._core_compactor(pinned=old.pinned, role=old.role) is not None:
            return None
        return self._core_compactor(pinned=plan.pinned, role=plan.role)

    async def _screen_reason(self, tenant_id: str, reason: str) -> str:
        """The edit's reason as it may be stored (the tenant's PII policy, as Correct's)."""
        if not reason:
            return reason
        policy = await self._guard.policy(tenant_id)
        screened = self._guard.screen(reason, policy)
        self._guard.record("update", [screened])
        self._guard.refuse("reason", screened)
        return screened.text

    async def _check_core_content(self, old: MemoryRecord, field: str) -> None:
        """Core memory never holds personal data, whatever the policy: a memory whose content
        kept some (a policy that stores it) cannot join the core block as it is."""
        policy = await self._guard.policy(old.scope.tenant_id)
        if self._guard.screen(old.content, policy, core=True).found:
            raise FailedPrecondition(
                f"{field}: this memory's content holds personal data, which core memory never "
                "keeps; Correct it first, or Remember the fact again without it"
            )

    def _decorate(self, record: MemoryRecord) -> MemoryRecord:
        return trust.decorate(record, datetime.now(UTC), self._trust)

    def _core_compactor(self, *, pinned: bool, role: str) -> CoreCompactor | None:
        """The compactor when a memory like this one belongs to the core block."""
        compactor = self._compactor
        if compactor is None or not compactor.limits.in_block(pinned=pinned, role=role):
            return None
        return compactor
