"""MemoryService over gRPC: authenticate, budget, validate, call the domain, map every error."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc

from memsvc.concurrency.deadline import Budget
from memsvc.concurrency.shares import TenantSlots
from memsvc.config import Settings
from memsvc.embedding import EmbeddingError
from memsvc.errors import (
    DeadlineExceeded,
    InvalidArgument,
    MemsvcError,
    Overloaded,
    Unavailable,
)
from memsvc.observability import call_context, metrics, tracing
from memsvc.overload.load import Load
from memsvc.overload.read_gate import IN_FLIGHT_RETRY_AFTER_S, InFlightLimit
from memsvc.prefetch.model import PrefetchQuery
from memsvc.retrieval.query import RecallQuery
from memsvc.retrieval.recall import RecallResult, RecallService
from memsvc.retrieval.recall_ahead import RecallAhead
from memsvc.server import (
    convert,
    convert_batch,
    convert_core_blocks,
    convert_read,
    convert_sessions,
    convert_watch,
    status,
    validate,
    validate_batch,
    validate_core_blocks,
    validate_export,
    validate_read,
    validate_sessions,
    validate_update,
    validate_watch,
)
from memsvc.server.admission import Bucket, TenantLimits, take_token
from memsvc.server.auth import Authenticator, Metadata
from memsvc.server.services import Services
from memsvc.storage.errors import map_db_error
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from memsvc.wire import convert as wire

log = logging.getLogger(__name__)

Reply = TypeVar("Reply")
Query = TypeVar("Query")
# An import holds its lines until all are checked, seconds to minutes: a slot frees then.
IMPORT_RETRY_AFTER_S = 1.0
# Reads end their own legs at the budget; this outer guard is only a last resort.
READ_GUARD_SLACK_S = 0.25
Context = grpc.aio.ServicerContext[object, object]


def to_memsvc_error(exc: Exception) -> MemsvcError | None:
    """Map a library error (database, embedder) to a memsvc error; None when unknown."""
    if isinstance(exc, MemsvcError):
        return exc
    if isinstance(exc, EmbeddingError):
        return Unavailable("the embedding model could not answer; retry shortly")
    return map_db_error(exc)


# Answers about the request itself, not the service: not worth a log line each. Failed
# authentication is counted and summarized by the authenticator (observability/auth_log.py).
_CALLER_ERRORS = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED,
)


def answer_for(rpc: str, exc: Exception) -> MemsvcError:
    """The error a failed call is answered with; a bug (an unknown exception) is logged with
    its stack and answered INTERNAL, never UNKNOWN."""
    error: MemsvcError
    if isinstance(exc, TimeoutError):
        error = DeadlineExceeded(f"{rpc} did not complete within the call's deadline")
    elif (mapped := to_memsvc_error(exc)) is not None:
        error = mapped
    else:
        log.exception("%s failed unexpectedly", rpc)
        error = MemsvcError(f"{rpc} failed: internal error ({type(exc).__name__})")
    # Shed load is counted and summarized (overload/shed_log.py): a line per refusal
    # would flood the log when the server is saturated.
    if error.code not in _CALLER_ERRORS and not isinstance(error, Overloaded):
        log.info("%s answered %s", rpc, error.code.name)
    return error


def _deadline_too_short(margin_ms: int) -> DeadlineExceeded:
    """A call that arrives with no more time left than the server keeps back to answer:
    nothing can be done in it, and it is the deadline that says so, not a busy server."""
    return DeadlineExceeded(
        f"deadline: the call arrived with at most {margin_ms} ms left, which this server"
        " keeps back to send its answer in time; nothing was done; send a longer deadline"
    )


def _metadata(context: Context) -> Metadata:
    return tuple((key, value) for key, value in context.invocation_metadata() or ())


class MemoryServicer(pb_grpc.MemoryServiceServicer):
    """The gRPC face of memsvc. No exception leaves a handler unmapped."""

    def __init__(
        self,
        settings: Settings,
        auth: Authenticator,
        services: Services,
        *,
        on_read: Callable[[Scope], object] | None = None,
        load: Load | None = None,
    ) -> None:
        """``load``: the process's load, for the read gate (None: no machine or queue gate)."""
        self._settings = settings
        self._auth = auth
        self._memories = services.memories
        self._ingest = services.ingest
        self._recall = services.recall
        self._prefetch = services.prefetch
        self._export = services.export
        self._batch = services.batch
        self._importer = services.importer
        self._sessions = services.sessions
        self._core_blocks = services.core_blocks
        self._changes = services.changes
        # Called (never awaited) when a user reads: kicks a drain of that user's pending
        # ingest work so their memories exist before the next turn. An async callback runs
        # as a background task (referenced until done); either way the read never waits.
        self._on_read = on_read
        self._on_read_tasks: set[asyncio.Future[object]] = set()
        self._reads = InFlightLimit(
            settings.reads_max_in_flight, queue_share=settings.reads_queue_share, load=load
        )
        self._tenants = TenantLimits(
            rate_per_s=settings.tenant_rate_per_s,
            burst=settings.tenant_burst,
            max_in_flight=settings.tenant_max_in_flight,
        )
        # Each tenant's share of the read slots (the total is the read gate's, above) and of
        # the import slots.
        self._tenant_reads = TenantSlots(
            "reads (Recall, Prefetch) in flight",
            total=max(1, settings.reads_max_in_flight),
            per_tenant=settings.reads_max_in_flight_per_tenant,
            retry_after_s=IN_FLIGHT_RETRY_AFTER_S,
            # Half the gate's cap as it stands: when a saturated machine brings it down to
            # a few reads, one tenant still cannot take them all.
            share_now=lambda: self._reads.cap // 2,
        )
        self._imports = TenantSlots(
            "ImportMemories calls",
            total=max(1, settings.import_max_in_flight),
            per_tenant=settings.import_max_in_flight_per_tenant,
            retry_after_s=IMPORT_RETRY_AFTER_S,
        )

    async def _run(
        self,
        context: Context,
        rpc: str,
        handler: Callable[[str, Budget], Awaitable[Reply]],
        *,
        default_deadline_ms: int,
        guard_slack_s: float = 0.0,
        max_deadline_ms: int | None = None,
    ) -> Reply:
        """``guard_slack_s``: reads manage their own budget (they answer degraded, never late),
        so their outer guard sits that much later and only fires if something overran.
        ``max_deadline_ms``: the longest the call may run, whatever deadline it set."""
        try:
            with tracing.span("memsvc.auth"):
                tenant = await self._auth.tenant(_metadata(context))
            call_context.tenant.set(tenant)
            # After authentication, so a tenant is limited by what it sends, never by others.
            with self._tenants.admit(tenant):
                budget = self._budget(context, default_deadline_ms, max_deadline_ms)
                if budget.expired:
                    raise _deadline_too_short(self._settings.deadline_margin_ms)
                async with asyncio.timeout(budget.remaining() + guard_slack_s):
                    return await handler(tenant, budget)
        except Exception as exc:  # every failure is answered with a status: mapped here
            error = answer_for(rpc, exc)
        await status.abort(context, error)

    def _budget(self, context: Context, default_ms: int, max_ms: int | None = None) -> Budget:
        """The call's budget: its deadline (``default_ms`` when it set none), at most
        ``max_ms`` (a long stream cannot hold its slot, connection or snapshot for ever)."""
        remaining = context.time_remaining()
        if max_ms is not None:
            remaining = min(default_ms / 1000 if remaining is None else remaining, max_ms / 1000)
        return Budget.from_remaining(
            remaining, default_ms=default_ms, margin_ms=self._settings.deadline_margin_ms
        )

    def _write_deadline(self) -> int:
        return self._settings.default_write_deadline_ms

    # -- explicit memory operations ---------------------------------------------------------

    async def Remember(self, request: pb.RememberRequest, context: Context) -> pb.RememberResponse:
        async def handle(tenant: str, budget: Budget) -> pb.RememberResponse:
            scope = validate.scope(
                request.scope, tenant, self._settings, present=request.HasField("scope")
            )
            memory = validate.remember(request, self._settings)
            done = await self._memories.remember(scope, memory, budget)
            return pb.RememberResponse(
                memory=wire.memory(done.record),
                reinforced=done.reinforced,
                redactions=done.redactions,
                displaced=[wire.memory(r) for r in done.displaced],
            )

        return await self._run(
            context, "Remember", handle, default_deadline_ms=self._write_deadline()
        )

    async def Correct(self, request: pb.CorrectRequest, context: Context) -> pb.Memory:
        async def handle(tenant: str, budget: Budget) -> pb.Memory:
            scope = validate.scope(
                request.scope, tenant, self._settings, present=request.HasField("scope")
            )
            memory_id = validate.memory_id(request.memory_id)
            new_content = validate.content(request.new_content, "new_content", self._settings)
            reason = validate.short_text(request.reason, "reason", self._settings.max_reason_chars)
            record = await self._memories.correct(scope, memory_id, new_content, reason, budget)
            return wire.memory(record)

        return await self._run(
            context, "Correct", handle, default_deadline_ms=self._write_deadline()
        )

    async def Forget(self, request: pb.ForgetRequest, context: Context) -> pb.ForgetResponse:
        async def handle(tenant: str, budget: Budget) -> pb.ForgetResponse:
            scope = validate.scope(
                request.scope, tenant, self._settings, present=request.HasField("scope")
            )
            chosen = sum([bool(request.memory_ids), request.all_in_scope, request.erase_user])
            if chosen != 1:
                raise InvalidArgument("set exactly one of memory_ids, all_in_scope or erase_user")
            if len(request.memory_ids) > self._settings.max_forget_ids:
                raise InvalidArgument(
                    f"memory_ids: at most {self._settings.max_forget_ids} per call"
                )
            ids = [
                validate.memory_id(m, f"memory_ids[{i}]") for i, m in enumerate(request.memory_ids)
            ]
            if request.erase_user and (scope.persona_id or scope.agent_id):
                raise InvalidArgument(
                    "erase_user removes everything about scope.user_id: leave persona_id and "
                    "agent_id empty (use all_in_scope to clear one persona or agent)"
                )
            deleted = await self._memories.forget(
                scope,
                budget,
                memory_ids=ids,
                all_in_scope=request.all_in_scope,
                erase_user=request.erase_user,
            )
            return pb.ForgetResponse(deleted=deleted)

        return await self._run(
            context, "Forget", handle, default_deadline_ms=self._write_deadline()
        )

    async def ListMemories(
        self, request: pb.ListMemoriesRequest, context: Context
    ) -> pb.ListMemoriesResponse:
        async def handle(tenant: str, budget: Budget) -> pb.ListMemoriesResponse:
            scope = validate.scope(
                request.scope, tenant, self._settings, present=request.HasField("scope")
            )
            query = validate.list_query(request, scope, self._settings)
            page = await self._memories.list_page(scope, query, budget)
            return pb.ListMemoriesResponse(
                memories=[wire.memory(r) for r in page.memories],
                next_page_token=(
                    validate.encode_page_token(
                        page.next_after, validate.memories_listing(scope, query)
                    )
                    if page.next_after
                    else ""
                ),
            )

        return await self._run(
            context, "ListMemories", handle, default_deadline_ms=self._write_deadline()
        )

    async def GetMemoryHistory(
        self, request: pb.GetMemoryHistoryRequest, context: Context
    ) -> pb.GetMemoryHistoryResponse:
        async def handle(tenant: str, budget: Budget) -> pb.GetMemoryHistoryResponse:
            scope = validate.scope(
                request.scope, tenant, self._settings, present=request.HasField("scope")
            )
            memory_id = validate.memory_id(request.memory_id)
            history = await self._memories.history(scope, memory_id, budget)
            return pb.GetMemoryHistoryResponse(
                versions=[wire.memory(r) for r in history.versions],
                edits=[wire.memory_edit(e) for e in history.edits],
            )

        return await self._run(
            context, "GetMemoryHistory", handle, default_deadline_ms=self._write_deadline()
        )

    # -- read path ----------------------------------------------------------------------------

    def _notify_read(self, scope: Scope) -> None:
        """Fire the on_read hook without waiting for it; its failures never fail the read."""
        if self._on_read is None:
            return
        try:
            result = self._on_read(scope)
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                self._on_read_tasks.add(task)
                task.add_done_callback(self._on_read_done)
        except Exception:
            log.exception("the on_read hook failed")

    def _on_read_done(self, task: asyncio.Future[object]) -> None:
        self._on_read_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("the on_read hook failed: %s", type(task.exception()).__name__)

    def reads_busy(self) -> bool:
        """Live reads hold a quarter of the read slots or more: background packet warming
        (prefetch/warmer.py) waits for them."""
        return self._reads.in_flight >= max(1, self._settings.reads_max_in_flight // 4)

    def _read_slack(self) -> float:
        # Not the margin: on a busy event loop both timers fire late together, and a guard
        # only a margin away would then cancel a handler whose degraded answer was ready.
        return max(self._settings.deadline_margin_ms / 1000, READ_GUARD_SLACK_S)

    async def Prefetch(self, request: pb.PrefetchRequest, context: Context) -> pb.PrefetchResponse:
        service = self._prefetch

        async def serve(query: PrefetchQuery, budget: Budget) -> pb.PrefetchResponse:
            return convert_read.prefetch_response(await service.prefetch(query, budget))

        return await self._read(
            context,
            "Prefetch",
            request.scope if request.HasField("scope") else None,
            lambda scope: validate_read.prefetch(request, scope, self._settings),
            serve,
            default_deadline_ms=self._settings.prefetch_default_deadline_ms,
        )

    async def Recall(self, request: pb.RecallRequest, context: Context) -> pb.RecallResponse:
        service = self._recall

        async def serve(query: RecallQuery, budget: Budget) -> pb.RecallResponse:
            return convert_read.recall_response(await service.recall(query, budget))

        return await self._read(
            context,
            "Recall",
            request.scope if request.HasField("scope") else None,
            lambda scope: validate_read.recall(request, scope, self._settings),
            serve,
            default_deadline_ms=self._settings.recall_default_deadline_ms,
            floor=service.floor_s,
        )

    async def RecallStream(
        self, request_iterator: AsyncIterator[pb.RecallStreamRequest], context: Context
    ) -> AsyncIterator[pb.RecallResponse]:
        """Interim transcripts in, one Recall answer per final out (retrieval/recall_ahead.py
        works ahead on the interims). Authenticated once; the first request is validated as
        a Recall before any work; each final is admitted and served as a Recall is (tenant
        limits, a read slot, its own budget); work ahead runs only while live reads leave
        room and never fails the stream. An error ends the stream with its status."""
        service = self._recall
        try:
            tenant = await self._auth.tenant(_metadata(context))
            call_context.tenant.set(tenant)
            requests = aiter(request_iterator)
            first = await validate_read.recall_stream_read(requests)
            if first is None:
                return
            with self._tenants.admit(tenant):
                scope = validate.scope(
                    first.scope, tenant, self._settings, present=first.HasField("scope")
                )
                opened = validate_read.recall_stream_open(first, scope, self._settings)
            final_s = opened.final_deadline_ms / 1000
            ahead = RecallAhead(
                service,
                lambda query, budget: self._recall_ahead(service, query, budget),
                budget_s=final_s - self._settings.deadline_margin_ms / 1000,
            )
            rate = self._settings.recall_stream_interims_per_s
            burst = max(1.0, rate)
            bucket = Bucket(burst, time.monotonic())
            try:
                request: pb.RecallStreamRequest | None = first
                while request is not None:
                    if request is not first:
                        validate_read.recall_stream_next(request)
                    text = validate_read.query_text(request.query, "query", self._settings)
                    if request.final:
                        query = validate_read.recall_stream_query(
                            opened.template, text, scope, self._settings
                        )
                        yield await self._recall_final(context, service, ahead, query, final_s)
                    else:
                        bucket, wait_s = take_token(
                            bucket, time.monotonic(), rate_per_s=rate, burst=burst
                        )
                        if wait_s > 0:
                            # Beyond the rate: not worked ahead (the final is still answered).
                            # Ending the stream instead would race the caller's writes already
                            # in flight, and a transcriber's burst would cost the turn.
                            metrics.RECALL_AHEAD.labels("over_rate").inc()
                        elif text:
                            ahead.interim(
                                validate_read.recall_stream_query(
                                    opened.template, text, scope, self._settings
                                )
                            )
                    request = await validate_read.recall_stream_read(requests)
            finally:
                await ahead.aclose()
            return
        except Exception as exc:  # as in _run: every failure is answered with a status
            error = answer_for("RecallStream", exc)
        await status.abort(context, error)

    async def _recall_final(
        self,
        context: Context,
        service: RecallService,
        ahead: RecallAhead,
        query: RecallQuery,
        final_s: float,
    ) -> pb.RecallResponse:
        """One final of a RecallStream, served as a Recall: the tenant's limits, a read slot,
        and a budget of ``final_s`` from now (within what the stream's deadline leaves)."""
        remaining = context.time_remaining()
        budget = Budget.from_remaining(
            final_s if remaining is None else min(final_s, remaining),
            default_ms=self._settings.recall_default_deadline_ms,
            margin_ms=self._settings.deadline_margin_ms,
        )
        with self._tenants.admit(query.scope.tenant_id):
            self._notify_read(query.scope)
            with self._reads.slot(budget.remaining(), floor_s=service.floor_s()):
                async with asyncio.timeout(budget.remaining() + self._read_slack()):
                    return convert_read.recall_response(await ahead.final(query, budget))

    async def _recall_ahead(
        self, service: RecallService, query: RecallQuery, budget: Budget
    ) -> RecallResult | None:
        """One attempt ahead of a final: only while live reads leave room (it is optional
        work), holding a read slot like any read; None when refused or failed (the final
        then recalls afresh and answers any error)."""
        if self.reads_busy():
            return None
        try:
            with (
                tracing.span("memsvc.recall_ahead", words=len(query.text.split())),
                self._reads.slot(budget.remaining(), floor_s=service.floor_s()),
            ):
                return await service.recall(query, budget, record_references=False)
        except MemsvcError:
            return None
        except Exception as exc:
            if to_memsvc_error(exc) is None:
                raise
            return None

    async def _read(
        self,
        context: Context,
        rpc: str,
        scope: pb.Scope | None,
        parse: Callable[[Scope], Query],
        serve: Callable[[Query, Budget], Awaitable[Reply]],
        *,
        default_deadline_ms: int,
        floor: Callable[[], float] | None = None,
    ) -> Reply:
        """A read: the request validated whole (a bad one changes nothing), the user's pending
        writes kicked, then served holding one read slot (``floor``: how long the read's
        cheapest, degraded answer takes now, for the gate)."""

        async def handle(tenant: str, budget: Budget) -> Reply:
            valid = validate.scope(
                scope or pb.Scope(), tenant, self._settings, present=scope is not None
            )
            query = parse(valid)
            self._notify_read(valid)
            floor_s = floor() if floor is not None else None
            with (
                self._tenant_reads.hold(tenant),
                self._reads.slot(budget.remaining(), floor_s=floor_s),
            ):
                return await serve(query, budget)

        # Refused on arrival while the server is saturated, before authentication and
        # validation: that work would be thrown away, and the loop has no time for it (a
        # caller with a bad key or request learns so once the server has room again).
        refused = self._reads.refusal()
        if refused is not None:
            await status.abort(context, refused)
        return await self._run(
            context,
            rpc,
            handle,
            default_deadline_ms=default_deadline_ms,
            guard_slack_s=self._read_slack(),
        )

    # -- export -------------------------------------------------------------------------------

    async def ExportMemories(
        self, request: pb.ExportMemoriesRequest, context: Context
    ) -> AsyncIterator[pb.ExportRecord]:
        """A server stream: records leave as the cursors read them. An error after the first
        record still ends the call with its status (the caller discards what it got)."""
        service = self._export
        try:
            tenant = await self._auth.tenant(_metadata(context))
            call_context.tenant.set(tenant)
            with self._tenants.admit(tenant):
                subject = validate_export.export(request, tenant, self._settings)
                budget = self._budget(
                    context,
                    self._settings.export_default_deadline_s * 1000,
                    self._settings.export_max_deadline_s * 1000,
                )
                async for record in service.export(subject, budget):
                    yield pb.ExportRecord(type=record.type, json=record.json)
            return
        except Exception as exc:  # as in _run: every failure is answered with a status
            error = answer_for("ExportMemories", exc)
        await status.abort(context, error)

    # -- write path ---------------------------------------------------------------------------

    async def Ingest(self, request: pb.IngestRequest, context: Context) -> pb.IngestResponse:
        async def handle(tenant: str, budget: Budget) -> pb.IngestResponse:
            command = validate.ingest(request, tenant, self._settings)
            receipt = await self._ingest.ingest(command, budget)
            return pb.IngestResponse(
                ingest_id=str(receipt.ingest_id),
                duplicate=receipt.duplicate,
                accepted=receipt.accepted,
                dropped=receipt.dropped,
                redacted=receipt.redacted,
            )

        return await self._run(
            context, "Ingest", handle, default_deadline_ms=self._write_deadline()
        )

    async def GetIngestStatus(
        self, request: pb.GetIngestStatusRequest, context: Context
    ) -> pb.IngestStatus:
        async def handle(tenant: str, budget: Budget) -> pb.IngestStatus:
            ingest_id = validate.ingest_id(request.ingest_id)
            scope = (
                validate.scope(request.scope, tenant, self._settings)
                if request.HasField("scope")
                else None
            )
            found = await self._ingest.status(tenant, ingest_id, scope, budget)
            return convert.ingest_status(found)

        return await self._run(
            context, "GetIngestStatus", handle, default_deadline_ms=self._write_deadline()
        )

    # -- core blocks (issue 15) ---------------------------------------------------------------

    async def GetCoreBlocks(
        self, request: pb.GetCoreBlocksRequest, context: Context
    ) -> pb.GetCoreBlocksResponse:
        service = self._core_blocks

        async def handle(tenant: str, budget: Budget) -> pb.GetCoreBlocksResponse:
            scope = validate.scope(
                request.scope, tenant, self._settings, present=request.HasField("scope")
            )
            persona, human = await service.get(scope, budget)
            return pb.GetCoreBlocksResponse(
                persona=convert_core_blocks.block(persona),
                human=convert_core_blocks.block(human),
            )

        return await self._run(
            context, "GetCoreBlocks", handle, default_deadline_ms=self._write_deadline()
        )

    async def UpdateCoreBlock(
        self, request: pb.UpdateCoreBlockRequest, context: Context
    ) -> pb.UpdateCoreBlockResponse:
        service = self._core_blocks

        async def handle(tenant: str, budget: Budget) -> pb.UpdateCoreBlockResponse:
            command = validate_core_blocks.update(request, tenant, self._settings)
            done = await service.update(command, budget)
            return pb.UpdateCoreBlockResponse(
                block=convert_core_blocks.block(done.block),
                displaced=[wire.memory(r) for r in done.displaced],
            )

        return await self._run(
            context, "UpdateCoreBlock", handle, default_deadline_ms=self._write_deadline()
        )

    async def GetCoreBlockHistory(
        self, request: pb.GetCoreBlockHistoryRequest, context: Context
    ) -> pb.GetCoreBlockHistoryResponse:
        service = self._core_blocks

        async def handle(tenant: str, budget: Budget) -> pb.GetCoreBlockHistoryResponse:
            scope, block, limit = validate_core_blocks.history(request, tenant, self._settings)
            found = await service.history(scope, block, limit, budget)
            return pb.GetCoreBlockHistoryResponse(
                revisions=[convert_core_blocks.revision(r) for r in found]
            )

        return await self._run(
            context, "GetCoreBlockHistory", handle, default_deadline_ms=self._write_deadline()
        )

    # -- memory management (issue 15) ---------------------------------------------------------

    async def UpdateMemory(
        self, request: pb.UpdateMemoryRequest, context: Context
    ) -> pb.UpdateMemoryResponse:
        async def handle(tenant: str, budget: Budget) -> pb.UpdateMemoryResponse:
            scope, memory_id = validate_update.memory_ref(
                request.scope, request.HasField("scope"), request.memory_id, tenant, self._settings
            )
            update = validate_update.update_memory(request, self._settings)
            done = await self._memories.update(scope, memory_id, update, budget)
            return pb.UpdateMemoryResponse(
                memory=wire.memory(done.record),
                displaced=[wire.memory(r) for r in done.displaced],
                changed=done.changed,
            )

        return await self._run(
            context, "UpdateMemory", handle, default_deadline_ms=self._write_deadline()
        )

    async def GetMemory(self, request: pb.GetMemoryRequest, context: Context) -> pb.Memory:
        async def handle(tenant: str, budget: Budget) -> pb.Memory:
            scope, memory_id = validate_update.memory_ref(
                request.scope, request.HasField("scope"), request.memory_id, tenant, self._settings
            )
            return wire.memory(await self._memories.get(scope, memory_id, budget))

        return await self._run(
            context, "GetMemory", handle, default_deadline_ms=self._write_deadline()
        )

    # -- sessions and episodes (issue 15) -----------------------------------------------------

    async def ListSessions(
        self, request: pb.ListSessionsRequest, context: Context
    ) -> pb.ListSessionsResponse:
        async def handle(tenant: str, budget: Budget) -> pb.ListSessionsResponse:
            query = validate_sessions.list_sessions(request, tenant, self._settings)
            page = await self._sessions.list_sessions(
                query.scope, query.page_size, query.after, budget
            )
            return pb.ListSessionsResponse(
                sessions=[convert_sessions.session(s) for s in page.sessions],
                next_page_token=(
                    validate_sessions.encode_sessions_token(
                        page.next_after, validate_sessions.sessions_listing(query.scope)
                    )
                    if page.next_after
                    else ""
                ),
            )

        return await self._run(
            context, "ListSessions", handle, default_deadline_ms=self._write_deadline()
        )

    async def ListEpisodes(
        self, request: pb.ListEpisodesRequest, context: Context
    ) -> pb.ListEpisodesResponse:
        async def handle(tenant: str, budget: Budget) -> pb.ListEpisodesResponse:
            query = validate_sessions.list_episodes(request, tenant, self._settings)
            page = await self._sessions.list_episodes(
                query.scope, query.page_size, query.after, query.session_id, budget
            )
            return pb.ListEpisodesResponse(
                episodes=[convert_sessions.episode(e) for e in page.episodes],
                next_page_token=(
                    validate_sessions.encode_episodes_token(
                        page.next_after,
                        validate_sessions.episodes_listing(query.scope, query.session_id),
                    )
                    if page.next_after
                    else ""
                ),
            )

        return await self._run(
            context, "ListEpisodes", handle, default_deadline_ms=self._write_deadline()
        )

    async def ForgetSession(
        self, request: pb.ForgetSessionRequest, context: Context
    ) -> pb.ForgetSessionResponse:
        async def handle(tenant: str, budget: Budget) -> pb.ForgetSessionResponse:
            scope, session_id = validate_sessions.forget_session(request, tenant, self._settings)
            done = await self._sessions.forget_session(scope, session_id, budget)
            return pb.ForgetSessionResponse(
                messages_deleted=done.messages_deleted,
                episodes_deleted=done.episodes_deleted,
                memories_deleted=done.memories_deleted,
                memories_kept=done.memories_kept,
            )

        return await self._run(
            context, "ForgetSession", handle, default_deadline_ms=self._write_deadline()
        )

    # -- batch and import (issue 15) ----------------------------------------------------------

    async def RememberBatch(
        self, request: pb.RememberBatchRequest, context: Context
    ) -> pb.RememberBatchResponse:
        service = self._batch

        async def handle(tenant: str, budget: Budget) -> pb.RememberBatchResponse:
            items = validate_batch.remember_batch(request, tenant, self._settings)
            results = await service.remember_batch(items, atomic=request.atomic, budget=budget)
            return convert_batch.remember_batch_response(results)

        return await self._run(
            context, "RememberBatch", handle, default_deadline_ms=self._write_deadline()
        )

    async def ImportMemories(
        self, request_iterator: AsyncIterator[pb.ImportMemoriesRequest], context: Context
    ) -> pb.ImportMemoriesResponse:
        service = self._importer

        async def handle(tenant: str, budget: Budget) -> pb.ImportMemoriesResponse:
            # Taken before the lines are read: it is their memory and time the slot bounds.
            with self._imports.hold(tenant):
                stream = await validate_batch.import_stream(
                    request_iterator, tenant, self._settings
                )
                result = await service.import_lines(
                    stream.scope,
                    stream.lines,
                    budget,
                    keep_record_scopes=stream.keep_record_scopes,
                )
            return convert_batch.import_response(result)

        return await self._run(
            context,
            "ImportMemories",
            handle,
            default_deadline_ms=self._settings.import_default_deadline_s * 1000,
            max_deadline_ms=self._settings.import_max_deadline_s * 1000,
        )

    # -- change stream (issue 15) -------------------------------------------------------------

    async def WatchMemories(
        self, request: pb.WatchMemoriesRequest, context: Context
    ) -> AsyncIterator[pb.MemoryChange]:
        """A server stream that lasts until the caller cancels it, its own deadline ends, or
        MEMSVC_WATCH_MAX_STREAM_S passes (UNAVAILABLE, saying so: resume). Validation, the
        start position and the stream slot are settled before the first change; an error
        later still ends the call with its status (the caller resumes from the last position
        it handled)."""
        stream = self._changes
        try:
            tenant = await self._auth.tenant(_metadata(context))
            call_context.tenant.set(tenant)
            # The tenant's rate and in-flight slot cover opening only: a stream then holds
            # its own slot (MEMSVC_WATCH_MAX_STREAMS[_PER_TENANT]), not a call's.
            with self._tenants.admit(tenant):
                subject, after = validate_watch.watch(request, tenant, self._settings)
                budget = Budget.from_remaining(
                    context.time_remaining(),
                    default_ms=self._write_deadline(),
                    margin_ms=self._settings.deadline_margin_ms,
                )
                subscription = await stream.open(subject, after, budget)
            max_s = self._settings.watch_max_stream_s
            ends_at = time.monotonic() + max_s if max_s > 0 else math.inf
            async with subscription:
                async for change in subscription:
                    yield convert_watch.change(change)
                    # Checked at each change or heartbeat: at most a heartbeat late.
                    if time.monotonic() >= ends_at:
                        raise Unavailable(
                            f"WatchMemories streams last at most {max_s:g} s on this server;"
                            " open a new one after the last position you handled"
                        )
            return
        except Exception as exc:  # as in _run: every failure is answered with a status
            error = answer_for("WatchMemories", exc)
        await status.abort(context, error)
