"""Memory content and API keys never reach a log line or an error message.

A distinctive memory text and key go through every kind of call, succeeding and failing
(bad input, unknown id, wrong key, unreadable and oversized requests, the extraction
worker); everything logged at DEBUG, in either format, must hold neither.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable

import grpc
import pytest

from memsvc import log_format
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import Caller
from tests.ingest_helpers import msg

ALICE = pb.Scope(user_id="alice")
SERVICE = "memsvc.v1.MemoryService"


async def test_no_content_or_key_in_logs_or_errors(
    caplog: pytest.LogCaptureFixture,
    caller: Caller,
    channel: grpc.aio.Channel,
    drain: Callable[[], Awaitable[int]],
) -> None:
    marker = f"quokka{uuid.uuid4().hex[:12]}"
    content = f"My secret safe word is {marker}"
    wrong_key = f"msk_{uuid.uuid4().hex}wrongkey"
    caplog.set_level(logging.DEBUG)
    errors: list[str] = []

    async def failing(call: Awaitable[object], code: grpc.StatusCode) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == code
        errors.append(err.value.details() or "")
        errors.append(repr(err.value.trailing_metadata()))

    stub = caller.stub
    memory = (await stub.Remember(pb.RememberRequest(scope=ALICE, content=content))).memory
    await stub.Correct(
        pb.CorrectRequest(
            scope=ALICE, memory_id=memory.memory_id, new_content=f"{content} now", reason=marker
        )
    )
    await stub.Recall(pb.RecallRequest(scope=ALICE, query=content))
    await stub.Prefetch(pb.PrefetchRequest(scope=ALICE, hint=content, session_id="s1"))
    await stub.Ingest(
        pb.IngestRequest(
            session_id="s1",
            scope=ALICE,
            idempotency_key=marker,
            messages=[msg("alice", f"I love {marker} and I live in Lisbon")],
            goals=[f"remember {marker}"],
            end_of_session=True,
        )
    )
    assert await drain() >= 1
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    await failing(stub.Remember(pb.RememberRequest(scope=ALICE, content=content * 100)), invalid)
    await failing(stub.Remember(pb.RememberRequest(scope=ALICE, content=f"{content}\x00")), invalid)
    await failing(
        stub.Remember(pb.RememberRequest(scope=ALICE, content=content * 200_000)), invalid
    )
    await failing(
        stub.Correct(
            pb.CorrectRequest(scope=ALICE, memory_id=str(uuid.uuid4()), new_content=content)
        ),
        grpc.StatusCode.NOT_FOUND,
    )
    await failing(stub.Recall(pb.RecallRequest(scope=ALICE, query=content, top_k=1000)), invalid)
    await failing(
        channel.unary_unary(f"/{SERVICE}/Remember")(
            b"\x12\xff" + content.encode(), metadata=(("x-api-key", caller.key),), timeout=10
        ),
        invalid,
    )
    await failing(
        memory_pb2_grpc.MemoryServiceStub(channel).Remember(
            pb.RememberRequest(scope=ALICE, content=content),
            metadata=(("x-api-key", wrong_key),),
            timeout=10,
        ),
        grpc.StatusCode.UNAUTHENTICATED,
    )

    # The server's own lines are captured (it runs in this process): the refusal is there.
    assert any(r.getMessage() == "Remember answered UNAUTHENTICATED" for r in caplog.records)
    json_lines = log_format.JsonFormatter()
    text_lines = log_format.TextFormatter()
    everything = [caplog.text, *errors]
    for record in caplog.records:
        everything += [json_lines.format(record), text_lines.format(record)]
    for secret in (marker, caller.key, wrong_key):
        leaks = [line for line in everything if secret in line]
        assert leaks == [], secret
