"""ExportService: one snapshot, each kind through a cursor in bounded batches, then a summary.

An export holds one pooled connection (and one read-only REPEATABLE READ snapshot) for as
long as it streams, so a process runs at most `max_in_flight` of them, and one tenant at
most `max_in_flight_per_tenant` (its share: two streams held open by one tenant no longer
refuse everyone else's); beyond that a call is refused at once (RESOURCE_EXHAUSTED with a
retry hint) rather than starving the short reads of connections. The stream stops at the
budget (DEADLINE_EXCEEDED; the servicer caps it at MEMSVC_EXPORT_MAX_DEADLINE_S) and, when
the caller cancels, the cursor and transaction go with the handler's task.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

import asyncpg

from memsvc.concurrency.deadline import Budget
from memsvc.concurrency.shares import TenantSlots
from memsvc.config import from_setting
from memsvc.errors import DeadlineExceeded, Unavailable
from memsvc.export import encode
from memsvc.observability import metrics
from memsvc.storage import export as sql
from memsvc.storage.export import Subject
from memsvc.storage.pool import acquire

# An export ends within seconds to minutes; a slot frees when one does.
BUSY_RETRY_AFTER_S = 1.0
# The snapshot is released by PostgreSQL itself this long after the budget, should the
# process stall without ever closing the transaction.
IDLE_SLACK_S = 5.0


@dataclass(frozen=True)
class ExportRecord:
    """One line of the export: its kind and one JSON object without line breaks."""

    type: str
    json: str


@dataclass(frozen=True)
class ExportConfig:
    batch_rows: int = field(metadata=from_setting("export_batch_rows"))
    max_in_flight: int = field(metadata=from_setting("export_max_in_flight"))
    acquire_timeout_s: float = field(metadata=from_setting("pg_acquire_timeout_ms"))
    fetch_timeout_s: float = field(metadata=from_setting("pg_command_timeout_ms"))
    max_in_flight_per_tenant: int = field(
        default=0, metadata=from_setting("export_max_in_flight_per_tenant")
    )


class ExportService:
    def __init__(self, pool: asyncpg.Pool, config: ExportConfig) -> None:
        self._pool = pool
        self._config = config
        self._slots = TenantSlots(
            "ExportMemories streams",
            total=config.max_in_flight,
            per_tenant=config.max_in_flight_per_tenant,
            retry_after_s=BUSY_RETRY_AFTER_S,
        )

    @property
    def in_flight(self) -> int:
        return self._slots.in_use

    async def export(self, subject: Subject, budget: Budget) -> AsyncIterator[ExportRecord]:
        """Every record of the subject, kind by kind, then the summary."""
        tenant = subject.scope.tenant_id
        self._slots.take(tenant)
        metrics.EXPORTS_IN_FLIGHT.inc()
        try:
            async for record in self._stream(subject, budget):
                yield record
        finally:
            self._slots.give_back(tenant)
            metrics.EXPORTS_IN_FLIGHT.dec()

    def _fetch_timeout(self, budget: Budget) -> float:
        left = budget.remaining()
        if left <= 0:
            raise DeadlineExceeded(
                "ExportMemories did not finish within the call's deadline; call again with a"
                " longer one (an export always restarts from the beginning)"
            )
        return min(left, self._config.fetch_timeout_s)

    async def _stream(self, subject: Subject, budget: Budget) -> AsyncIterator[ExportRecord]:
        config = self._config
        scope = subject.scope
        async with (
            acquire(self._pool, budget, timeout_s=config.acquire_timeout_s) as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            idle_ms = int((budget.remaining() + IDLE_SLACK_S) * 1000)
            await conn.execute(f"SET LOCAL idle_in_transaction_session_timeout = {idle_ms}")
            at = await sql.snapshot_time(conn)
            counts: dict[str, int] = {}
            for kind, statement in sql.KINDS:
                to_json = encode.ENCODERS[kind]
                counts[kind] = 0
                rows_of_kind = sql.batches(
                    conn,
                    statement(subject, at),
                    batch_rows=config.batch_rows,
                    fetch_timeout=lambda: self._fetch_timeout(budget),
                )
                try:
                    async with aclosing(rows_of_kind):
                        async for rows in rows_of_kind:
                            metrics.EXPORT_BATCHES.inc()
                            metrics.EXPORT_RECORDS.labels(kind).inc(len(rows))
                            for row in rows:
                                yield ExportRecord(kind, encode.dumps(to_json(row)))
                            counts[kind] += len(rows)
                except TimeoutError:
                    if budget.expired:
                        self._fetch_timeout(budget)  # raises DeadlineExceeded
                    raise Unavailable(
                        "the database did not answer an export batch in time; retry shortly"
                    ) from None
            metrics.EXPORT_RECORDS.labels("summary").inc()
            yield ExportRecord(
                "summary",
                encode.dumps(
                    encode.summary(
                        user_id=scope.user_id,
                        persona_id=scope.persona_id,
                        agent_id=scope.agent_id,
                        whole_user=subject.whole_user,
                        counts=counts,
                        exported_at=at,
                    )
                ),
            )
