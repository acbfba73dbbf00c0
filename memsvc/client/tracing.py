"""The client's spans: one per call, its W3C trace context sent in the call's metadata.

Through the OpenTelemetry API only: the application chooses the SDK and the exporter. Until
it installs a tracer provider (or without ``opentelemetry-api`` at all) nothing is done: a
call pays a lookup of the global provider, no span and no metadata.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Any

import grpc

try:
    from opentelemetry import propagate, trace
except ImportError:  # pragma: no cover - the API is a dependency; tolerated when absent
    propagate = None  # type: ignore[assignment]
    trace = None  # type: ignore[assignment]

SERVICE = "memsvc.v1.MemoryService"
INSTRUMENTATION = "memsvc.client"
_NULL: AbstractContextManager[None] = contextlib.nullcontext()


def _tracer() -> Any:
    """The application's tracer, or None while no provider is installed."""
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer(INSTRUMENTATION)


def call_span(rpc: str) -> AbstractContextManager[Any]:
    """The span of one call to ``rpc`` (its retries included), current for the block."""
    tracer = _tracer()
    if tracer is None:
        return _NULL
    started: AbstractContextManager[Any] = tracer.start_as_current_span(
        f"{SERVICE}/{rpc}",
        kind=trace.SpanKind.CLIENT,
        attributes={"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": rpc},
    )
    return started


def stream_span(rpc: str) -> Any:
    """A started span for a stream that lives past the caller's block (end it when the
    stream ends), or None while tracing is off."""
    tracer = _tracer()
    if tracer is None:
        return None
    return tracer.start_span(
        f"{SERVICE}/{rpc}",
        kind=trace.SpanKind.CLIENT,
        attributes={"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": rpc},
    )


def inject(metadata: grpc.aio.Metadata, span: Any = None) -> None:
    """Add ``traceparent`` (and ``tracestate``) of ``span``, else of the current span."""
    if propagate is None or _tracer() is None:
        return
    context = trace.set_span_in_context(span) if span is not None else None
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    for key, value in carrier.items():
        metadata.add(key, value)
