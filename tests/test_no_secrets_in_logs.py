"""Memory content and API keys never reach a log line or an error message.

A distinctive memory text and key go through every kind of call, succeeding and failing
(bad input, unknown id, wrong key, unreadable and oversized requests, the extraction
worker); everything logged at DEBUG, in either format, must hold neither. The same for
personal data the PII screen redacted or rejected.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from prometheus_client import REGISTRY

from memsvc.observability import log_format
from memsvc.server.app import MemsvcServer
from memsvc.storage import tenant_settings
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import Caller
from tests.ingest_helpers import msg

ALICE = pb.Scope(user_id="alice")
SERVICE = "memsvc.v1.MemoryService"


def _auth_failures() -> float:
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "memsvc_auth_failures"
        for sample in metric.samples
        if sample.name == "memsvc_auth_failures_total"
    )


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
    refused_before = _auth_failures()
    await failing(
        memory_pb2_grpc.MemoryServiceStub(channel).Remember(
            pb.RememberRequest(scope=ALICE, content=content),
            metadata=(("x-api-key", wrong_key),),
            timeout=10,
        ),
        grpc.StatusCode.UNAUTHENTICATED,
    )

    # The refusal is counted (and summarized in the log at most every 10 s, auth_log.py).
    assert _auth_failures() == refused_before + 1
    json_lines = log_format.JsonFormatter()
    text_lines = log_format.TextFormatter()
    everything = [caplog.text, *errors]
    for record in caplog.records:
        everything += [json_lines.format(record), text_lines.format(record)]
    for secret in (marker, caller.key, wrong_key):
        leaks = [line for line in everything if secret in line]
        assert leaks == [], secret


async def test_screened_personal_data_never_reaches_a_log_or_an_error(
    caplog: pytest.LogCaptureFixture,
    caller: Caller,
    server: MemsvcServer,
    pool: asyncpg.Pool,
    drain: Callable[[], Awaitable[int]],
) -> None:
    """Redacted and rejected values appear nowhere: the screen logs kinds and counts only."""
    card, email, phone = "4539 1488 0343 6467", "quokka.pii@example.org", "(415) 555-0187"
    await tenant_settings.save(
        pool, caller.tenant_id, pii_policy={"card_number": "reject", "phone": "redact"}
    )
    server.runtime.policies.forget(caller.tenant_id)
    caplog.set_level(logging.DEBUG)
    stub = caller.stub
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Remember(pb.RememberRequest(scope=ALICE, content=f"My card is {card}"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    errors = [err.value.details() or "", repr(err.value.trailing_metadata())]
    memory = (await stub.Remember(pb.RememberRequest(scope=ALICE, content=f"Mail {email}"))).memory
    await stub.Correct(
        pb.CorrectRequest(
            scope=ALICE, memory_id=memory.memory_id, new_content=f"Call {phone}", reason=email
        )
    )
    await stub.Ingest(
        pb.IngestRequest(
            session_id="s-pii",
            scope=ALICE,
            idempotency_key=uuid.uuid4().hex,
            messages=[
                msg("alice", f"Remember that my card number is {card}"),
                msg("alice", f"I want to call my mom at {phone}"),
            ],
            end_of_session=True,
        )
    )
    assert await drain() >= 1
    screened = [r.getMessage() for r in caplog.records if r.name == "memsvc.governance.guard"]
    assert any("card_number reject" in line for line in screened), screened
    everything = [caplog.text, *errors]
    for record in caplog.records:
        everything += [log_format.JsonFormatter().format(record)]
    for secret in (card, card.replace(" ", ""), email, phone):
        assert [line for line in everything if secret in line] == [], secret


async def test_errors_never_echo_the_callers_field_values(
    caplog: pytest.LogCaptureFixture, caller: Caller
) -> None:
    """Issue 31: `Remember{category: "4111111111111111 123-45-6789"}` answered `unknown
    value '4111111111111111 123-45-6789'`; memory_id, ingest_id and other errors did the
    same. An error names the field and the rule; the caller's value is in neither the answer
    nor the server's log."""
    mark = f"zqmark{uuid.uuid4().hex[:10]}"
    card_and_ssn = f"4111111111111111 123-45-6789 {mark}"
    ids = [str(uuid.uuid4()) for _ in range(6)]
    enum_value = 987_654_321
    caplog.set_level(logging.DEBUG)
    stub = caller.stub
    errors: list[str] = []
    C = grpc.StatusCode

    async def failing(call: Awaitable[object], code: grpc.StatusCode) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == code, err.value.details()
        errors.append(err.value.details() or "")
        errors.append(repr(err.value.trailing_metadata()))

    def remember(**fields: object) -> Awaitable[object]:
        return stub.Remember(pb.RememberRequest(scope=ALICE, content="x", **fields))  # type: ignore[arg-type]

    await failing(remember(category=card_and_ssn), C.INVALID_ARGUMENT)
    await failing(remember(role=mark), C.INVALID_ARGUMENT)
    await failing(remember(retention_policy=enum_value), C.INVALID_ARGUMENT)
    await failing(
        stub.Remember(pb.RememberRequest(scope=pb.Scope(user_id=f"{mark}\x07"), content="x")),
        C.INVALID_ARGUMENT,
    )
    await failing(
        stub.Correct(pb.CorrectRequest(scope=ALICE, memory_id=mark, new_content="y")),
        C.INVALID_ARGUMENT,
    )
    await failing(
        stub.Correct(pb.CorrectRequest(scope=ALICE, memory_id=ids[0], new_content="y")),
        C.NOT_FOUND,
    )
    await failing(stub.GetMemory(pb.GetMemoryRequest(scope=ALICE, memory_id=ids[1])), C.NOT_FOUND)
    await failing(
        stub.GetMemoryHistory(pb.GetMemoryHistoryRequest(scope=ALICE, memory_id=ids[2])),
        C.NOT_FOUND,
    )
    await failing(stub.Forget(pb.ForgetRequest(scope=ALICE, memory_ids=[ids[3]])), C.NOT_FOUND)
    await failing(
        stub.GetIngestStatus(pb.GetIngestStatusRequest(scope=ALICE, ingest_id=mark)),
        C.INVALID_ARGUMENT,
    )
    await failing(
        stub.GetIngestStatus(pb.GetIngestStatusRequest(scope=ALICE, ingest_id=ids[4])),
        C.NOT_FOUND,
    )
    await failing(
        stub.ForgetSession(pb.ForgetSessionRequest(scope=ALICE, session_id=mark)), C.NOT_FOUND
    )
    await failing(
        stub.UpdateMemory(
            pb.UpdateMemoryRequest(
                scope=ALICE, memory_id=ids[5], update_mask=FieldMask(paths=[mark]), reason="r"
            )
        ),
        C.INVALID_ARGUMENT,
    )
    await failing(
        stub.UpdateCoreBlock(
            pb.UpdateCoreBlockRequest(
                scope=ALICE,
                block=pb.CORE_BLOCK_KIND_HUMAN,
                mode=pb.CORE_BLOCK_MODE_REPLACE,
                text="t",
                author=f"{mark} !",
            )
        ),
        C.INVALID_ARGUMENT,
    )
    await failing(
        stub.UpdateCoreBlock(
            pb.UpdateCoreBlockRequest(scope=ALICE, block=enum_value, mode=1, text="t")  # type: ignore[arg-type]
        ),
        C.INVALID_ARGUMENT,
    )
    await failing(
        stub.Recall(pb.RecallRequest(scope=ALICE, query="q", mode=enum_value)),  # type: ignore[arg-type]
        C.INVALID_ARGUMENT,
    )
    await failing(
        stub.ListMemories(pb.ListMemoriesRequest(scope=ALICE, page_token=mark)), C.INVALID_ARGUMENT
    )
    await failing(
        stub.ListMemories(
            pb.ListMemoriesRequest(scope=ALICE, filters=pb.MemoryFilters(categories=[mark]))
        ),
        C.INVALID_ARGUMENT,
    )
    twice = [msg("alice", "a", message_id=mark), msg("alice", "b", message_id=mark)]
    await failing(
        stub.Ingest(
            pb.IngestRequest(scope=ALICE, session_id="s", idempotency_key="k", messages=twice)
        ),
        C.INVALID_ARGUMENT,
    )
    first = [msg("alice", "I live in Lisbon")]
    await stub.Ingest(
        pb.IngestRequest(scope=ALICE, session_id="s", idempotency_key=mark, messages=first)
    )
    await failing(
        stub.Ingest(
            pb.IngestRequest(
                scope=ALICE,
                session_id="s",
                idempotency_key=mark,
                messages=[msg("alice", "I live in Porto")],
            )
        ),
        C.ALREADY_EXISTS,
    )

    everything = [caplog.text, *errors]
    for record in caplog.records:
        everything += [log_format.JsonFormatter().format(record)]
    for value in (mark, "4111111111111111", "123-45-6789", *ids, str(enum_value)):
        leaks = [line for line in everything if value in line]
        assert leaks == [], (value, leaks)
