"""Observability against the real server: /metrics over HTTP, per-RPC codes and latency
through the interceptor, request ids in and out, JSON log lines with the call's ids."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import socket
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from memsvc.config import ConfigError, Settings
from memsvc.observability import log_format, metrics
from memsvc.observability.metrics_http import MetricsEndpoint
from memsvc.server.app import MemsvcServer
from memsvc.server.interceptor import final_code, split_method
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import Caller
from tests.read_helpers import StartServer, stub_for
from tests.read_helpers import start_server as start_server  # fixture

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
SERVICE = "memsvc.v1.MemoryService"
OBSERVABILITY_DOC = Path(__file__).resolve().parent.parent / "docs/operations/observability.md"


def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.headers["Content-Type"], response.read().decode()


async def scrape(server: MemsvcServer) -> Samples:
    """Every sample the server's /metrics endpoint serves right now."""
    assert server.metrics_port, "the test server serves /metrics on a free port"
    status, _, text = await asyncio.to_thread(
        _get, f"http://127.0.0.1:{server.metrics_port}/metrics"
    )
    assert status == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def handled(samples: Samples, method: str, code: str) -> float:
    return value(
        samples,
        "memsvc_grpc_server_handled_total",
        grpc_service=SERVICE,
        grpc_method=method,
        grpc_code=code,
    )


def metric_names() -> list[str]:
    """The name of every metric memsvc defines."""
    names = []
    for obj in vars(metrics).values():
        if hasattr(obj, "_name") and hasattr(obj, "_type"):
            names.append(obj._name)
    return sorted(names)


# -- the endpoint --------------------------------------------------------------------------


async def test_metrics_endpoint_serves_every_memsvc_metric(server: MemsvcServer) -> None:
    status, content_type, text = await asyncio.to_thread(
        _get, f"http://127.0.0.1:{server.metrics_port}/metrics"
    )
    assert status == 200
    assert content_type.startswith("text/plain")
    served = {f.name for f in text_string_to_metric_families(text)}
    names = metric_names()
    assert len(names) >= 20
    assert set(names) <= served, set(names) - served


def test_the_observability_page_lists_every_metric() -> None:
    section = OBSERVABILITY_DOC.read_text()
    missing = [n for n in metric_names() if f"`{n}" not in section]
    assert missing == []


# -- per-RPC codes and latency -------------------------------------------------------------


async def test_each_rpc_is_counted_with_the_code_the_caller_got(
    server: MemsvcServer, channel: grpc.aio.Channel, caller: Caller
) -> None:
    before = await scrape(server)
    await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=pb.Scope(user_id="alice")))
    bad_calls: list[tuple[Any, grpc.StatusCode]] = [
        (  # validation
            caller.stub.ListMemories(pb.ListMemoriesRequest(scope=pb.Scope(user_id=""))),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (  # authentication: the interceptor sees calls the servicer refuses first
            memory_pb2_grpc.MemoryServiceStub(channel).ListMemories(
                pb.ListMemoriesRequest(scope=pb.Scope(user_id="alice")), timeout=10
            ),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
        (
            caller.stub.GetMemoryHistory(
                pb.GetMemoryHistoryRequest(
                    scope=pb.Scope(user_id="alice"), memory_id=str(uuid.uuid4())
                )
            ),
            grpc.StatusCode.NOT_FOUND,
        ),
    ]
    for call, code in bad_calls:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == code
    after = await scrape(server)

    def delta(method: str, code: str) -> float:
        return handled(after, method, code) - handled(before, method, code)

    assert delta("ListMemories", "OK") == 1
    assert delta("ListMemories", "INVALID_ARGUMENT") == 1
    assert delta("ListMemories", "UNAUTHENTICATED") == 1
    assert delta("GetMemoryHistory", "NOT_FOUND") == 1
    labels = {"grpc_service": SERVICE, "grpc_method": "ListMemories"}
    started = "memsvc_grpc_server_started_total"
    observed = "memsvc_grpc_server_handling_seconds_count"
    assert value(after, started, **labels) - value(before, started, **labels) == 3
    assert value(after, observed, **labels) - value(before, observed, **labels) == 3
    assert value(after, "memsvc_grpc_server_in_flight", **labels) == 0


async def test_latency_is_the_handlers_own_time(
    start_server: StartServer,
    caller: Caller,
) -> None:
    """Remember waits for an embedder slowed by 0.3 s: the histogram shows at least that, in
    a bucket above 0.25 s (a lower bound only: the sleep guarantees it)."""
    srv, ch = await start_server(slow_embedder_s=0.3)
    before = await scrape(srv)
    await stub_for(ch, caller).Remember(
        pb.RememberRequest(scope=pb.Scope(user_id="alice"), content="slow to embed")
    )
    after = await scrape(srv)
    labels = {"grpc_service": SERVICE, "grpc_method": "Remember"}
    name = "memsvc_grpc_server_handling_seconds"
    assert value(after, f"{name}_sum", **labels) - value(before, f"{name}_sum", **labels) >= 0.3
    fast = {**labels, "le": "0.25"}
    assert value(after, f"{name}_bucket", **fast) == value(before, f"{name}_bucket", **fast)
    embed = {"model": srv.runtime.embedder.model_id, "where": "write"}
    assert value(after, "memsvc_embedding_seconds_count", **embed) > value(
        before, "memsvc_embedding_seconds_count", **embed
    )


async def test_recall_and_prefetch_record_legs_cache_and_query_embeddings(
    server: MemsvcServer, caller: Caller
) -> None:
    scope = pb.Scope(user_id="alice")
    # A user with something stored: an empty one's packet is never cached.
    await caller.stub.Remember(pb.RememberRequest(scope=scope, content="Drinks green tea"))
    before = await scrape(server)
    await caller.stub.Recall(pb.RecallRequest(scope=scope, query=f"tea {uuid.uuid4().hex}"))
    await caller.stub.Prefetch(pb.PrefetchRequest(scope=scope))
    await caller.stub.Prefetch(pb.PrefetchRequest(scope=scope))
    after = await scrape(server)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    for stage in ("embed", "dense", "lexical", "total"):
        assert delta("memsvc_recall_stage_seconds_count", stage=stage) == 1, stage
    query = {"model": server.runtime.embedder.model_id, "where": "query"}
    assert delta("memsvc_embedding_texts_total", **query) == 1
    assert delta("memsvc_prefetch_cache_total", status="miss") == 1
    assert delta("memsvc_prefetch_cache_total", status="hit") == 1


async def test_malformed_requests_are_invalid_argument_and_counted(
    server: MemsvcServer, channel: grpc.aio.Channel
) -> None:
    before = await scrape(server)
    raw = channel.unary_unary(f"/{SERVICE}/Remember")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await raw(b"\xff\xff\xff\xff", timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "request: not a valid protobuf message for this method"
    after = await scrape(server)
    assert (
        handled(after, "Remember", "INVALID_ARGUMENT")
        - handled(before, "Remember", "INVALID_ARGUMENT")
        == 1
    )


async def test_unknown_methods_are_counted_without_their_name(
    server: MemsvcServer, channel: grpc.aio.Channel
) -> None:
    before = await scrape(server)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await channel.unary_unary(f"/{SERVICE}/NoSuchMethod{uuid.uuid4().hex}")(b"", timeout=10)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    after = await scrape(server)
    labels = {"grpc_service": "unknown", "grpc_method": "unknown", "grpc_code": "UNIMPLEMENTED"}
    name = "memsvc_grpc_server_handled_total"
    assert value(after, name, **labels) - value(before, name, **labels) == 1
    assert not any("NoSuchMethod" in str(key) for key in after)


def test_split_method() -> None:
    assert split_method("/memsvc.v1.MemoryService/Recall") == (SERVICE, "Recall")
    assert split_method("/grpc.health.v1.Health/Check") == ("grpc.health.v1.Health", "Check")
    assert split_method("garbage") == ("unknown", "unknown")


class _Context:
    def __init__(self, code: grpc.StatusCode | None, remaining: float | None) -> None:
        self._code, self._remaining = code, remaining

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def time_remaining(self) -> float | None:
        return self._remaining


def test_final_code_of_each_way_a_handler_ends() -> None:
    abort = grpc.aio.AbortError("locally aborted")
    ctx: Any = _Context(grpc.StatusCode.NOT_FOUND, 3.0)
    assert final_code(abort, ctx) == grpc.StatusCode.NOT_FOUND
    assert final_code(asyncio.CancelledError(), ctx) == grpc.StatusCode.CANCELLED
    late: Any = _Context(None, 0.0)
    assert final_code(asyncio.CancelledError(), late) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert final_code(ValueError("x"), ctx) == grpc.StatusCode.UNKNOWN


# -- request ids -----------------------------------------------------------------------------


def _request_id(trailing: Any) -> str:
    found = [v for k, v in trailing or () if k == "x-request-id"]
    assert len(found) == 1, trailing
    return str(found[0])


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("req-7f3a9c", True),
        ("r" * 128, True),
        ("r" * 129, False),
        ("has space", False),
        ("", False),
        (None, False),
    ],
)
async def test_request_id_is_echoed_or_replaced(
    caller: Caller, sent: str | None, kept: bool
) -> None:
    metadata = [("x-api-key", caller.key)]
    if sent is not None:
        metadata.append(("x-request-id", sent))
    call = caller.stub.ListMemories(
        pb.ListMemoriesRequest(scope=pb.Scope(user_id="alice")), metadata=tuple(metadata)
    )
    await call
    echoed = _request_id(await call.trailing_metadata())
    if kept:
        assert echoed == sent
    else:
        assert re.fullmatch(r"[0-9a-f]{32}", echoed)


async def test_request_id_comes_back_on_errors_too(channel: grpc.aio.Channel) -> None:
    stub = memory_pb2_grpc.MemoryServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListMemories(
            pb.ListMemoriesRequest(scope=pb.Scope(user_id="alice")),
            metadata=(("x-request-id", "unauth-1"),),
            timeout=10,
        )
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _request_id(err.value.trailing_metadata()) == "unauth-1"


# -- log lines -------------------------------------------------------------------------------


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """memsvc's loggers written as `--log-format json` writes them, into a buffer."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.addFilter(log_format.ContextFilter())
    handler.setFormatter(log_format.JsonFormatter())
    logger = logging.getLogger("memsvc")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield buffer
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def test_json_log_lines_carry_the_calls_ids(
    json_log: io.StringIO,
    start_server: StartServer,
    caller: Caller,
) -> None:
    """A refused call is logged by the servicer: the line names the request id the caller
    sent, the RPC and the tenant, and nothing else."""
    _, ch = await start_server(tenant_rate_per_s=0.001, tenant_burst=1)
    stub = stub_for(ch, caller)
    request = pb.ListMemoriesRequest(scope=pb.Scope(user_id="alice"))
    await stub.ListMemories(request)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListMemories(
            request, metadata=(("x-api-key", caller.key), ("x-request-id", "json-log-1"))
        )
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    lines = [orjson.loads(line) for line in json_log.getvalue().splitlines()]
    mine = [e for e in lines if e.get("request_id") == "json-log-1"]
    assert mine, lines
    entry = mine[-1]
    assert entry["msg"] == "ListMemories answered RESOURCE_EXHAUSTED"
    assert entry["rpc"] == f"{SERVICE}/ListMemories"
    assert entry["tenant"] == caller.tenant_id
    assert entry["level"] == "INFO"
    assert entry["logger"] == "memsvc.server.servicer"
    assert set(entry) == {"ts", "level", "logger", "msg", "request_id", "rpc", "tenant"}
    # Outside any call a line has no ids at all.
    logging.getLogger("memsvc.test").info("outside")
    last = orjson.loads(json_log.getvalue().splitlines()[-1])
    assert set(last) == {"ts", "level", "logger", "msg"}


def _record_with_exception(secret: str) -> logging.LogRecord:
    try:
        try:
            raise KeyError(secret)
        except KeyError as inner:
            raise RuntimeError(f"failed on row {secret!r}") from inner
    except RuntimeError:
        import sys

        return logging.LogRecord("memsvc.x", logging.ERROR, __file__, 1, "boom", (), sys.exc_info())


@pytest.mark.parametrize("formatter", [log_format.JsonFormatter(), log_format.TextFormatter()])
def test_exceptions_are_logged_without_their_message(formatter: logging.Formatter) -> None:
    secret = "my dog's name is Pixel-" + uuid.uuid4().hex
    record = _record_with_exception(secret)
    line = formatter.format(record)
    assert secret not in line
    assert "RuntimeError" in line and "KeyError" in line
    assert "_record_with_exception" in line  # the frames are kept
    assert record.exc_text is None  # nothing cached for another handler to print


@pytest.mark.parametrize("formatter", [log_format.JsonFormatter(), log_format.TextFormatter()])
def test_a_record_with_exc_info_false_is_formatted(formatter: logging.Formatter) -> None:
    """asyncio's default exception handler logs ``exc_info=False`` when it has no exception
    (asyncpg's "Resetting connection with an active transaction", after a database crash in
    bench/chaos.py): the line was lost to "--- Logging error --- TypeError: 'bool' object is
    not subscriptable"."""
    record = logging.LogRecord(
        "asyncio", logging.ERROR, __file__, 1, "Resetting connection", (), exc_info=False
    )
    line = formatter.format(record)
    assert "Resetting connection" in line


# -- settings and the endpoint's port ------------------------------------------------------


def test_metrics_and_log_settings_from_the_environment() -> None:
    defaults = Settings.from_env({})
    assert (defaults.metrics_host, defaults.metrics_port, defaults.log_format) == (
        "127.0.0.1",
        9464,
        "text",
    )
    assert Settings.from_env({"MEMSVC_METRICS_PORT": "off"}).metrics_port is None
    assert Settings.from_env({"MEMSVC_METRICS_PORT": "0"}).metrics_port == 0
    assert Settings.from_env({"MEMSVC_LOG_FORMAT": "json"}).log_format == "json"
    for env in (
        {"MEMSVC_METRICS_PORT": "70000"},
        {"MEMSVC_METRICS_PORT": "nine"},
        {"MEMSVC_LOG_FORMAT": "xml"},
    ):
        with pytest.raises(ConfigError, match=next(iter(env))):
            Settings.from_env(env)


async def test_a_taken_metrics_port_fails_or_moves() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match="MEMSVC_METRICS_PORT"):
            MetricsEndpoint().start("127.0.0.1", port)
        endpoint = MetricsEndpoint()
        moved = endpoint.start("127.0.0.1", port, any_port_if_taken=True)
        try:
            assert moved not in (0, port)
            status, _, text = await asyncio.to_thread(_get, f"http://127.0.0.1:{moved}/metrics")
            assert status == 200 and "memsvc_grpc_server_handled_total" in text
        finally:
            await endpoint.stop()
