"""Ingest: store the turn's messages and one outbox row in one transaction, then return."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg

from memsvc.concurrency.deadline import Budget
from memsvc.errors import NotFound
from memsvc.governance.policy import TenantPolicies
from memsvc.ingest.payload import JobPayload
from memsvc.storage import outbox
from memsvc.storage.messages import StoredMessage, insert_messages
from memsvc.storage.model import Scope
from memsvc.storage.pool import acquire


@dataclass(frozen=True)
class IngestCommand:
    """A validated Ingest request."""

    scope: Scope
    session_id: str
    messages: tuple[StoredMessage, ...]
    idempotency_key: str
    end_of_session: bool = False
    goals: tuple[str, ...] = ()
    counterpart_persona_id: str = ""


@dataclass(frozen=True)
class IngestReceipt:
    ingest_id: uuid.UUID
    duplicate: bool
    accepted: int
    dropped: int


class IngestService:
    """The online part of the write path: fast and dumb. Workers do everything else."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        acquire_timeout_s: float,
        policies: TenantPolicies | None = None,
    ) -> None:
        self._pool = pool
        self._acquire_timeout_s = acquire_timeout_s
        # The tenant's message TTL (None: messages never expire).
        self._policies = policies

    async def ingest(self, command: IngestCommand, budget: Budget) -> IngestReceipt:
        """Exactly two writes: the outbox row (its unique key makes retries free), the messages."""
        ingest_id = uuid.uuid4()
        payload = JobPayload(
            command.end_of_session, command.goals, command.counterpart_persona_id
        ).as_json()
        async with acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn:
            ttl_s = 0
            if self._policies is not None and command.messages:
                policy = await self._policies.get(command.scope.tenant_id, conn)
                ttl_s = policy.message_ttl_s
            async with conn.transaction():
                fresh = await outbox.enqueue(
                    conn,
                    command.scope,
                    ingest_id=ingest_id,
                    idempotency_key=command.idempotency_key,
                    session_id=command.session_id,
                    payload=payload,
                )
                accepted = (
                    await insert_messages(
                        conn, command.scope, ingest_id, command.messages, ttl_s=ttl_s
                    )
                    if fresh
                    else 0
                )
            if not fresh:
                first = await outbox.ingest_id_for_key(
                    conn, command.scope.tenant_id, command.idempotency_key
                )
                assert first is not None, "a conflicting key always has a row"
                return IngestReceipt(first, duplicate=True, accepted=0, dropped=0)
        return IngestReceipt(
            ingest_id, duplicate=False, accepted=accepted, dropped=len(command.messages) - accepted
        )

    async def status(
        self, tenant_id: str, ingest_id: uuid.UUID, scope: Scope | None, budget: Budget
    ) -> outbox.JobStatus:
        """The job's status, visible only within the tenant (and the exact scope when given)."""
        async with acquire(self._pool, budget, timeout_s=self._acquire_timeout_s) as conn:
            found = await outbox.status(conn, tenant_id, ingest_id)
        if found is None or (scope is not None and found.scope != scope):
            raise NotFound(f"ingest {ingest_id} not found")
        return found
