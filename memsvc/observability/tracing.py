"""OpenTelemetry traces: off unless configured, and then nothing of it runs on a call's path.

On when the standard variables ask for it (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set, ``OTEL_SDK_DISABLED`` not true,
``OTEL_TRACES_EXPORTER`` not ``none``): spans go to OTLP over gRPC in batches, and the
exporter reads the other standard variables itself (headers, timeout, service name through
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``). Off, :func:`span` hands back one shared
no-op context manager: a global read and a call, no OpenTelemetry object, no context change.

A caller's W3C ``traceparent`` (and ``tracestate``) metadata makes a call's server span a
child of the caller's; the server's spans (admission, each Recall leg and the embedding, each
SQL statement, Prefetch's cache and build, Ingest's writes) hang under it; an extraction job
carries its Ingest's trace context in its outbox row and links to it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer

INSTRUMENTATION = "memsvc"
_NULL: AbstractContextManager[None] = contextlib.nullcontext()
# The gRPC codes a server span marks as an error (OpenTelemetry's gRPC conventions: the
# others are the caller's doing, answered as designed).
SERVER_ERRORS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)
_tracer: Tracer | None = None
_provider: TracerProvider | None = None


def wanted(env: Mapping[str, str]) -> bool:
    """Whether the standard OpenTelemetry variables ask for exported traces."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )


def configure(env: Mapping[str, str]) -> bool:
    """Turn tracing on with the OTLP exporter when ``env`` asks for it (once per process,
    before the server starts); whether it is on."""
    if not wanted(env):
        return False
    # Imported only when used: the exporter pulls in its own gRPC client stack.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    install(BatchSpanProcessor(OTLPSpanExporter()))
    return True


def install(*processors: SpanProcessor) -> TracerProvider:
    """Trace through ``processors`` from now on (tests pass the SDK's in-memory exporter)."""
    global _tracer, _provider
    provider = TracerProvider(resource=Resource.create({"service.name": "memsvc"}))
    for processor in processors:
        provider.add_span_processor(processor)
    _provider = provider
    _tracer = provider.get_tracer(INSTRUMENTATION)
    return provider


def shutdown() -> None:
    """Flush what is buffered and turn tracing off."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def enabled() -> bool:
    return _tracer is not None


def span(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A child span of the current one for the block; a shared no-op when tracing is off."""
    tracer = _tracer
    if tracer is None:
        return _NULL
    return tracer.start_as_current_span(name, attributes=attributes or None)


def set_attributes(**attributes: Any) -> None:
    """Attributes on the current span (nothing when off)."""
    if _tracer is not None:
        trace.get_current_span().set_attributes(attributes)


# -- the server's span per call ----------------------------------------------------------------


class ServerSpan:
    """A call's server span, current in the handler's context until :meth:`end`."""

    __slots__ = ("_span", "_token")

    def __init__(self, span_: Span, token: object) -> None:
        self._span = span_
        self._token = token

    def end(self, code_name: str) -> None:
        self._span.set_attribute("rpc.grpc.status_code", code_name)
        if code_name in SERVER_ERRORS:
            self._span.set_status(Status(StatusCode.ERROR, code_name))
        self._span.end()
        otel_context.detach(self._token)  # type: ignore[arg-type]


def server_span(
    path: str, metadata: Callable[[], Iterable[tuple[str, Any]] | None]
) -> ServerSpan | None:
    """Start the server span of a call to ``path`` ("/pkg.Service/Method"), a child of the
    caller's ``traceparent`` when its metadata (read only when tracing is on) has one; None
    when tracing is off."""
    tracer = _tracer
    if tracer is None:
        return None
    carrier = {k: v for k, v in metadata() or () if isinstance(v, str)}
    parent = extract(carrier)
    service, _, method = path.lstrip("/").rpartition("/")
    started = tracer.start_span(
        path.lstrip("/"),
        context=parent,
        kind=SpanKind.SERVER,
        attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": method},
    )
    token = otel_context.attach(trace.set_span_in_context(started, parent))
    return ServerSpan(started, token)


# -- SQL statements (asyncpg's query logger) ---------------------------------------------------


def sql_logger(record: Any) -> None:
    """asyncpg query logger: one span per statement, with its text (never its arguments) and
    its duration, under the span current when it ran (asyncpg calls this in the query's
    context). Registered on each pooled connection only when tracing is on."""
    tracer = _tracer
    if tracer is None:
        return
    end_ns = time.time_ns()
    start_ns = end_ns - int(record.elapsed * 1e9)
    query = str(record.query)
    verb = query.lstrip().split(None, 1)[0].upper() if query.strip() else "SQL"
    sql_span = tracer.start_span(
        f"postgresql {verb}",
        kind=SpanKind.CLIENT,
        start_time=start_ns,
        attributes={"db.system": "postgresql", "db.statement": query[:2000]},
    )
    if record.exception is not None:
        sql_span.set_status(Status(StatusCode.ERROR, type(record.exception).__name__))
    sql_span.end(end_time=end_ns)


# -- carrying a trace to later work (the extraction job of an Ingest) -----------------------


def current_traceparent() -> str | None:
    """The current span's W3C traceparent (to store with work done later); None when off."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent")


@contextlib.contextmanager
def linked_span(name: str, traceparent: str | None, **attributes: Any) -> Iterator[None]:
    """A new trace's root span for work that ``traceparent``'s call started (a link, not a
    parent: the work runs after that call ended); a no-op when tracing is off."""
    tracer = _tracer
    if tracer is None:
        yield
        return
    links = []
    if traceparent:
        origin = trace.get_current_span(extract({"traceparent": traceparent})).get_span_context()
        if origin.is_valid:
            links.append(Link(origin))
    with tracer.start_as_current_span(
        name, context=otel_context.Context(), links=links, attributes=attributes or None
    ):
        yield
