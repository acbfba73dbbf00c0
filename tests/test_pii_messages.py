"""PII in stored messages: Ingest applies the tenant's policy to a message's text before the
first write, so no verbatim copy lands anywhere (the messages table, its lexical and context
indexes, the embedding, the outbox payload), and Recall and ExportMemories show the stored
text. A rejected kind is redacted in the message (a message is never refused) and never
becomes a fact, not even as its placeholder."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import numpy as np
from prometheus_client import REGISTRY

from memsvc.embedding import Embedder
from memsvc.governance import pii
from memsvc.governance.policy import parse_pii_policy
from memsvc.server.app import MemsvcServer
from memsvc.storage import tenant_settings
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import ASSISTANT, ingest, msg
from tests.read_helpers import pscope, recall

CARD = "4111 1111 1111 1111"
PLACEHOLDER = "[redacted card number]"
SAID = f"Please charge {CARD}. I work as a nurse at the city hospital."
ECHO = f"Done, I charged the card {CARD} for you."
NURSE = "The user works as a nurse at the city hospital."
MESSAGE = pb.ITEM_TYPE_MESSAGE
Drain = Callable[[], Awaitable[int]]


async def _policy(server: MemsvcServer, pool: asyncpg.Pool, caller: Caller, spec: str) -> None:
    await tenant_settings.save(pool, caller.tenant_id, pii_policy=parse_pii_policy(spec))
    server.runtime.policies.forget(caller.tenant_id)


def _metric(kind: str, action: str, path: str) -> float:
    value = REGISTRY.get_sample_value(
        "memsvc_pii_screened_total", {"kind": kind, "action": action, "path": path}
    )
    return value or 0.0


async def _stored(pool: asyncpg.Pool, tenant: str) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await pool.fetch(
        "SELECT message_id, sender_id, text, search_tsv::text AS lexical,"
        " context_tsv::text AS context, embedding, embedding_state FROM messages"
        " WHERE tenant_id = $1 ORDER BY sent_at",
        tenant,
    )
    return rows


async def _payloads(pool: asyncpg.Pool, tenant: str) -> str:
    rows = await pool.fetch(
        "SELECT payload::text AS p FROM ingest_outbox WHERE tenant_id = $1", tenant
    )
    return " ".join(r["p"] for r in rows)


async def _export(caller: Caller) -> list[dict[str, Any]]:
    call: Any = caller.stub.ExportMemories(pb.ExportMemoriesRequest(scope=pscope()))
    return [json.loads(r.json) async for r in call]


async def _facts(caller: Caller) -> list[str]:
    page = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=pscope(), page_size=500))
    return [m.content for m in page.memories]


async def _outcome(caller: Caller, ingest_id: str) -> pb.ExtractionOutcome:
    status = await caller.stub.GetIngestStatus(pb.GetIngestStatusRequest(ingest_id=ingest_id))
    assert status.state == pb.INGEST_STATE_DONE
    return status.outcome


async def _lexical(caller: Caller, query: str) -> list[str]:
    reply = await recall(caller, query, types=[MESSAGE], mode=pb.RECALL_MODE_LEXICAL)
    return [i.text for i in reply.items]


async def test_redact_reaches_every_stored_copy_of_a_message(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool, embedder: Embedder, drain: Drain
) -> None:
    await _policy(server, pool, caller, "store,card_number=redact")
    before = _metric("card_number", "redact", "ingest")
    reply = await ingest(
        caller,
        [msg("alice", SAID), msg("bot", ECHO, role=ASSISTANT)],
        goals=[f"Pay the rent with {CARD}"],
    )
    assert reply.accepted == 2 and reply.redacted == 2
    assert _metric("card_number", "redact", "ingest") == before + 3
    # Before any worker ran: the rows and the outbox payload hold no card digits.
    assert CARD not in await _payloads(pool, caller.tenant_id)
    assert PLACEHOLDER in await _payloads(pool, caller.tenant_id)  # the goal, redacted
    assert [r["text"] for r in await _stored(pool, caller.tenant_id)] == [
        f"Please charge {PLACEHOLDER}. I work as a nurse at the city hospital.",
        f"Done, I charged the card {PLACEHOLDER} for you.",
    ]
    assert await drain() >= 1

    rows = await _stored(pool, caller.tenant_id)
    for row in rows:
        for column in ("text", "lexical", "context"):
            assert "4111" not in row[column] and "1111" not in row[column], column
    # The vector is of the stored (redacted) text, as its unit (the sender ids are names).
    assert all(r["embedding_state"] == "ok" for r in rows)
    vectors = await embedder.embed(
        [f'{r["sender_id"]} said, "{r["text"]}"' for r in rows], timeout_s=10
    )
    for row, vector in zip(rows, vectors, strict=True):
        assert np.allclose(row["embedding"].to_numpy(), vector, atol=1e-5)

    # The searchable history and the export show the stored text only.
    found = await recall(caller, "charge card nurse hospital", types=[MESSAGE])
    assert found.items and all(i.type == MESSAGE for i in found.items)
    assert {i.text for i in found.items} <= {r["text"] for r in rows}
    assert any(PLACEHOLDER in i.text for i in found.items)
    assert await _lexical(caller, "4111") == []
    assert await _lexical(caller, "1111") == []
    records = await _export(caller)
    assert [r["text"] for r in records if r["type"] == "message"] == [r["text"] for r in rows]
    assert all(CARD not in json.dumps(r) and "4111" not in json.dumps(r) for r in records)

    # The other sentence still became a fact; the redacted ones hold the placeholder whole.
    outcome = await _outcome(caller, reply.ingest_id)
    facts = await _facts(caller)
    assert NURSE in facts
    assert "Goal: Pay the rent with [redacted card number]" in facts
    assert outcome.pii_rejected == 0 and outcome.redacted >= 1
    assert all("4111" not in f for f in facts)
    triples = await pool.fetch(
        "SELECT content, subject, object FROM memories WHERE tenant_id = $1", caller.tenant_id
    )
    for t in triples:
        for value in t.values():
            # A placeholder is whole or absent: never "[ redacted card number" or the like.
            assert value.count("redacted") == value.count(PLACEHOLDER), value


async def test_store_keeps_the_message_as_sent(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool, drain: Drain
) -> None:
    await _policy(server, pool, caller, "store")
    reply = await ingest(caller, [msg("alice", SAID)], goals=[f"Pay the rent with {CARD}"])
    assert reply.redacted == 0
    assert await drain() >= 1
    assert [r["text"] for r in await _stored(pool, caller.tenant_id)] == [SAID]
    assert CARD in await _payloads(pool, caller.tenant_id)
    assert await _lexical(caller, "4111") == [SAID]
    records = await _export(caller)
    assert [r["text"] for r in records if r["type"] == "message"] == [SAID]
    assert NURSE in await _facts(caller)


async def test_reject_redacts_the_message_and_never_makes_a_fact_of_it(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool, drain: Drain
) -> None:
    await _policy(server, pool, caller, "redact,card_number=reject")
    before = _metric("card_number", "redact", "ingest")
    said = f"My card number is {CARD}. I work as a nurse at the city hospital."
    reply = await ingest(caller, [msg("alice", said)], goals=[f"Pay the rent with {CARD}"])
    # The message is stored (the conversation record stays whole), redacted.
    assert reply.accepted == 1 and reply.redacted == 1
    # The action taken (and counted) is "redact": a message cannot be refused.
    assert _metric("card_number", "redact", "ingest") == before + 2
    assert await drain() >= 1
    [row] = await _stored(pool, caller.tenant_id)
    assert (
        row["text"] == f"My card number is {PLACEHOLDER}. I work as a nurse at the city hospital."
    )
    assert "4111" not in row["lexical"] and "4111" not in row["context"]
    assert CARD not in await _payloads(pool, caller.tenant_id)
    outcome = await _outcome(caller, reply.ingest_id)
    # The card fact and the goal held the rejected kind's placeholder: both dropped.
    assert outcome.pii_rejected == 2
    facts = await _facts(caller)
    assert facts == [NURSE]
    assert await _lexical(caller, "4111") == []


async def test_a_policy_change_applies_to_later_ingests_only(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool, drain: Drain
) -> None:
    await _policy(server, pool, caller, "store")
    await ingest(caller, [msg("alice", f"Old card {CARD}")], session="s1")
    await _policy(server, pool, caller, "redact")
    await ingest(caller, [msg("alice", f"New card {CARD}")], session="s2")
    assert await drain() >= 1
    texts = [r["text"] for r in await _stored(pool, caller.tenant_id)]
    assert texts == [f"Old card {CARD}", f"New card {PLACEHOLDER}"]


async def test_unscreened_text_passes_untouched(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool
) -> None:
    await _policy(server, pool, caller, "redact")
    text = "Order 4111 1111 1111 1111 shipped on 12/25; I paid $1,299.99 for it."
    before = _metric("card_number", "redact", "ingest")
    await ingest(caller, [msg("alice", text)])
    assert [r["text"] for r in await _stored(pool, caller.tenant_id)] == [text]
    assert _metric("card_number", "redact", "ingest") == before


def test_placeholders_split_by_a_parser_are_written_back_whole() -> None:
    assert pii.tidy_placeholders("call mom at [ redacted phone number") == (
        "call mom at [redacted phone number]"
    )
    assert pii.tidy_placeholders("code redacted one - time code ] ok") == (
        "code [redacted one-time code] ok"
    )
    assert pii.placeholder_kinds("[redacted card number] and [Redacted Email]") == (
        "card_number",
        "email",
    )
    # Without a bracket the words are the user's own.
    assert pii.tidy_placeholders("I redacted email addresses") == "I redacted email addresses"
    assert pii.placeholder_kinds("I redacted email addresses") == ()


async def test_a_big_turn_is_screened_too(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool
) -> None:
    # Over 8,000 characters in all: screened in a thread, with the same result.
    await _policy(server, pool, caller, "redact")
    filler = "We talked about the garden, the weather and the trip to the coast. " * 40
    texts = [f"{filler}My card is {CARD}. {filler}"[:7_000].strip() for _ in range(3)]
    assert all(CARD in t for t in texts) and sum(map(len, texts)) > 8_000
    reply = await ingest(caller, [msg("alice", t) for t in texts])
    assert reply.accepted == 3 and reply.redacted == 3
    stored = [r["text"] for r in await _stored(pool, caller.tenant_id)]
    assert stored == [t.replace(CARD, PLACEHOLDER) for t in texts]
