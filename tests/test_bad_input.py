"""Bad input gets INVALID_ARGUMENT or NOT_FOUND with a clear message, and writes nothing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.test_explicit_memory import list_all, remember, scope

_NOW = datetime.now(UTC)


def _stamp(when: datetime) -> Timestamp:
    return Timestamp(seconds=int(when.timestamp()))


BAD_REMEMBER = [
    ({"scope": scope(), "content": ""}, "content"),
    ({"scope": scope(), "content": "   \n  "}, "content"),
    ({"scope": scope(), "content": "x" * 2001}, "content"),
    ({"scope": scope(), "content": "nul \x00 inside"}, "content"),
    ({"content": "no scope"}, "scope"),
    ({"scope": pb.Scope(user_id=""), "content": "empty user"}, "scope.user_id"),
    ({"scope": pb.Scope(user_id="u" * 129), "content": "long user"}, "scope.user_id"),
    ({"scope": pb.Scope(user_id=" alice"), "content": "padded user"}, "scope.user_id"),
    ({"scope": pb.Scope(user_id="al\x07ice"), "content": "control"}, "scope.user_id"),
    (
        {"scope": pb.Scope(user_id="alice", persona_id="p" * 200), "content": "x"},
        "scope.persona_id",
    ),
    ({"scope": scope(), "content": "x", "category": "gossip"}, "category"),
    ({"scope": scope(), "content": "x", "role": "boss"}, "role"),
    ({"scope": scope(), "content": "x", "confidence": 1.5}, "confidence"),
    ({"scope": scope(), "content": "x", "confidence": -0.1}, "confidence"),
    ({"scope": scope(), "content": "x", "confidence": float("nan")}, "confidence"),
    ({"scope": scope(), "content": "x", "source_message_ids": ["m"] * 101}, "source_message_ids"),
    ({"scope": scope(), "content": "x", "source_message_ids": [""]}, "source_message_ids[0]"),
    ({"scope": scope(), "content": "x", "subject": "s" * 201}, "subject"),
    ({"scope": scope(), "content": "x", "valid_from": Timestamp(seconds=-(10**11))}, "valid_from"),
    # A triple is all three parts or none.
    ({"scope": scope(), "content": "x", "subject": "user"}, "predicate"),
    ({"scope": scope(), "content": "x", "predicate": "lives_in"}, "subject"),
    ({"scope": scope(), "content": "x", "object": "Lisbon"}, "subject"),
    ({"scope": scope(), "content": "x", "subject": "user", "predicate": "lives_in"}, "object"),
    ({"scope": scope(), "content": "x", "subject": "user", "object": "Lisbon"}, "predicate"),
    (
        {"scope": scope(), "content": "x", "subject": "user", "predicate": "  ", "object": "L"},
        "predicate",
    ),
    # A fact that begins to hold in 2100 is a plan, not a current memory.
    (
        {"scope": scope(), "content": "x", "valid_from": _stamp(datetime(2100, 1, 1, tzinfo=UTC))},
        "valid_from",
    ),
    (
        {"scope": scope(), "content": "x", "valid_from": _stamp(_NOW + timedelta(days=2))},
        "valid_from",
    ),
]


@pytest.mark.parametrize(("fields", "field_name"), BAD_REMEMBER)
async def test_bad_remember_is_invalid_and_writes_nothing(
    caller: Caller, fields: dict[str, object], field_name: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Remember(pb.RememberRequest(**fields))  # type: ignore[arg-type]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(field_name)
    assert await list_all(caller) == []
    assert await list_all(caller, pb.Scope(user_id="alice", persona_id="p" * 10)) == []


async def test_a_partial_triple_names_what_is_missing(caller: Caller) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Remember(
            pb.RememberRequest(scope=scope(), content="Lives in Lisbon", subject="user")
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details() or ""
    assert "all three or none" in details
    assert "got subject without predicate, object" in details


async def test_valid_from_in_the_past_or_within_a_day_of_now_is_kept(caller: Caller) -> None:
    """The bounds are inclusive of real uses: a 1901 birth date, and a client clock a bit ahead."""
    for when in (datetime(1901, 5, 1, tzinfo=UTC), datetime.now(UTC) + timedelta(hours=12)):
        reply = await remember(caller, f"held since {when.year}", valid_from=_stamp(when))
        assert reply.memory.valid_from.seconds == _stamp(when).seconds
        assert reply.memory.status == pb.MEMORY_STATUS_ACTIVE
    reply = await remember(
        caller, "Lives in Lisbon", subject="user", predicate="lives_in", object="Lisbon"
    )
    assert (reply.memory.subject, reply.memory.predicate, reply.memory.object) == (
        "user",
        "lives_in",
        "Lisbon",
    )


async def test_bad_ids_and_missing_ones(caller: Caller) -> None:
    m = (await remember(caller, "a fact")).memory
    cases = [
        (
            pb.CorrectRequest(scope=scope(), memory_id="not-a-uuid", new_content="y"),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            pb.CorrectRequest(scope=scope(), memory_id="", new_content="y"),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            pb.CorrectRequest(scope=scope(), memory_id=m.memory_id, new_content=""),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            pb.CorrectRequest(
                scope=scope(), memory_id=m.memory_id, new_content="y", reason="r" * 501
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            pb.CorrectRequest(memory_id=m.memory_id, new_content="y"),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            pb.CorrectRequest(scope=scope(), memory_id=str(uuid.uuid4()), new_content="y"),
            grpc.StatusCode.NOT_FOUND,
        ),
    ]
    for request, code in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await caller.stub.Correct(request)
        assert err.value.code() == code, request
        assert err.value.details()
    for request_h, code in [
        (
            pb.GetMemoryHistoryRequest(scope=scope(), memory_id="zzz"),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            pb.GetMemoryHistoryRequest(scope=scope(), memory_id=str(uuid.uuid4())),
            grpc.StatusCode.NOT_FOUND,
        ),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await caller.stub.GetMemoryHistory(request_h)
        assert err.value.code() == code
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Forget(pb.ForgetRequest(scope=scope(), memory_ids=["nope"]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    [only] = await list_all(caller, include_superseded=True)
    assert only.content == "a fact" and only.memory_id == m.memory_id


@pytest.mark.parametrize(
    "request_",
    [
        pb.ListMemoriesRequest(scope=scope(), page_size=-1),
        pb.ListMemoriesRequest(scope=scope(), page_size=501),
        pb.ListMemoriesRequest(scope=scope(), page_token="garbage!!"),
        pb.ListMemoriesRequest(scope=scope(), filters=pb.MemoryFilters(categories=["nope"])),
        pb.ListMemoriesRequest(scope=scope(), filters=pb.MemoryFilters(roles=["nope"])),
        pb.ListMemoriesRequest(),
    ],
)
async def test_bad_list_requests(caller: Caller, request_: pb.ListMemoriesRequest) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.ListMemories(request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_unicode_of_every_script_is_stored_verbatim(caller: Caller) -> None:
    texts = [
        "我住在新加坡",
        "私はベジタリアンです",
        "Я живу в Москве",
        "أنا نباتي",
        "🙂 emoji ok",
        "x" * 2000,
    ]
    for text in texts:
        await remember(caller, text)
    assert {m.content for m in await list_all(caller)} == set(texts)
