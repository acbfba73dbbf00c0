"""Issue 29 item 7: the LLM path gets the same rules, enforced in code whatever the model says.

A memsvc runs with MEMSVC_EXTRACTOR=openai against a chat-completions server in this test
process that answers like the OpenAI API, with scripted, deliberately wrong extractions of the
issue's failure cases: a positive triple for "I don't work at Google anymore", the sister's
city as the user's, a new employer that ends nothing, "last Friday" dated when the model ran.
What is stored (ListMemories, history included) must be what the rules path stores.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any

import grpc
import orjson
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from memsvc.config import Settings
from memsvc.embedding import Embedder
from memsvc.extraction.openai_chat import DECIDE_SYSTEM_PROMPT
from memsvc.ingest.worker import OutboxWorker
from memsvc.server.app import MemsvcServer
from memsvc.server.runtime import worker_settings
from memsvc.storage import api_keys
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import Caller, _KeyedStub, started_server
from tests.fake_http import QuietHandler, serving


def said_fact(content: str, message: str = "", **fields: object) -> dict[str, object]:
    """One fact as the model writes it (`message`: its source turn's id, filled in later)."""
    item: dict[str, object] = {
        "content": content,
        "subject": "user",
        "predicate": "",
        "object": "",
        "category": "profile",
        "role": "core",
        "confidence": 0.95,
        "source_message_ids": [message],
        "historical": False,
        "negated": False,
        "planned": False,
        "valid_from": None,
    }
    item.update(fields)
    return item


@dataclass
class ScriptedModel:
    """Answers an extraction by the text of its first turn (whatever the order of requests),
    and every gray-zone decision with "add" (keep both: the worst answer for a change)."""

    facts_by_turn: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    base_url: str = ""

    def answer(self, request: dict[str, Any]) -> object:
        system, user = request["messages"][0]["content"], request["messages"][1]["content"]
        question = orjson.loads(user)
        if system == DECIDE_SYSTEM_PROMPT:
            return {"decision": "add", "target_id": None, "reason": "they look compatible"}
        turn = question["turns"][0]
        self.asked.append(turn["text"])
        facts = [
            {**f, "source_message_ids": [turn["message_id"]]}
            for f in self.facts_by_turn[turn["text"]]
        ]
        return {
            "episode": {
                "title": "Work and family",
                "summary": "The user talked about work and family.",
                "excerpt": turn["text"][:50],
                "source_message_ids": [turn["message_id"]],
            },
            "facts": facts,
            "topics": ["work"],
        }


def _handler(model: ScriptedModel) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def do_POST(self) -> None:
            request = orjson.loads(self.rfile.read(int(self.headers["Content-Length"])))
            content = orjson.dumps(model.answer(request)).decode()
            body = orjson.dumps(
                {
                    "id": "chatcmpl-scripted",
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": content},
                            "finish_reason": "stop",
                        }
                    ],
                }
            )
            self.send_body(200, body)

    return Handler


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    state = ScriptedModel()
    with serving(_handler(state)) as state.base_url:
        yield state


@dataclass
class LLMServer:
    server: MemsvcServer
    caller: Caller

    async def say(self, user: str, text: str, when: datetime) -> None:
        """One turn of ``user``, then the extraction job run to its end."""
        stamp = Timestamp()
        stamp.FromDatetime(when)
        await self.caller.stub.Ingest(
            pb.IngestRequest(
                scope=pb.Scope(user_id=user),
                session_id=f"s-{uuid.uuid4().hex[:8]}",
                messages=[
                    pb.Message(
                        message_id=f"m-{uuid.uuid4().hex[:10]}",
                        sender_id=user,
                        role=pb.MESSAGE_ROLE_USER,
                        text=text,
                        sent_at=stamp,
                    )
                ],
                idempotency_key=uuid.uuid4().hex,
            )
        )
        worker = OutboxWorker(
            self.server.runtime.pool,
            self.server.runtime.pipeline,
            worker_settings(self.server.settings),
            listener=self.server.runtime.listener,
        )
        assert await worker.drain() == 1

    async def memories(self, user: str) -> list[pb.Memory]:
        reply = await self.caller.stub.ListMemories(
            pb.ListMemoriesRequest(
                scope=pb.Scope(user_id=user), page_size=100, include_superseded=True
            )
        )
        return list(reply.memories)


@pytest.fixture
async def llm(
    settings: Settings, embedder: Embedder, model: ScriptedModel
) -> AsyncIterator[LLMServer]:
    async with started_server(
        settings,
        embedder,
        extractor="openai",
        openai_chat_base_url=model.base_url,
        openai_chat_model="scripted",
        extractor_timeout_ms=10_000,
    ) as srv:
        assert srv.pool is not None
        tenant = f"t-{uuid.uuid4().hex[:12]}"
        async with srv.pool.acquire() as conn:
            key = await api_keys.create_key(conn, tenant, "test")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
            stub = _KeyedStub(memory_pb2_grpc.MemoryServiceStub(channel), key)
            yield LLMServer(srv, Caller(tenant, key, stub))  # type: ignore[arg-type]


# Monday 7 December 2026; "last Friday" is 4 December. The earlier statements were made
# weeks before.
NOW = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
EARLIER = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
GOOGLE = "I work at Google."


def _current(memories: list[pb.Memory]) -> list[pb.Memory]:
    return [m for m in memories if not m.HasField("invalid_at") and not m.superseded_by_id]


def _triples(memories: list[pb.Memory]) -> set[tuple[str, str, str, bool]]:
    return {(m.subject, m.predicate, m.object, m.negated) for m in memories}


def _works_at_google(model: ScriptedModel) -> None:
    model.facts_by_turn[GOOGLE] = [
        said_fact("The user works at Google.", predicate="works_at", object="Google")
    ]


async def test_a_negated_statement_is_never_a_positive_triple(
    llm: LLMServer, model: ScriptedModel
) -> None:
    _works_at_google(model)
    said = "I don't work at Google anymore."
    # The model drops the negation: a positive triple, a positive sentence.
    model.facts_by_turn[said] = [
        said_fact("The user works at Google.", predicate="works_at", object="Google")
    ]
    await llm.say("ana", GOOGLE, EARLIER)
    await llm.say("ana", said, NOW)
    assert model.asked == [GOOGLE, said]

    current = _current(await llm.memories("ana"))
    assert ("user", "works_at", "Google", False) not in _triples(current)
    negation = [m for m in current if m.negated]
    assert len(negation) == 1, [m.content for m in current]
    assert "n't work at Google" in negation[0].content or "not" in negation[0].content
    assert negation[0].object == "Google" and negation[0].predicate.endswith("works_at")


async def test_a_negated_sentence_the_rules_cannot_read_keeps_no_positive_triple(
    llm: LLMServer, model: ScriptedModel
) -> None:
    """The rules read nothing in this turn, so nothing of theirs corrects the model; its own
    sentence says "not", and its triple must not say the opposite."""
    said = "Hard pass on pork, always."
    model.facts_by_turn[said] = [
        said_fact(
            "The user does not like pork.", category="preference", predicate="likes", object="pork"
        )
    ]
    await llm.say("bo", said, NOW)
    assert model.asked == [said]

    current = _current(await llm.memories("bo"))
    assert [m.content for m in current] == ["The user does not like pork."]
    assert ("user", "likes", "pork", False) not in _triples(current)


async def test_a_third_party_fact_never_changes_the_users(
    llm: LLMServer, model: ScriptedModel
) -> None:
    home = "I live in Porto."
    sister = "My sister's name is Rita and she lives in Madrid."
    model.facts_by_turn[home] = [
        said_fact("The user lives in Porto.", predicate="lives_in", object="Porto")
    ]
    # The model files the sister's city as the user's.
    model.facts_by_turn[sister] = [
        said_fact("The user lives in Madrid.", predicate="lives_in", object="Madrid")
    ]
    await llm.say("bea", home, EARLIER)
    await llm.say("bea", sister, NOW)

    memories = await llm.memories("bea")
    current = _current(memories)
    assert ("user", "lives_in", "Porto", False) in _triples(current)
    assert not [m for m in memories if m.subject == "user" and m.object == "Madrid"]
    madrid = [m for m in current if m.object == "Madrid"]
    assert [(m.subject, m.predicate) for m in madrid] == [("user's sister Rita", "lives_in")]
    # Porto was never superseded.
    assert [m.content for m in memories if m.object == "Porto"] == ["The user lives in Porto."]


async def test_a_new_employer_ends_the_old_one(llm: LLMServer, model: ScriptedModel) -> None:
    _works_at_google(model)
    said = "I got a new job at Stripe, I start Monday."
    # The model records the new job as free text: nothing that would end Google.
    model.facts_by_turn[said] = [said_fact("The user got a new job at Stripe.")]
    await llm.say("cai", GOOGLE, EARLIER)
    await llm.say("cai", said, NOW)

    memories = await llm.memories("cai")
    current = _current(memories)
    assert not [m for m in current if "Google" in m.content], [m.content for m in current]
    stripe = [m for m in current if m.object == "Stripe"]
    assert [(m.predicate, m.negated) for m in stripe] == [("works_at", False)]
    google = next(m for m in memories if m.object == "Google")
    assert google.superseded_by_id == stripe[0].memory_id
    assert google.invalid_at.ToDatetime(tzinfo=UTC) == NOW


async def test_a_stated_time_is_the_valid_time(llm: LLMServer, model: ScriptedModel) -> None:
    _works_at_google(model)
    said = "I quit Google last Friday."
    # The model drops the time (valid from the moment it ran) and keeps no triple.
    model.facts_by_turn[said] = [
        said_fact("The user quit Google.", category="event", valid_from="2026-12-07")
    ]
    await llm.say("dev", GOOGLE, EARLIER)
    await llm.say("dev", said, NOW)

    memories = await llm.memories("dev")
    friday = datetime(2026, 12, 4, tzinfo=UTC)
    google = next(m for m in memories if m.content == "The user works at Google.")
    assert google.invalid_at.ToDatetime(tzinfo=UTC).date() == friday.date()
    quit_ = next(m for m in _current(memories) if "quit Google" in m.content)
    assert quit_.valid_from.ToDatetime(tzinfo=UTC).date() == friday.date()
    assert google.superseded_by_id == quit_.memory_id
    assert ("user", "works_at", "Google", False) not in _triples(_current(memories))


async def test_what_is_not_asserted_is_not_stored(llm: LLMServer, model: ScriptedModel) -> None:
    # The model takes a condition, someone else's words, sarcasm and a joke taken back at
    # their word.
    script = {
        "If I lived in Paris I'd eat croissants every day.": [
            said_fact("The user lives in Paris.", predicate="lives_in", object="Paris")
        ],
        "My friend said she loves jazz.": [
            said_fact("The user likes jazz.", predicate="likes", object="jazz")
        ],
        "Oh great, I just LOVE being stuck in traffic for two hours.": [
            said_fact(
                "The user loves being stuck in traffic.",
                predicate="likes",
                object="being stuck in traffic",
            )
        ],
        "Just kidding, I'm actually 100.": [
            said_fact("The user is 100 years old.", predicate="age", object="100")
        ],
    }
    model.facts_by_turn.update(script)
    for text in script:
        await llm.say("eve", text, NOW)
    assert model.asked == list(script)
    assert [m.content for m in await llm.memories("eve")] == []
