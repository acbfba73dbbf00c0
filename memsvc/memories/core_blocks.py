"""The core blocks of a scope: the persona block and the human block (seed 002's core memory).

- PERSONA: written text only (description, voice, backstory of the virtual persona), within
  the persona-block limit. Extraction never writes it.
- HUMAN: written text plus the scope's core facts (current memories pinned or of the core
  role, storage.core.block). One limit covers both: the facts may take the limit less the
  text (governance.compaction), which is how extraction promotes fundamental facts into the
  block within its limit. A REPLACE that leaves the facts less room demotes the lowest-
  priority ones to ordinary facts (compaction's order) and reports them as ``displaced``.

Limits are the tenant's (tenant_settings, NULL: the server's MEMSVC_HUMAN_BLOCK_MAX_CHARS /
MEMSVC_PERSONA_BLOCK_MAX_CHARS; 0: none), read in the writing transaction. Every write takes
the user's advisory lock (the one compaction and extraction hold), keeps the previous text in
the block's history, bumps the user's content version and drops the cached Prefetch packets.
Text is screened for personal data like core memory is: never stored, whatever the policy
(redacted, or refused where the tenant rejects the kind).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg

from memsvc.cache.invalidation import PacketInvalidator
from memsvc.concurrency.deadline import Budget
from memsvc.errors import FailedPrecondition, InvalidArgument
from memsvc.governance import trust
from memsvc.governance.compaction import CoreCompactor
from memsvc.governance.guard import PiiGuard
from memsvc.governance.trust import core_order
from memsvc.storage import changes
from memsvc.storage import core as core_store
from memsvc.storage import core_blocks as store
from memsvc.storage.connection import Connection
from memsvc.storage.model import MemoryRecord, Scope
from memsvc.storage.pool import acquire

PERSONA = store.PERSONA
HUMAN = store.HUMAN
REPLACE = store.REPLACE
APPEND = store.APPEND
DEFAULT_AUTHOR = "application"
_LIMIT_SETTING = {
    HUMAN: "MEMSVC_HUMAN_BLOCK_MAX_CHARS, or the tenant's --human-block-chars",
    PERSONA: "MEMSVC_PERSONA_BLOCK_MAX_CHARS, or the tenant's --persona-block-chars",
}


@dataclass(frozen=True)
class BlockUpdate:
    """A validated UpdateCoreBlock: ``expected_revision`` 0 means "whatever is current"."""

    scope: Scope
    block: str
    mode: str
    text: str
    author: str = DEFAULT_AUTHOR
    reason: str = ""
    expected_revision: int = 0


@dataclass(frozen=True)
class CoreBlockView:
    """One block as it is now. ``limit_chars`` 0: no limit."""

    block: str
    scope: Scope
    text: str
    limit_chars: int
    facts: tuple[MemoryRecord, ...]
    revision: int
    updated_at: datetime | None
    author: str

    @property
    def used_chars(self) -> int:
        return len(self.text) + sum(len(r.content) for r in self.facts)


@dataclass(frozen=True)
class BlockUpdated:
    """The block after the write, and the core facts it demoted (HUMAN REPLACE only)."""

    block: CoreBlockView
    displaced: tuple[MemoryRecord, ...] = ()


class CoreBlockService:
    """GetCoreBlocks, UpdateCoreBlock and GetCoreBlockHistory."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        invalidator: PacketInvalidator,
        compactor: CoreCompactor,
        *,
        acquire_timeout_s: float,
        guard: PiiGuard | None = None,
        trust_policy: trust.TrustPolicy | None = None,
    ) -> None:
        self._pool = pool
        self._invalidator = invalidator
        # Each write wakes the user's change watchers where the trigger cannot (Citus).
        self._waker = changes.Waker()
        self._compactor = compactor
        self._acquire_timeout_s = acquire_timeout_s
        self._guard = guard or PiiGuard.default()
        self._trust = trust_policy or trust.TrustPolicy()

    async def get(self, scope: Scope, budget: Budget) -> tuple[CoreBlockView, CoreBlockView]:
        """(persona, human), each present (empty when never written)."""
        async with (
            acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            return (await self._view(conn, scope, PERSONA), await self._view(conn, scope, HUMAN))

    async def history(
        self, scope: Scope, block: str, limit: int, budget: Budget
    ) -> list[store.Revision]:
        async with acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn:
            return await store.history(conn, scope, block, limit)

    async def update(self, command: BlockUpdate, budget: Budget) -> BlockUpdated:
        scope = command.scope
        text, reason = await self._screen(command)
        async with (
            acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn,
            conn.transaction(),
        ):
            await self._compactor.lock(conn, scope)
            current = (await store.current(conn, scope)).get(command.block)
            revision = current.revision if current is not None else 0
            if command.expected_revision and command.expected_revision != revision:
                raise FailedPrecondition(
                    f"expected_revision: the {command.block} block is at revision {revision}"
                    "; read it again (GetCoreBlocks) and retry"
                )
            limit = await self._limit(conn, scope, command.block)
            if command.mode == APPEND:
                old = current.text if current is not None else ""
                text = f"{old}\n{text}" if old else text
                await self._check_append(conn, scope, command.block, text, limit)
            elif limit and len(text) > limit:
                raise InvalidArgument(
                    f"text: {len(text):,} characters do not fit the {command.block} block's "
                    f"limit of {limit:,} characters ({_LIMIT_SETTING[command.block]})"
                )
            await store.write(
                conn,
                scope,
                command.block,
                text=text,
                mode=command.mode,
                author=command.author,
                reason=reason,
            )
            displaced: tuple[MemoryRecord, ...] = ()
            if command.block == HUMAN and command.mode == REPLACE:
                compacted = await self._compactor.enforce(
                    conn, scope, path="core_block", budget_s=budget.remaining()
                )
                displaced = compacted.displaced
            await self._waker.bump(conn, scope.tenant_id, scope.user_id)
            view = await self._view(conn, scope, command.block)
        await self._invalidator.drop_user(scope.tenant_id, scope.user_id)
        return BlockUpdated(view, tuple(self._decorate(r) for r in displaced))

    async def _screen(self, command: BlockUpdate) -> tuple[str, str]:
        """Core memory never holds personal data: redacted whatever the policy, refused
        (INVALID_ARGUMENT, nothing written) where the tenant rejects the kind."""
        guard = self._guard
        policy = await guard.policy(command.scope.tenant_id)
        text = guard.screen(command.text, policy, core=True)
        reason = guard.screen(command.reason, policy, core=True)
        guard.record("core_block", [text, reason])
        guard.refuse("text", text)
        guard.refuse("reason", reason)
        return text.text, reason.text

    async def _limit(self, conn: Connection, scope: Scope, block: str) -> int:
        human, persona = await store.tenant_limits(conn, scope.tenant_id)
        limits = self._compactor.limits
        return limits.human_limit(human) if block == HUMAN else limits.persona_limit(persona)

    async def _check_append(
        self, conn: Connection, scope: Scope, block: str, text: str, limit: int
    ) -> None:
        """APPEND never displaces anything: past the limit (for HUMAN, the text and its core
        facts together) it is refused and writes nothing."""
        if not limit:
            return
        facts = 0
        if block == HUMAN:
            records = await core_store.block(conn, scope, self._compactor.limits.core_role)
            facts = sum(len(r.content) for r in records)
        used = len(text) + facts
        if used > limit:
            of_facts = f" ({facts:,} of them its core facts)" if facts else ""
            raise FailedPrecondition(
                f"text: appending makes the {block} block {used:,} characters{of_facts}, past "
                f"its limit of {limit:,} ({_LIMIT_SETTING[block]}); nothing was written: "
                "shorten the block with REPLACE first"
            )

    async def _view(self, conn: Connection, scope: Scope, block: str) -> CoreBlockView:
        current = (await store.current(conn, scope)).get(block)
        facts: tuple[MemoryRecord, ...] = ()
        if block == HUMAN:
            records = await core_store.block(conn, scope, self._compactor.limits.core_role)
            facts = tuple(core_order(self._decorate(r) for r in records))
        return CoreBlockView(
            block=block,
            scope=scope,
            text=current.text if current is not None else "",
            limit_chars=await self._limit(conn, scope, block),
            facts=facts,
            revision=current.revision if current is not None else 0,
            updated_at=current.recorded_at if current is not None else None,
            author=current.author if current is not None else "",
        )

    def _decorate(self, record: MemoryRecord) -> MemoryRecord:
        return trust.decorate(record, datetime.now(UTC), self._trust)
