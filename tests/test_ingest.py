"""Ingest, the online part: two writes, idempotency keys, re-sent messages, status, bad input."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import ASSISTANT, ingest, msg, status


async def table_counts(pool, tenant: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    async with pool.acquire() as conn:
        return {
            t: await conn.fetchval(f"SELECT count(*) FROM {t} WHERE tenant_id = $1", tenant)
            for t in ("messages", "ingest_outbox", "memories", "episodes", "topics")
        }


async def test_ingest_stores_messages_and_one_job_only(caller: Caller, pool) -> None:  # type: ignore[no-untyped-def]
    reply = await ingest(
        caller, [msg("alice", "I live in Lisbon"), msg("agent-1", "Noted!", ASSISTANT)]
    )
    assert (reply.accepted, reply.dropped, reply.duplicate) == (2, 0, False)
    uuid.UUID(reply.ingest_id)
    counts = await table_counts(pool, caller.tenant_id)
    # The online path wrote messages and one outbox row; extraction has not run.
    assert counts == {"messages": 2, "ingest_outbox": 1, "memories": 0, "episodes": 0, "topics": 0}
    async with pool.acquire() as conn:
        states = await conn.fetch(
            "SELECT embedding_state FROM messages WHERE tenant_id = $1", caller.tenant_id
        )
    assert {r["embedding_state"] for r in states} == {"missing"}
    got = await status(caller, reply.ingest_id)
    assert got.state == pb.INGEST_STATE_PENDING and got.attempts == 0
    assert got.session_id == "s1"


async def test_repeated_key_returns_the_first_id_and_writes_nothing(caller: Caller, pool) -> None:  # type: ignore[no-untyped-def]
    sent = [msg("alice", "hello there", message_id="a1")]
    first = await ingest(caller, sent, key="k-1")
    again = await ingest(caller, sent, key="k-1")  # a retry: the same request
    assert again.duplicate and again.ingest_id == first.ingest_id
    assert (again.accepted, again.dropped) == (0, 0)
    counts = await table_counts(pool, caller.tenant_id)
    assert counts["messages"] == 1 and counts["ingest_outbox"] == 1


async def test_a_key_is_per_user_and_another_users_key_never_drops_messages(
    caller: Caller,
    pool,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 31: user B's Ingest with the key user A used answered A's ingest_id with
    duplicate=true, and B's message was never stored (one node kept keys per tenant)."""
    a = await ingest(caller, [msg("alice", "I live in Lisbon", message_id="a1")], key="call-1")
    b = await ingest(
        caller, [msg("bob", "I live in Porto", message_id="b1")], user="bob", key="call-1"
    )
    assert not b.duplicate and b.ingest_id != a.ingest_id and b.accepted == 1
    got = await caller.stub.GetIngestStatus(
        pb.GetIngestStatusRequest(ingest_id=b.ingest_id, scope=pb.Scope(user_id="bob"))
    )
    assert got.session_id == "s1"
    async with pool.acquire() as conn:
        users = await conn.fetch(
            "SELECT user_id, count(*) AS n FROM messages WHERE tenant_id = $1 GROUP BY 1",
            caller.tenant_id,
        )
    assert {r["user_id"]: r["n"] for r in users} == {"alice": 1, "bob": 1}


@pytest.mark.parametrize(
    "change",
    [
        {"messages": [msg("alice", "a different message", message_id="a2")]},
        {"session": "s2"},
        {"persona": "coach"},
        {"agent": "agent-7"},
        {"goals": ["run a marathon"]},
        {"end_of_session": True},
    ],
    ids=["messages", "session", "persona", "agent", "goals", "end_of_session"],
)
async def test_a_key_reused_for_a_different_request_is_already_exists(
    caller: Caller,
    pool,  # type: ignore[no-untyped-def]
    change: dict[str, object],
) -> None:
    """Issue 31: a key reused with a different scope or messages answered duplicate=true
    with the first ingest; now ALREADY_EXISTS naming the key (not its value), nothing written."""
    sent = [msg("alice", "hello there", message_id="a1")]
    await ingest(caller, sent, key="secret-key-value-17")
    before = await table_counts(pool, caller.tenant_id)
    fields: dict[str, object] = {"messages": sent, **change}
    messages = fields.pop("messages")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ingest(caller, messages, key="secret-key-value-17", **fields)  # type: ignore[arg-type]
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    details = err.value.details() or ""
    assert "idempotency_key" in details and "secret-key-value-17" not in details
    assert await table_counts(pool, caller.tenant_id) == before


async def test_resent_messages_are_dropped_not_duplicated(caller: Caller, pool) -> None:  # type: ignore[no-untyped-def]
    await ingest(
        caller, [msg("alice", "one", message_id="x1"), msg("alice", "two", message_id="x2")]
    )
    reply = await ingest(
        caller,
        [msg("alice", "two", message_id="x2"), msg("alice", "three", message_id="x3")],
    )
    assert (reply.accepted, reply.dropped) == (1, 1)
    assert (await table_counts(pool, caller.tenant_id))["messages"] == 3
    # The same message id in another session is another message.
    other = await ingest(caller, [msg("alice", "one", message_id="x1")], session="s2")
    assert other.accepted == 1


async def test_status_is_scoped_to_the_tenant_and_scope(new_caller) -> None:  # type: ignore[no-untyped-def]
    a: Caller = await new_caller()
    b: Caller = await new_caller()
    reply = await ingest(a, [msg("alice", "I like tea")])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await status(b, reply.ingest_id)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await a.stub.GetIngestStatus(
            pb.GetIngestStatusRequest(ingest_id=reply.ingest_id, scope=pb.Scope(user_id="bob"))
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    ok = await a.stub.GetIngestStatus(
        pb.GetIngestStatusRequest(ingest_id=reply.ingest_id, scope=pb.Scope(user_id="alice"))
    )
    assert ok.ingest_id == reply.ingest_id
    for bad in ("", "nope"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await status(a, bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def _request(**overrides: object) -> pb.IngestRequest:
    fields: dict[str, object] = {
        "scope": pb.Scope(user_id="alice"),
        "session_id": "s1",
        "idempotency_key": "k",
        "messages": [msg("alice", "hello")],
    }
    fields.update(overrides)
    return pb.IngestRequest(**fields)  # type: ignore[arg-type]


BAD = [
    (_request(scope=None), "scope"),
    (_request(session_id=""), "session_id"),
    (_request(idempotency_key=""), "idempotency_key"),
    (_request(idempotency_key="k" * 201), "idempotency_key"),
    (_request(messages=[]), "messages"),
    (_request(messages=[msg("alice", "x")] * 201), "messages"),
    (
        _request(messages=[pb.Message(message_id="m", sender_id="alice", role=1, text="x")]),
        "messages[0].sent_at",
    ),
    # Issue 31: sent_at follows valid_from's bounds (a message from 2099 is a unit mistake).
    (
        _request(
            messages=[
                pb.Message(
                    message_id="m",
                    sender_id="alice",
                    role=1,
                    text="x",
                    sent_at=Timestamp(seconds=int(datetime(2099, 1, 1, tzinfo=UTC).timestamp())),
                )
            ]
        ),
        "messages[0].sent_at",
    ),
    (_request(messages=[msg("alice", "x", role=0)]), "messages[0].role"),
    (_request(messages=[msg("alice", "   ")]), "messages[0].text"),
    (_request(messages=[msg("alice", "y" * 8001)]), "messages[0].text"),
    (_request(messages=[msg("alice", "bad \x00 byte")]), "messages[0].text"),
    (_request(messages=[msg("", "no sender")]), "messages[0].sender_id"),
    (
        _request(messages=[msg("alice", "a", message_id="d"), msg("alice", "b", message_id="d")]),
        "messages[1].message_id",
    ),
    (
        _request(
            messages=[
                pb.Message(sender_id="alice", role=1, text="x", sent_at=msg("a", "b").sent_at)
            ]
        ),
        "messages[0].message_id",
    ),
    (_request(goals=[""]), "goals"),
    (_request(goals=["g" * 301]), "goals[0]"),
    (
        _request(
            scope=pb.Scope(user_id="alice", persona_id="nova"), counterpart_persona_id="other"
        ),
        "counterpart_persona_id",
    ),
]


@pytest.mark.parametrize(("request_", "field"), BAD)
async def test_bad_ingest_is_invalid_and_writes_nothing(
    caller: Caller,
    pool,
    request_: pb.IngestRequest,
    field: str,  # type: ignore[no-untyped-def]
) -> None:
    if not request_.HasField("scope") and field == "scope":
        request_.ClearField("scope")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Ingest(request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(field)
    assert (await table_counts(pool, caller.tenant_id))["ingest_outbox"] == 0
    assert (await table_counts(pool, caller.tenant_id))["messages"] == 0


async def test_goals_alone_are_accepted(caller: Caller) -> None:
    reply = await ingest(caller, [], goals=["Book a flight to Tokyo"], end_of_session=True)
    assert reply.accepted == 0 and not reply.duplicate
