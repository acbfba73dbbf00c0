"""A message's vector carries its previous turn (storage.messages.EMBED_UNIT_SQL): a reply
whose meaning is in the turn it answers is found by the dense leg, and an erased turn leaves
no trace in its neighbour's vector."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import asyncpg
import numpy as np

from memsvc.embedding import Embedder
from memsvc.ingest.reconcile import reconcile_once
from memsvc.storage import messages
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.read_helpers import pscope, recall

DENSE = pb.RECALL_MODE_DENSE
MESSAGE = pb.ITEM_TYPE_MESSAGE
START = datetime(2026, 5, 8, 13, 56, tzinfo=UTC)
QUESTION = "Have you been to the climbing gym lately?"
REPLY = "Yes, twice a week, I finally led a 6b route!"
# Each alone in its session (no previous turn): nearer the question below than the reply
# alone is, farther than the reply with the question it answers.
OTHERS = (
    "My neighbour goes to the gym every day.",
    "My brother loves bouldering videos.",
    "Climbing the stairs at work is tiring.",
)


def turn(message_id: str, text: str, k: int, role: int = pb.MESSAGE_ROLE_USER) -> pb.Message:
    message = pb.Message(
        message_id=message_id,
        sender_id="u_81f3" if role == pb.MESSAGE_ROLE_USER else "a_1",
        role=role,  # type: ignore[arg-type]
        text=text,
    )
    message.sent_at.FromDatetime(START + timedelta(seconds=k))
    return message


async def ingest(caller: Caller, session: str, turns: list[pb.Message]) -> None:
    await caller.stub.Ingest(
        pb.IngestRequest(
            scope=pscope("owner"),
            session_id=session,
            messages=turns,
            end_of_session=True,
            idempotency_key=f"k-{session}",
        )
    )


async def test_a_reply_is_found_by_the_turn_it_answers(
    caller: Caller, drain: Callable[[], Awaitable[int]]
) -> None:
    """ "Yes, twice a week…" says nothing of climbing; with the assistant's question in its
    vector the dense leg ranks it right after the question, above turns that only sound
    near (the message alone ranks below all three)."""
    await ingest(
        caller,
        "s1",
        [turn("q", QUESTION, 0, pb.MESSAGE_ROLE_ASSISTANT), turn("reply", REPLY, 1)],
    )
    for i, text in enumerate(OTHERS):
        await ingest(caller, f"other-{i}", [turn(f"o{i}", text, 10 + i)])
    assert await drain() >= 1
    reply = await recall(
        caller,
        "How often does the user go climbing?",
        scope=pscope("owner"),
        types=[MESSAGE],
        mode=DENSE,
        top_k=2,
    )
    assert [item.id for item in reply.items] == ["q", "reply"]
    assert reply.items[1].text == REPLY  # the message as said, not its embedded unit


async def test_an_erased_turn_leaves_its_neighbours_vector(
    caller: Caller,
    pool: asyncpg.Pool,
    embedder: Embedder,
    drain: Callable[[], Awaitable[int]],
) -> None:
    """When a turn is erased, the next turn's vector (made with it) is stale and re-embedded
    without it; until then the dense leg does not read it."""
    await ingest(
        caller,
        "s1",
        [turn("q", QUESTION, 0, pb.MESSAGE_ROLE_ASSISTANT), turn("reply", REPLY, 1)],
    )
    assert await drain() >= 1
    select = (
        "SELECT embed_prev, embedding_state, embedding FROM messages"
        " WHERE tenant_id = $1 AND user_id = 'owner' AND message_id = 'reply'"
    )
    row = await pool.fetchrow(select, caller.tenant_id)
    assert row["embed_prev"] == QUESTION and row["embedding_state"] == "ok"
    (with_question,) = await embedder.embed([QUESTION + "\n" + REPLY])
    assert np.allclose(row["embedding"].to_numpy(), with_question, atol=1e-5)

    async with pool.acquire() as conn, conn.transaction():
        touched = await messages.delete_returning_sessions(
            conn,
            "tenant_id = $1 AND user_id = 'owner' AND message_id = 'q'",
            caller.tenant_id,
        )
        await messages.reindex_sessions(conn, touched)
        row = await conn.fetchrow(select, caller.tenant_id)
    assert row["embed_prev"] is None and row["embedding_state"] == "stale"

    # The session's database holds other tests' stale rows too: batches until this one's turn.
    for _ in range(200):
        repaired = await reconcile_once(pool, embedder)
        row = await pool.fetchrow(select, caller.tenant_id)
        if row["embedding_state"] == "ok" or not repaired:
            break
    (alone,) = await embedder.embed([REPLY])
    assert row["embedding_state"] == "ok"
    assert np.allclose(row["embedding"].to_numpy(), alone, atol=1e-5)
