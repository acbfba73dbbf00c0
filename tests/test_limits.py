"""Every request limit answers INVALID_ARGUMENT with a message naming what is too big, and
writes nothing: request size, unreadable bytes, counts per call, field lengths, top_k, page
size. Beyond twice the request size gRPC itself refuses, still with a clean status."""

from __future__ import annotations

import grpc
import pytest

from memsvc.config import ConfigError, Settings
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import msg
from tests.read_helpers import StartServer, stub_for
from tests.read_helpers import start_server as start_server  # fixture

ALICE = pb.Scope(user_id="alice")
SERVICE = "memsvc.v1.MemoryService"


async def _stored(caller: Caller) -> int:
    reply = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=ALICE, page_size=500))
    return len(reply.memories)


async def test_a_request_over_the_size_limit_is_invalid_argument(caller: Caller) -> None:
    """The default limit, 4 MiB, on the session's server."""
    request = pb.RememberRequest(scope=ALICE, content="x" * (4 * 1024 * 1024 + 10))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Remember(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == f"request: {request.ByteSize()} bytes, at most {4 * 1024 * 1024}"
    assert await _stored(caller) == 0


async def test_request_size_limit_and_the_transport_cap_beyond_it(
    start_server: StartServer, caller: Caller
) -> None:
    limit = 64 * 1024
    _, ch = await start_server(max_request_bytes=limit)
    stub = stub_for(ch, caller)
    # Just under: an ordinary request (its content then fails its own field limit).
    just_under = pb.RememberRequest(scope=ALICE, content="x" * (limit - 100))
    assert just_under.ByteSize() <= limit
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Remember(just_under)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith("content: at most")
    # Over the limit: refused before the servicer, with the size.
    over = pb.RememberRequest(scope=ALICE, content="x" * (limit + 10))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Remember(over)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == f"request: {over.ByteSize()} bytes, at most {limit}"
    # Past twice the limit gRPC drops it unread: RESOURCE_EXHAUSTED, never UNKNOWN.
    huge = pb.RememberRequest(scope=ALICE, content="x" * (2 * limit + 10))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Remember(huge)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in (err.value.details() or "")
    assert await _stored(caller) == 0


@pytest.mark.parametrize(
    "payload",
    [b"\xff\xff\xff\xff", b"\x0a\xff\xff\xff\x0f", b"\x08", b"\x12\x05ab"],
    ids=["garbage", "bad-length", "truncated-varint", "truncated-string"],
)
async def test_bytes_that_are_not_protobuf_are_invalid_argument(
    channel: grpc.aio.Channel, caller: Caller, payload: bytes
) -> None:
    for method in ("Remember", "Recall", "Ingest", "Forget"):
        call = channel.unary_unary(f"/{SERVICE}/{method}")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(payload, metadata=(("x-api-key", caller.key),), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
        assert (err.value.details() or "").startswith("request: not a valid protobuf")
    assert await _stored(caller) == 0


def _ingest(**fields: object) -> pb.IngestRequest:
    fields.setdefault("messages", [msg("alice", "hello")])
    return pb.IngestRequest(
        session_id="s1",
        scope=ALICE,
        idempotency_key="k1",
        **fields,  # type: ignore[arg-type]
    )


# (method, request, the field the message must start with)
LIMITS: list[tuple[str, object, str]] = [
    ("Remember", pb.RememberRequest(scope=ALICE, content="x" * 2001), "content"),
    ("Remember", pb.RememberRequest(scope=pb.Scope(user_id="u" * 129), content="x"), "scope"),
    (
        "Remember",
        pb.RememberRequest(scope=ALICE, content="x", source_message_ids=["m"] * 101),
        "source_message_ids",
    ),
    ("Forget", pb.ForgetRequest(scope=ALICE, memory_ids=["x"] * 1001), "memory_ids"),
    ("Ingest", _ingest(messages=[msg("alice", "x")] * 201), "messages"),
    ("Ingest", _ingest(messages=[msg("alice", "y" * 8001)]), "messages[0].text"),
    ("Ingest", _ingest(goals=["g"] * 21), "goals"),
    # Each message within its limit, the whole over one job's budget (64,000).
    ("Ingest", _ingest(messages=[msg("alice", "z" * 8000) for _ in range(9)]), "messages"),
    ("Recall", pb.RecallRequest(scope=ALICE, query="q" * 2001), "query"),
    ("Recall", pb.RecallRequest(scope=ALICE, query="q", top_k=101), "top_k"),
    ("Prefetch", pb.PrefetchRequest(scope=ALICE, hint="h" * 2001), "hint"),
    ("Prefetch", pb.PrefetchRequest(scope=ALICE, budget=pb.PacketBudget(chars=40_000)), "budget"),
    ("ListMemories", pb.ListMemoriesRequest(scope=ALICE, page_size=501), "page_size"),
]


@pytest.mark.parametrize(
    ("method", "request_", "field"), LIMITS, ids=[f"{m}-{f}" for m, _, f in LIMITS]
)
async def test_every_limit_is_invalid_argument_naming_the_field(
    caller: Caller, method: str, request_: object, field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await getattr(caller.stub, method)(request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details() or ""
    assert details.startswith(field), details
    assert any(word in details for word in ("at most", "between", "characters")), details
    assert await _stored(caller) == 0


def test_max_request_bytes_setting() -> None:
    assert Settings().max_request_bytes == 4 * 1024 * 1024
    assert Settings.from_env({"MEMSVC_MAX_REQUEST_BYTES": "65536"}).max_request_bytes == 65536
    with pytest.raises(ConfigError, match="MEMSVC_MAX_REQUEST_BYTES"):
        Settings.from_env({"MEMSVC_MAX_REQUEST_BYTES": "10"})
