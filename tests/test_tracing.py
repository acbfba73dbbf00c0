"""OpenTelemetry traces end to end, through the SDK's in-memory exporter: a client call and
the server's spans in one trace (the caller's traceparent accepted), the extraction job of
an Ingest linked to it, and nothing at all while tracing is off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from memsvc.client import MemoryClient
from memsvc.client.builders import message, scope
from memsvc.observability import tracing
from memsvc.server.app import MemsvcServer
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import Caller
from tests.read_helpers import StartServer
from tests.read_helpers import start_server as start_server  # fixture
from tests.test_explicit_memory import remember

RECALL = "memsvc.v1.MemoryService/Recall"
INGEST = "memsvc.v1.MemoryService/Ingest"


class _ToCurrentTest(SpanExporter):
    """The application's (the client's) exporter: the global provider can be set once per
    process, so it hands each span to the running test's exporter, if any."""

    target: InMemorySpanExporter | None = None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.target is None:
            return SpanExportResult.SUCCESS
        return self.target.export(spans)


_CLIENT = _ToCurrentTest()


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """Tracing on for the test, server and client, into one in-memory exporter."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_CLIENT))
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    _CLIENT.target = exporter
    tracing.install(SimpleSpanProcessor(exporter))
    try:
        yield exporter
    finally:
        _CLIENT.target = None
        tracing.shutdown()


@pytest.fixture
async def traced_server(exported: InMemorySpanExporter, start_server: StartServer) -> MemsvcServer:
    """A server started with tracing on: its connections report their SQL statements."""
    server, _channel = await start_server()
    return server


@pytest.fixture
async def client(traced_server: MemsvcServer, caller: Caller) -> AsyncIterator[MemoryClient]:
    async with MemoryClient(f"127.0.0.1:{traced_server.port}", api_key=caller.key) as c:
        yield c


async def spans_until(
    exporter: InMemorySpanExporter, done: Callable[[list[ReadableSpan]], bool]
) -> list[ReadableSpan]:
    """The finished spans once ``done`` holds (SQL spans are reported by a callback just
    after their statement; a call's spans can end a moment after its answer)."""
    for _ in range(200):
        spans = list(exporter.get_finished_spans())
        if done(spans):
            return spans
        await asyncio.sleep(0.01)
    return list(exporter.get_finished_spans())


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def ancestors(span: ReadableSpan, spans: list[ReadableSpan]) -> list[str]:
    """The names of ``span``'s parents up to its trace's root, nearest first."""
    by_id = {s.context.span_id: s for s in spans if s.context is not None}
    names = []
    parent = span.parent
    while parent is not None and parent.span_id in by_id:
        found = by_id[parent.span_id]
        names.append(found.name)
        parent = found.parent
    return names


async def test_one_recall_is_one_trace_with_the_server_legs_under_the_client(
    exported: InMemorySpanExporter, caller: Caller, client: MemoryClient
) -> None:
    await remember(caller, "Daughter is named Maya")
    exported.clear()

    reply = await client.recall(
        pb.RecallRequest(scope=scope("alice"), query="what is her daughter called"), timeout=5.0
    )
    assert reply.items

    def complete(spans: list[ReadableSpan]) -> bool:
        return len(named(spans, RECALL)) == 2 and any(
            s.name.startswith("postgresql") for s in spans
        )

    spans = await spans_until(exported, complete)
    client_span = next(s for s in named(spans, RECALL) if s.kind is trace.SpanKind.CLIENT)
    server_span = next(s for s in named(spans, RECALL) if s.kind is trace.SpanKind.SERVER)
    assert client_span.context is not None and server_span.context is not None
    trace_id = client_span.context.trace_id
    # One trace: every span of the call carries the client's trace id.
    assert {s.context.trace_id for s in spans if s.context is not None} == {trace_id}
    assert server_span.parent is not None
    assert server_span.parent.span_id == client_span.context.span_id
    for leg in ("memsvc.admission.tenant", "memsvc.admission.read"):
        assert ancestors(named(spans, leg)[0], spans)[0] == RECALL
    lexical = named(spans, "memsvc.recall.lexical")
    dense = named(spans, "memsvc.recall.dense")
    assert len(lexical) == 1 and len(dense) == 1
    assert ancestors(lexical[0], spans) == [RECALL, RECALL]
    assert ancestors(dense[0], spans) == [RECALL, RECALL]
    embed = named(spans, "memsvc.embed")
    assert embed and ancestors(embed[0], spans)[0] == "memsvc.recall.dense"
    statements = [s for s in spans if s.name.startswith("postgresql")]
    assert statements
    # The legs' statements, and the API key's lookup (cached after a first call).
    assert {ancestors(s, spans)[0] for s in statements} <= {
        "memsvc.recall.lexical",
        "memsvc.recall.dense",
        "memsvc.auth",
    }
    # The statement's text, never its arguments (the query text is an argument).
    for s in statements:
        assert s.attributes is not None
        assert "daughter" not in str(s.attributes.get("db.statement", "")).lower()


async def test_a_callers_traceparent_makes_the_server_span_its_child(
    exported: InMemorySpanExporter, caller: Caller, traced_server: MemsvcServer
) -> None:
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{traced_server.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        await stub.Recall(
            pb.RecallRequest(scope=scope("alice"), query="anything"),
            metadata=(
                ("x-api-key", caller.key),
                ("traceparent", f"00-{trace_id}-{parent_id}-01"),
            ),
            timeout=5.0,
        )
        # A malformed one is ignored: the call is traced as a trace of its own.
        await stub.Recall(
            pb.RecallRequest(scope=scope("alice"), query="anything"),
            metadata=(("x-api-key", caller.key), ("traceparent", "00-not-a-trace-01")),
            timeout=5.0,
        )
    spans = await spans_until(exported, lambda s: len(named(s, RECALL)) == 2)
    first, second = sorted(named(spans, RECALL), key=lambda s: s.start_time or 0)
    assert first.context is not None and first.parent is not None
    assert format(first.context.trace_id, "032x") == trace_id
    assert format(first.parent.span_id, "016x") == parent_id
    assert second.parent is None and second.context is not None
    assert format(second.context.trace_id, "032x") != trace_id


async def test_the_extraction_job_links_to_the_ingest_that_created_it(
    exported: InMemorySpanExporter,
    client: MemoryClient,
    drain: Callable[[], Awaitable[int]],
) -> None:
    reply = await client.ingest(
        pb.IngestRequest(
            session_id="s1",
            scope=scope("alice"),
            messages=[message("I moved to Porto last year", sender_id="alice")],
        ),
        timeout=5.0,
    )
    assert await drain() >= 1
    spans = await spans_until(
        exported,
        lambda s: bool(named(s, "memsvc.extraction_job")) and len(named(s, INGEST)) == 2,
    )
    server_span = next(s for s in named(spans, INGEST) if s.kind is trace.SpanKind.SERVER)
    for write in ("memsvc.ingest.outbox_write", "memsvc.ingest.messages_write"):
        assert ancestors(named(spans, write)[0], spans)[0] == INGEST
    job = next(
        s
        for s in named(spans, "memsvc.extraction_job")
        if s.attributes is not None and s.attributes.get("ingest_id") == reply.ingest_id
    )
    assert server_span.context is not None and job.context is not None
    # Its own trace (it ran after the call ended), linked to the Ingest's server span.
    assert job.parent is None
    assert job.context.trace_id != server_span.context.trace_id
    assert [link.context.span_id for link in job.links] == [server_span.context.span_id]


async def test_with_tracing_off_nothing_is_traced(caller: Caller, server: MemsvcServer) -> None:
    assert not tracing.enabled()
    # One shared no-op for every span asked for: no OpenTelemetry object is made.
    assert tracing.span("memsvc.recall.lexical") is tracing.span("memsvc.embed")
    assert tracing.current_traceparent() is None
    assert tracing.server_span("/memsvc.v1.MemoryService/Recall", lambda: ()) is None
    reply = await caller.stub.Recall(pb.RecallRequest(scope=scope("alice"), query="anything"))
    assert reply.route


async def test_prefetch_traces_its_cache_and_its_build(
    exported: InMemorySpanExporter, caller: Caller, client: MemoryClient
) -> None:
    await remember(caller, "Daughter is named Maya")
    exported.clear()
    prefetch = "memsvc.v1.MemoryService/Prefetch"

    await client.prefetch(pb.PrefetchRequest(scope=scope("alice")), timeout=5.0)

    spans = await spans_until(
        exported,
        lambda s: len(named(s, prefetch)) == 2 and bool(named(s, "memsvc.prefetch.cache_put")),
    )
    # A miss: looked up, built, stored; the build's statements under the build.
    assert ancestors(named(spans, "memsvc.prefetch.cache_get")[0], spans)[0] == prefetch
    build = named(spans, "memsvc.prefetch.build")
    assert len(build) == 1
    assert ancestors(build[0], spans)[0] == prefetch
    assert ancestors(named(spans, "memsvc.prefetch.cache_put")[0], spans)[0] == (
        "memsvc.prefetch.build"
    )
    under_build = [
        s
        for s in spans
        if s.name.startswith("postgresql") and "memsvc.prefetch.build" in ancestors(s, spans)
    ]
    assert under_build


async def test_a_recall_stream_is_one_trace_with_its_work_ahead_under_it(
    exported: InMemorySpanExporter, caller: Caller, client: MemoryClient
) -> None:
    await remember(caller, "Daughter is named Maya")
    exported.clear()
    stream_rpc = "memsvc.v1.MemoryService/RecallStream"
    request = pb.RecallStreamRequest(scope=scope("alice"))
    async with client.recall_stream(request, final_timeout=5.0) as stream:
        await stream.interim("what is her daughter")
        await stream.interim("what is her daughter called")
        reply = await stream.final("what is her daughter called")
    assert reply.items

    spans = await spans_until(exported, lambda s: len(named(s, stream_rpc)) == 2)
    client_span = next(s for s in named(spans, stream_rpc) if s.kind is trace.SpanKind.CLIENT)
    server_span = next(s for s in named(spans, stream_rpc) if s.kind is trace.SpanKind.SERVER)
    assert client_span.context is not None and server_span.parent is not None
    assert server_span.parent.span_id == client_span.context.span_id
    assert {s.context.trace_id for s in spans if s.context is not None} == {
        client_span.context.trace_id
    }
    ahead = named(spans, "memsvc.recall_ahead")
    assert ahead and all(ancestors(s, spans)[0] == stream_rpc for s in ahead)
