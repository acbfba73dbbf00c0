"""RememberBatch: up to 100 Remembers in one transaction, one embedder call, one INSERT.

Every item gets exactly what Remember would do to it, in request order: the PII screen, the
core-block size check, insert or reinforce (an identical content twice in one batch
reinforces the first), and for a core item (pinned or the core role) the compaction of its
scope's block, whose displaced memories the item's result carries. The work is shared:

- one duplicate probe and one embedder call for the contents that are not stored yet;
- one multi-row upsert per "round" of the non-core items (round k holds the k-th occurrence
  of each distinct content of a scope, so a repeat reinforces the row the first wrote);
- core items (and the plain items sharing a content with one) one by one, as Remember,
  since each compaction must see the block as that item left it;
- the version bump and the cache invalidation once per affected user.

Atomic: any invalid item fails the call (INVALID_ARGUMENT naming it) before anything is
written, and any write error rolls back every item. Otherwise an invalid item is answered in
its result; the valid ones are written together, and if the database refuses a value of
one item, each item is retried in its own savepoint so the others are still written.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
import numpy as np

from memsvc.cache.invalidation import PacketInvalidator
from memsvc.concurrency.deadline import Budget
from memsvc.embedding import Embedder, EmbeddingError
from memsvc.errors import InvalidArgument, MemsvcError
from memsvc.governance import trust
from memsvc.governance.compaction import CoreCompactor
from memsvc.governance.guard import PiiGuard
from memsvc.memories.service import Remembered
from memsvc.observability import metrics
from memsvc.storage import changes, versions
from memsvc.storage import memory_batches as sql
from memsvc.storage.connection import Connection
from memsvc.storage.locks import lock_user
from memsvc.storage.memories import insert_or_reinforce
from memsvc.storage.memory_batches import BatchRow
from memsvc.storage.model import MemoryRecord, NewMemory, Scope
from memsvc.storage.normalize import content_hash
from memsvc.storage.pool import acquire

log = logging.getLogger(__name__)

# Errors of one item's values: with a savepoint per item, the others still go in.
_ITEM_DB_ERRORS = (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError)


@dataclass(frozen=True)
class BatchItem:
    """One validated item (scope and memory), or the reason it is invalid."""

    scope: Scope | None = None
    memory: NewMemory | None = None
    error: InvalidArgument | None = None


@dataclass(frozen=True)
class ItemResult:
    """What happened to one item: what Remember would have answered, or its error."""

    index: int
    done: Remembered | None = None
    error: MemsvcError | None = None


@dataclass
class _Planned:
    index: int
    row: BatchRow
    core: bool
    redactions: tuple[str, ...]


def item_error(index: int, error: InvalidArgument) -> InvalidArgument:
    """An item's error as the batch's INVALID_ARGUMENT, naming the item ("items[3].content")."""
    return InvalidArgument(f"items[{index}].{error}")


class BatchService:
    """RememberBatch over the same parts as MemoryService (see the module docstring)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        embedder: Embedder,
        invalidator: PacketInvalidator,
        *,
        acquire_timeout_s: float,
        embed_timeout_s: float,
        guard: PiiGuard,
        trust_policy: trust.TrustPolicy,
        compactor: CoreCompactor | None = None,
    ) -> None:
        self._pool = pool
        self._embedder = embedder
        self._invalidator = invalidator
        # Each write wakes the user's change watchers where the trigger cannot (Citus).
        self._waker = changes.Waker()
        self._acquire_timeout_s = acquire_timeout_s
        self._embed_timeout_s = embed_timeout_s
        self._guard = guard
        self._trust = trust_policy
        self._compactor = compactor

    async def remember_batch(
        self, items: Sequence[BatchItem], *, atomic: bool, budget: Budget
    ) -> list[ItemResult]:
        """Every item's result, in request order (see the module docstring)."""
        results: dict[int, ItemResult] = {}
        planned: list[_Planned] = []
        for index, item in enumerate(items):
            try:
                planned.append(await self._screen(index, item))
            except InvalidArgument as exc:
                if atomic:
                    raise item_error(index, exc) from None
                results[index] = ItemResult(index, error=item_error(index, exc))
        if planned:
            written = await self._write(planned, atomic=atomic, budget=budget)
            results.update(written)
        for result in results.values():
            outcome = "failed"
            if result.done is not None:
                outcome = "reinforced" if result.done.reinforced else "stored"
            metrics.REMEMBER_BATCH_ITEMS.labels(outcome).inc()
        return [results[i] for i in range(len(items))]

    async def _screen(self, index: int, item: BatchItem) -> _Planned:
        if item.error is not None:
            raise item.error
        assert item.scope is not None and item.memory is not None
        memory, redactions = await self._guard.screen_memory(item.scope.tenant_id, item.memory)
        core = self._compactor is not None and self._compactor.limits.in_block(
            pinned=memory.pinned, role=memory.role
        )
        if core:
            assert self._compactor is not None
            self._compactor.precheck(item.scope, memory.content)
        row = BatchRow(item.scope, memory, content_hash(memory.content), None)
        return _Planned(index, row, core, redactions)

    async def _embed(self, texts: list[str], budget: Budget) -> list[np.ndarray] | None:
        """All the texts in one call; None when the embedder failed (rows stored missing and
        repaired later, as Remember does)."""
        if not texts:
            return []
        try:
            vectors = await self._embedder.embed(texts, timeout_s=budget.cap(self._embed_timeout_s))
        except EmbeddingError as exc:
            log.warning("embedding failed, storing the batch unembedded: %s", type(exc).__name__)
            return None
        return list(vectors)

    async def _write(
        self, planned: list[_Planned], *, atomic: bool, budget: Budget
    ) -> dict[int, ItemResult]:
        tenant_id = planned[0].row.scope.tenant_id
        core_keys = {p.row.key for p in planned if p.core}
        users = sorted({p.row.scope.user_id for p in planned})
        async with acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn:
            # Contents already stored need no embedding: the write reinforces them.
            stored = await sql.find_active_duplicates(
                conn, tenant_id, list({p.row.key for p in planned})
            )
        first: dict[sql.Key, str] = {}
        for p in planned:
            if p.row.key not in stored:
                first.setdefault(p.row.key, p.row.memory.content)
        # One embedder call for the batch, with no connection held meanwhile.
        vectors = await self._embed(list(first.values()), budget)
        by_key = dict(zip(first, vectors, strict=True)) if vectors is not None else {}
        for p in planned:
            vector = by_key.get(p.row.key)
            if vector is not None:
                p.row = BatchRow(p.row.scope, p.row.memory, p.row.content_hash, vector)
        async with (
            acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn,
            conn.transaction(),
        ):
            if core_keys:
                # Before any row lock, in one order: the order every core writer takes.
                for user in sorted({k[0] for k in core_keys}):
                    await lock_user(conn, tenant_id, user)
            bulk = [p for p in planned if p.row.key not in core_keys]
            one_by_one = [p for p in planned if p.row.key in core_keys]
            results = await self._write_bulk(conn, tenant_id, bulk, atomic=atomic)
            for p in one_by_one:
                results[p.index] = await self._write_one(conn, p, atomic=atomic, budget=budget)
            for user in users:
                await versions.bump_version(conn, tenant_id, user)
            await self._waker.users(conn, ((tenant_id, user) for user in users))
        for user in users:
            await self._invalidator.drop_user(tenant_id, user)
        return results

    async def _write_bulk(
        self, conn: Connection, tenant_id: str, bulk: list[_Planned], *, atomic: bool
    ) -> dict[int, ItemResult]:
        """The non-core items in rounds of distinct keys (a repeat reinforces the first)."""
        rounds: list[list[_Planned]] = []
        seen: dict[sql.Key, int] = defaultdict(int)
        for p in bulk:
            n = seen[p.row.key]
            seen[p.row.key] += 1
            if n == len(rounds):
                rounds.append([])
            rounds[n].append(p)
        results: dict[int, ItemResult] = {}
        try:
            async with conn.transaction():  # a savepoint: the fallback below starts clean
                for batch in rounds:
                    written = await sql.insert_or_reinforce_many(
                        conn,
                        tenant_id,
                        [p.row for p in batch],
                        embedding_model=self._embedder.model_id,
                        dimension=self._embedder.dimension,
                    )
                    for p, (record, reinforced) in zip(batch, written, strict=True):
                        results[p.index] = self._result(p, record, reinforced, ())
        except _ITEM_DB_ERRORS:
            if atomic:
                raise
            log.info("RememberBatch: the database refused a value; writing item by item")
            results = {}
            for p in bulk:
                results[p.index] = await self._write_one(conn, p, atomic=False, budget=None)
        return results

    async def _write_one(
        self, conn: Connection, p: _Planned, *, atomic: bool, budget: Budget | None
    ) -> ItemResult:
        """One item as Remember writes it (compaction included for a core item); not atomic:
        in its own savepoint, its database error is its result."""
        try:
            async with conn.transaction():
                record, reinforced = await insert_or_reinforce(
                    conn,
                    p.row.scope,
                    p.row.memory,
                    content_hash=p.row.content_hash,
                    embedding=p.row.embedding,
                    embedding_model=self._embedder.model_id,
                )
                displaced: tuple[MemoryRecord, ...] = ()
                if p.core and self._compactor is not None:
                    compacted = await self._compactor.enforce(
                        conn,
                        p.row.scope,
                        protect={record.memory_id},
                        path="remember",
                        budget_s=budget.remaining() if budget is not None else None,
                    )
                    displaced = compacted.displaced
        except _ITEM_DB_ERRORS as exc:
            if atomic:
                raise
            mapped = item_error(
                p.index,
                InvalidArgument(
                    f"a value was rejected by the database ({type(exc).__name__}); nothing of"
                    " this item was written"
                ),
            )
            return ItemResult(p.index, error=mapped)
        return self._result(p, record, reinforced, displaced)

    def _result(
        self,
        p: _Planned,
        record: MemoryRecord,
        reinforced: bool,
        displaced: tuple[MemoryRecord, ...],
    ) -> ItemResult:
        now = datetime.now(UTC)
        return ItemResult(
            p.index,
            done=Remembered(
                trust.decorate(record, now, self._trust),
                reinforced,
                p.redactions,
                tuple(trust.decorate(r, now, self._trust) for r in displaced),
            ),
        )
