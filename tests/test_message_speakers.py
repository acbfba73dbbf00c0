"""Messages carry their speaker's name: embedded and indexed as `{name} said, "{text}"`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import grpc
import numpy as np
import pytest

from memsvc.embedding import Embedder
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.read_helpers import pscope, recall
from tests.test_import import export_lines, import_error, import_lines

DENSE, LEXICAL = pb.RECALL_MODE_DENSE, pb.RECALL_MODE_LEXICAL
MESSAGE = pb.ITEM_TYPE_MESSAGE
START = datetime(2026, 5, 8, 13, 56, tzinfo=UTC)


def turn(i: int, text: str, sender_id: str, sender_name: str = "") -> pb.Message:
    message = pb.Message(
        message_id=f"m{i}",
        sender_id=sender_id,
        sender_name=sender_name,
        role=pb.MESSAGE_ROLE_USER,
        text=text,
    )
    message.sent_at.FromDatetime(START + timedelta(seconds=i))
    return message


async def ingest(caller: Caller, messages: list[pb.Message], user: str = "owner") -> None:
    await caller.stub.Ingest(
        pb.IngestRequest(
            scope=pscope(user),
            session_id="s1",
            messages=messages,
            end_of_session=True,
            idempotency_key=f"k-{user}",
        )
    )


async def stored(pool: asyncpg.Pool, tenant: str, user: str = "owner") -> dict[str, Any]:
    rows = await pool.fetch(
        "SELECT message_id, sender_name, embedding, embedding_state,"
        " context_tsv::text AS context FROM messages WHERE tenant_id = $1 AND user_id = $2",
        tenant,
        user,
    )
    return {r["message_id"]: r for r in rows}


async def test_the_unit_names_the_speaker(
    caller: Caller, pool: asyncpg.Pool, embedder: Embedder, drain: Callable[[], Awaitable[int]]
) -> None:
    """sender_name first, else a sender_id made of letters; an opaque id names nobody."""
    texts = ["I adopted a puppy", "What breed is it?", "A beagle, she loves walks"]
    await ingest(
        caller,
        [
            turn(0, texts[0], "caller-x", "Caroline"),
            turn(1, texts[1], "Melanie"),
            turn(2, texts[2], "u_81f3"),
        ],
    )
    assert await drain() >= 1
    rows = await stored(pool, caller.tenant_id)
    assert [rows[f"m{i}"]["sender_name"] for i in range(3)] == ["Caroline", "", ""]
    units = [f'Caroline said, "{texts[0]}"', f'Melanie said, "{texts[1]}"', texts[2]]
    vectors = await embedder.embed(units)
    for i in range(3):
        row = rows[f"m{i}"]
        assert row["embedding_state"] == "ok"
        assert np.allclose(row["embedding"].to_numpy(), vectors[i], atol=1e-5), units[i]
    # The context index holds the names (own unit A, the neighbours' B), and no date.
    assert "'carolin':" in rows["m0"]["context"] and "'melani':" in rows["m0"]["context"]
    assert "'2026'" not in rows["m0"]["context"] and "'may'" not in rows["m0"]["context"]
    reply = await recall(caller, "Caroline", scope=pscope("owner"), types=[MESSAGE], mode=LEXICAL)
    assert reply.items[0].id == "m0"
    assert reply.items[0].sender_name == "Caroline" and reply.items[0].sender_id == "caller-x"
    assert reply.items[0].text == texts[0]


async def test_a_question_naming_the_speaker_finds_what_they_said(
    caller: Caller, new_caller: Callable[[], Awaitable[Caller]], drain: Callable[[], Awaitable[int]]
) -> None:
    """Two people say nearly the same; the question names one of them. With names the dense
    leg ranks hers first; with opaque ids it cannot tell them apart."""
    said = [
        ("Caroline", "I went hiking in the mountains last weekend."),
        ("Melanie", "I went hiking in the hills last weekend."),
    ]
    await ingest(caller, [turn(i, t, f"p-{i}", name) for i, (name, t) in enumerate(said)])
    anonymous = await new_caller()
    await ingest(anonymous, [turn(i, t, f"p-{i}") for i, (_, t) in enumerate(said)])
    assert await drain() >= 2
    for name, expected in (("Melanie", "m1"), ("Caroline", "m0")):
        question = f"Where did {name} go hiking?"
        named = await recall(caller, question, scope=pscope("owner"), types=[MESSAGE], mode=DENSE)
        assert named.items[0].id == expected
        margin = named.items[0].relevance - named.items[1].relevance
        blind = await recall(
            anonymous, question, scope=pscope("owner"), types=[MESSAGE], mode=DENSE
        )
        blind_margin = abs(blind.items[0].relevance - blind.items[1].relevance)
        assert margin > blind_margin


@pytest.mark.parametrize(
    ("name", "problem"),
    [("x" * 129, "at most 128 characters"), ("Caro\x07line", "control characters")],
)
async def test_a_bad_sender_name_is_refused_and_nothing_is_written(
    caller: Caller, pool: asyncpg.Pool, name: str, problem: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await ingest(caller, [turn(0, "hello", "caller-x", name)])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "messages[0].sender_name" in (err.value.details() or "")
    assert problem in (err.value.details() or "")
    assert await stored(pool, caller.tenant_id) == {}


async def test_export_and_import_keep_the_name(
    caller: Caller, pool: asyncpg.Pool, embedder: Embedder, drain: Callable[[], Awaitable[int]]
) -> None:
    await ingest(caller, [turn(0, "I adopted a puppy", "caller-x", "Caroline")])
    assert await drain() >= 1
    lines = await export_lines(caller.stub, pscope("owner"))
    assert any('"sender_name":"Caroline"' in line for line in lines)
    reply = await import_lines(caller.stub, pscope("copy"), lines, keep=False)
    assert reply.messages.imported == 1
    rows = await stored(pool, caller.tenant_id, "copy")
    assert rows["m0"]["sender_name"] == "Caroline"
    [vector] = await embedder.embed(['Caroline said, "I adopted a puppy"'])
    assert np.allclose(rows["m0"]["embedding"].to_numpy(), vector, atol=1e-5)


async def test_a_name_is_screened_like_the_text(caller: Caller, pool: asyncpg.Pool) -> None:
    """The name is embedded and indexed with the text: personal data in it is redacted too."""
    reply = await caller.stub.Ingest(
        pb.IngestRequest(
            scope=pscope("owner"),
            session_id="s1",
            messages=[turn(0, "hello there", "caller-x", "jane.doe@example.com")],
            idempotency_key="k-pii",
        )
    )
    assert reply.redacted == 1
    rows = await stored(pool, caller.tenant_id)
    assert "example.com" not in rows["m0"]["sender_name"]
    assert rows["m0"]["sender_name"].startswith("[redacted")


async def test_an_imported_name_with_control_characters_is_refused(
    caller: Caller, drain: Callable[[], Awaitable[int]]
) -> None:
    await ingest(caller, [turn(0, "I adopted a puppy", "caller-x", "Caroline")])
    assert await drain() >= 1
    lines = await export_lines(caller.stub, pscope("owner"))
    bad = [
        line.replace('"sender_name":"Caroline"', '"sender_name":"Caro\\u0007line"')
        for line in lines
    ]
    assert bad != lines
    error = await import_error(caller.stub, pscope("copy"), bad)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "sender_name" in (error.details() or "")
