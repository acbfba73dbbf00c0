"""The server interceptor: a request id per call, per-RPC metrics, unreadable requests refused.

It wraps every method handler, so it sees each call, unauthenticated and malformed ones
included, and measures the handler itself: from its start to the status the caller gets,
aborts, cancellations and escaped exceptions included. A request larger than
``max_request_bytes``, or bytes that are not the method's protobuf message, never reaches
the servicer: the call is answered INVALID_ARGUMENT (gRPC's own answer to the latter would
be an opaque INTERNAL or UNKNOWN).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError
from grpc._cython import cygrpc  # type: ignore[attr-defined]

from memsvc.errors import DeadlineExceeded, InvalidArgument
from memsvc.observability import call_context, metrics, tracing
from memsvc.overload.core_queue import CoreQueue
from memsvc.server import request_context, status

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
# Generic in the type stubs only.
if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    Handler = grpc.RpcMethodHandler
    _ServerInterceptor = grpc.aio.ServerInterceptor
UNKNOWN_METHOD = ("unknown", "unknown")


class Unreadable:
    """Stands in for a request that could not be read; the call is answered INVALID_ARGUMENT."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def split_method(path: str) -> tuple[str, str]:
    """("memsvc.v1.MemoryService", "Recall") from "/memsvc.v1.MemoryService/Recall"."""
    service, _, method = path.lstrip("/").rpartition("/")
    return (service, method) if service and method else UNKNOWN_METHOD


def _caller_request_id(context: Context) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == request_context.REQUEST_ID_HEADER:
            return value if isinstance(value, str) else None
    return None


def final_code(exc: BaseException, context: Context) -> grpc.StatusCode:
    """The status the caller receives when the handler ended with ``exc``."""
    if isinstance(exc, grpc.aio.AbortError):
        return context.code() or grpc.StatusCode.UNKNOWN
    # cygrpc's InternalError (ExecuteBatchError): a status or message sent on a call that had
    # already ended, its caller gone. grpc exports no public name for it.
    if isinstance(exc, asyncio.CancelledError | cygrpc.InternalError):
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            return grpc.StatusCode.DEADLINE_EXCEEDED
        return grpc.StatusCode.CANCELLED
    # grpc answers an exception that escapes a handler with UNKNOWN.
    return grpc.StatusCode.UNKNOWN


class _MethodMetrics:
    """One method's metric series, looked up once: ``labels()`` takes a lock and hashes the
    labels on every call, a few microseconds each, four times per call on a loop that a
    saturated server has no time to spare on."""

    __slots__ = ("handled", "in_flight", "labels", "seconds", "started")

    def __init__(self, labels: tuple[str, str]) -> None:
        self.labels = labels
        self.started = metrics.RPC_STARTED.labels(*labels)
        self.in_flight = metrics.RPC_IN_FLIGHT.labels(*labels)
        self.seconds = metrics.RPC_SECONDS.labels(*labels)
        self.handled: dict[grpc.StatusCode, Any] = {}

    def finished(self, code: grpc.StatusCode) -> Any:
        child = self.handled.get(code)
        if child is None:
            child = self.handled[code] = metrics.RPC_HANDLED.labels(*self.labels, code.name)
        return child


class _Call:
    """One observed call: ids in the context, the request id echoed, metrics on finish."""

    __slots__ = ("_metrics", "_queue", "_span", "_started", "_tokens")

    def __init__(
        self, context: Context, path: str, series: _MethodMetrics, queue: CoreQueue | None
    ) -> None:
        rid = request_context.accept_request_id(_caller_request_id(context))
        context.set_trailing_metadata(((request_context.REQUEST_ID_HEADER, rid),))
        self._tokens: tuple[contextvars.Token[str | None], ...] = (
            call_context.request_id.set(rid),
            call_context.rpc.set(path.lstrip("/")),
            call_context.tenant.set(None),  # the servicer sets it after authentication
        )
        self._metrics = series
        self._queue = queue
        # A child of the caller's traceparent; None (and nothing done) when tracing is off.
        self._span = tracing.server_span(path, context.invocation_metadata)
        if queue is not None:
            queue.entered()
        series.started.inc()
        series.in_flight.inc()
        self._started = time.perf_counter()

    def finish(self, code: grpc.StatusCode) -> None:
        series = self._metrics
        series.seconds.observe(time.perf_counter() - self._started)
        series.finished(code).inc()
        series.in_flight.dec()
        if self._queue is not None:
            self._queue.left()
        if self._span is not None:
            self._span.end(code.name)
        request_id, rpc, tenant = self._tokens
        call_context.tenant.reset(tenant)
        call_context.rpc.reset(rpc)
        call_context.request_id.reset(request_id)


class ObservingInterceptor(_ServerInterceptor):
    """Wraps each method's handler once (cached per method) with the observation."""

    def __init__(
        self,
        *,
        max_request_bytes: int,
        core_queue: CoreQueue | None = None,
        stream_stall_s: float = 0.0,
    ) -> None:
        """``core_queue``: told when each handler starts and ends (it counts the calls
        queued in front of them). ``stream_stall_s``: a server stream whose caller accepts
        no message for this long (flow control holds the write) is cut off, so a stalled
        reader does not keep what the stream holds (a slot, a connection, a snapshot); 0:
        never."""
        self._max_request_bytes = max_request_bytes
        self._stream_stall_s = stream_stall_s
        self._core_queue = core_queue
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        path = handler_call_details.method
        if handler is None:
            # No such method: grpc answers UNIMPLEMENTED; the path is not a label (unbounded).
            metrics.RPC_HANDLED.labels(*UNKNOWN_METHOD, grpc.StatusCode.UNIMPLEMENTED.name).inc()
            return handler
        cached = self._wrapped.get(path)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, path)
        self._wrapped[path] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler: Handler, path: str) -> Handler:
        series = _MethodMetrics(split_method(path))
        serializer = handler.response_serializer
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(handler.unary_unary, path, series),
                request_deserializer=self._deserializer(handler.request_deserializer),
                response_serializer=serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(handler.unary_stream, path, series),
                request_deserializer=self._deserializer(handler.request_deserializer),
                response_serializer=serializer,
            )
        # Request streams (reflection) get their messages as they are: a stand-in inside an
        # iterator would reach code that does not expect it.
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.stream_unary, path, series),
                request_deserializer=handler.request_deserializer,
                response_serializer=serializer,
            )
        assert handler.stream_stream is not None
        return grpc.stream_stream_rpc_method_handler(
            self._streaming(handler.stream_stream, path, series),
            request_deserializer=handler.request_deserializer,
            response_serializer=serializer,
        )

    def _deserializer(self, inner: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
        if inner is None:
            return None
        limit = self._max_request_bytes

        def read(raw: bytes) -> Any:
            if len(raw) > limit:
                return Unreadable(f"request: {len(raw)} bytes, at most {limit}")
            try:
                return inner(raw)
            except DecodeError:
                return Unreadable("request: not a valid protobuf message for this method")

        return read

    def _unary(
        self, behavior: Callable[..., Any], path: str, series: _MethodMetrics
    ) -> Callable[[Any, Context], Awaitable[Any]]:
        queue = self._core_queue

        async def observed(request: Any, context: Context) -> Any:
            call = _Call(context, path, series, queue)
            try:
                if isinstance(request, Unreadable):
                    await status.abort(context, InvalidArgument(request.message))
                response = await behavior(request, context)
                if status.caller_gone(context):
                    # Its deadline passed, or it cancelled: sending would only make grpc log
                    # an ExecuteBatchError.
                    raise asyncio.CancelledError
            except BaseException as exc:
                call.finish(final_code(exc, context))
                raise
            call.finish(context.code() or grpc.StatusCode.OK)
            return response

        return observed

    def _streaming(self, behavior: Callable[..., Any], path: str, series: _MethodMetrics) -> Any:
        if not inspect.isasyncgenfunction(behavior):
            # A coroutine that writes with context.write (the health Watch).
            return self._unary(behavior, path, series)
        queue = self._core_queue
        stall_s = self._stream_stall_s

        # A coroutine that writes each response, not a generator that yields it: grpc cancels
        # a call (caller gone, deadline passed) by cancelling the handler's task, which then
        # raises here, so the handler's generator is closed at once in its own task (a cursor
        # and its connection released, the call measured). A yielding wrapper would be left
        # suspended and closed later by the garbage collector, in another task and context.
        async def observed(request: Any, context: Context) -> None:
            call = _Call(context, path, series, queue)
            try:
                if isinstance(request, Unreadable):
                    await status.abort(context, InvalidArgument(request.message))
                responses: AsyncGenerator[Any, None] = behavior(request, context)
                try:
                    async for response in responses:
                        if stall_s <= 0:
                            await context.write(response)
                            continue
                        try:
                            async with asyncio.timeout(stall_s):
                                await context.write(response)
                        except TimeoutError:
                            stalled = True
                        else:
                            stalled = False
                        if stalled:
                            # The generator (its slot, cursor and snapshot) closes first.
                            await responses.aclose()
                            await status.abort(context, _stalled(stall_s))
                finally:
                    await responses.aclose()
            except BaseException as exc:
                call.finish(final_code(exc, context))
                raise
            call.finish(context.code() or grpc.StatusCode.OK)

        return observed


def _stalled(stall_s: float) -> DeadlineExceeded:
    return DeadlineExceeded(
        f"stream cut off: the caller accepted no message for {stall_s:g} s (the longest this"
        " server holds a stream for a stalled reader); read steadily, or call again"
    )
