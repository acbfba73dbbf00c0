"""Ingest: store the turn's messages and one outbox row in one transaction, then return.

The tenant's PII policy is applied before anything is written: a message's text (and a goal)
is stored with personal data replaced by its placeholder ("[redacted card number]"), so no
verbatim copy reaches the messages table, its lexical and context indexes, the embedding
input or the outbox payload. A message cannot be refused without breaking the conversation
record, so a kind the tenant rejects is redacted here too; extraction then drops every fact
that holds its placeholder. Under "store" the text is kept as sent.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace

import asyncpg

from memsvc.concurrency.deadline import Budget
from memsvc.concurrency.fair_queue import FairTurns
from memsvc.errors import AlreadyExists, DeadlineExceeded, NotFound, Unavailable
from memsvc.governance.guard import PiiGuard
from memsvc.governance.policy import TenantPolicies, parse_pii_policy
from memsvc.ingest.command import IngestCommand
from memsvc.ingest.fingerprint import request_digest
from memsvc.ingest.payload import JobPayload
from memsvc.observability import tracing
from memsvc.storage import citus, outbox
from memsvc.storage.messages import insert_messages
from memsvc.storage.model import Scope
from memsvc.storage.pool import acquire

# Characters of a turn screened on the event loop; a bigger turn is screened in a thread.
_SCREEN_INLINE_CHARS = 8_000
_SCREENS_AT_ONCE = 2


@dataclass(frozen=True)
class IngestReceipt:
    ingest_id: uuid.UUID
    duplicate: bool
    accepted: int
    dropped: int
    # Messages of this call whose stored text had personal data replaced (0 on a duplicate).
    redacted: int = 0


class IngestService:
    """The online part of the write path: fast and dumb. Workers do everything else."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        acquire_timeout_s: float,
        policies: TenantPolicies | None = None,
        guard: PiiGuard | None = None,
    ) -> None:
        self._pool = pool
        self._acquire_timeout_s = acquire_timeout_s
        # Whether the database is a Citus coordinator, where Ingest wakes the outbox workers
        # itself (outbox.wake); found out at the first Ingest.
        self._on_citus: bool | None = None
        # The tenant's message TTL and PII policy (default: messages never expire, every kind
        # of personal data is redacted).
        self._policies = policies or TenantPolicies(
            None, default_pii=parse_pii_policy("redact"), default_message_ttl_s=0
        )
        self._guard = guard or PiiGuard(self._policies)
        # Big screens two at a time, tenant by tenant then user by user (issue 31): the screen
        # holds the GIL, so more threads ran no faster, and one tenant's burst of big Ingests
        # (six threads at once) held the event loop 80 ms late, refusing every tenant's reads,
        # while another tenant's screen queued behind the burst. Two, not one: the next screen
        # is ready while the loop, late under load, hands over the turn.
        self._screen_turns = FairTurns(_SCREENS_AT_ONCE)

    def _screen(
        self, command: IngestCommand, policy: Mapping[str, str]
    ) -> tuple[IngestCommand, int]:
        """The command as it may be stored, and how many messages were redacted. A message
        is never refused: a rejected kind is redacted (``may_reject=False``)."""
        texts = [m.text for m in command.messages]
        screened = [self._guard.screen(t, policy, may_reject=False) for t in texts]
        # A name is embedded and indexed with the text (the message's unit): screened alike.
        names = [
            self._guard.screen(m.sender_name, policy, may_reject=False) if m.sender_name else None
            for m in command.messages
        ]
        goals = [self._guard.screen(g, policy, may_reject=False) for g in command.goals]
        self._guard.record("ingest", screened + goals + [n for n in names if n is not None])
        changed = sum(
            s.text != m.text or (n is not None and n.text != m.sender_name)
            for s, n, m in zip(screened, names, command.messages, strict=True)
        )
        if not changed and all(s.text == g for s, g in zip(goals, command.goals, strict=True)):
            return command, 0
        messages = tuple(
            replace(m, text=s.text, sender_name=m.sender_name if n is None else n.text)
            for m, s, n in zip(command.messages, screened, names, strict=True)
        )
        return replace(command, messages=messages, goals=tuple(s.text for s in goals)), changed

    async def _screened(
        self, command: IngestCommand, policy: Mapping[str, str], budget: Budget
    ) -> tuple[IngestCommand, int]:
        """``_screen``, with no connection held. A big turn is screened in a thread (about
        0.05-0.7 ms a message; 40 ms for 8,000 characters of digits), so other calls keep
        being served meanwhile, in its fair turn among the big screens."""
        chars = sum(len(m.text) for m in command.messages) + sum(map(len, command.goals))
        if chars <= _SCREEN_INLINE_CHARS:
            return self._screen(command, policy)
        try:
            async with (
                asyncio.timeout(budget.remaining()),
                self._screen_turns.turn(command.scope.tenant_id, command.scope.user_id),
            ):
                return await asyncio.to_thread(self._screen, command, policy)
        except TimeoutError:
            raise DeadlineExceeded(
                "Ingest: the PII screen of the messages ran out of time"
            ) from None

    async def ingest(self, command: IngestCommand, budget: Budget) -> IngestReceipt:
        """Exactly two writes: the outbox row (its key, unique per user, makes retries free;
        a key reused for a different request is ALREADY_EXISTS), the messages.
        Before them, and before a connection is taken, the tenant's PII policy is applied. On
        Citus the same transaction also wakes the outbox workers (outbox.wake)."""
        ingest_id = uuid.uuid4()
        ttl_s, redacted = 0, 0
        if command.messages or command.goals:
            tenant = command.scope.tenant_id
            policy = self._policies.peek(tenant)
            if policy is None:
                async with acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn:
                    policy = await self._policies.get(tenant, conn)
            command, redacted = await self._screened(command, policy.pii, budget)
            ttl_s = policy.message_ttl_s
        payload = JobPayload(
            command.end_of_session,
            command.goals,
            command.counterpart_persona_id,
            tracing.current_traceparent(),
        ).as_json()
        digest = request_digest(command)
        async with acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn:
            if self._on_citus is None:
                self._on_citus = await citus.has_citus(conn)
            async with conn.transaction():
                with tracing.span("memsvc.ingest.outbox_write", ingest_id=str(ingest_id)):
                    fresh = await outbox.enqueue(
                        conn,
                        command.scope,
                        ingest_id=ingest_id,
                        idempotency_key=command.idempotency_key,
                        session_id=command.session_id,
                        payload=payload,
                        request_digest=digest,
                    )
                accepted = 0
                if fresh:
                    with tracing.span(
                        "memsvc.ingest.messages_write", messages=len(command.messages)
                    ):
                        accepted = await insert_messages(
                            conn, command.scope, ingest_id, command.messages, ttl_s=ttl_s
                        )
                if fresh and self._on_citus:
                    await outbox.wake(conn, command.scope)
            if not fresh:
                first = await outbox.first_use(conn, command.scope, command.idempotency_key)
                return IngestReceipt(
                    _retried(first, command, digest), duplicate=True, accepted=0, dropped=0
                )
        return IngestReceipt(
            ingest_id,
            duplicate=False,
            accepted=accepted,
            dropped=len(command.messages) - accepted,
            redacted=redacted,
        )

    async def status(
        self, tenant_id: str, ingest_id: uuid.UUID, scope: Scope | None, budget: Budget
    ) -> outbox.JobStatus:
        """The job's status, visible only within the tenant (and the exact scope when given)."""
        async with acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn:
            found = await outbox.status(
                conn, tenant_id, ingest_id, user_id=scope.user_id if scope is not None else None
            )
        if found is None or (scope is not None and found.scope != scope):
            raise NotFound("ingest_id: no ingest with this id in this scope")
        return found


def _retried(first: outbox.KeyUse | None, command: IngestCommand, digest: str) -> uuid.UUID:
    """The ingest_id to answer a repeated key with, when the request is the one the key was
    first used for (same scope, session, messages: a retry); ALREADY_EXISTS when it is not.
    Keys are per user, so another user's key never reaches here. The message names the key,
    never its value."""
    if first is None:
        # The first job was deleted (erasure, retention) between the conflict and the read.
        raise Unavailable("idempotency_key: its first use was being deleted; retry")
    scope = command.scope
    same_scope = (first.persona_id, first.agent_id) == (scope.persona_id, scope.agent_id)
    if not same_scope or first.request_digest not in (None, digest):
        raise AlreadyExists(
            "idempotency_key: already used by this user for a different request (another"
            " scope, session or messages); a retry must resend the same request, and new"
            " messages need a new key. Nothing was written"
        )
    return first.ingest_id
