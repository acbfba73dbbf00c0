"""Tests for the ``openai`` extractor against a local fake OpenAI-compatible chat endpoint."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest

from memsvc.extraction.base import (
    CandidateFact,
    Decision,
    ExistingFact,
    ExtractionError,
    ExtractionInput,
    Extractor,
    Turn,
)
from memsvc.extraction.openai_chat import OpenAIChatExtractor
from memsvc.http import HTTPError, HTTPTimeout

API_KEY = "sk-test-extractor-5f0c1d2e3b4a-secret"
CATEGORIES = ("profile", "preference", "relationship", "diet", "location")
ROLES = ("core", "context", "detail", "temporal", "causal")

Reply = tuple[int, bytes]


@dataclass
class FakeChat:
    """A scripted OpenAI-compatible server: answers requests with ``replies`` in order."""

    replies: list[Reply] = field(default_factory=list)
    requests: list[tuple[str, dict[str, str], dict[str, Any]]] = field(default_factory=list)
    delay_s: float = 0.0
    release: threading.Event = field(default_factory=threading.Event)
    base_url: str = ""

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def question(self, index: int = -1) -> dict[str, Any]:
        """The JSON object the extractor sent as the user message of request ``index``."""
        messages = self.requests[index][2]["messages"]
        parsed: dict[str, Any] = orjson.loads(messages[1]["content"])
        return parsed


def chat(answer: object) -> Reply:
    """A 200 chat-completions reply whose first choice's content is ``answer`` (JSON unless str)."""
    content = answer if isinstance(answer, str) else orjson.dumps(answer).decode()
    return 200, orjson.dumps(
        {
            "id": "chatcmpl-test",
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


def _handler_for(state: FakeChat) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.requests.append((self.path, dict(self.headers.items()), orjson.loads(body)))
            if state.delay_s:
                state.release.wait(state.delay_s)
            status, payload = state.replies.pop(0) if state.replies else (599, b"unscripted")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Writing to a client that gave up (the timeout test) is expected here.
        pass


@pytest.fixture
def fake_chat() -> Iterator[FakeChat]:
    state = FakeChat()
    server = _QuietServer(("127.0.0.1", 0), _handler_for(state))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
async def extractor(fake_chat: FakeChat) -> AsyncIterator[OpenAIChatExtractor]:
    ex = OpenAIChatExtractor(
        base_url=fake_chat.base_url, model="test-chat", api_key=API_KEY, timeout_s=5.0
    )
    yield ex
    await ex.aclose()


def speaker_input(max_facts: int = 50) -> ExtractionInput:
    at = datetime(2025, 3, 1, 9, 30, tzinfo=UTC)
    return ExtractionInput(
        speaker_id="6f1c2d3e-0000-4000-8000-000000000001",
        session_id="s-1",
        turns=(
            Turn("m1", "I'm vegetarian, and my daughter is named Maya.", at),
            Turn("m2", "I used to live in Delhi, now I live in Singapore.", at),
            Turn("m3", "I don't take sugar in my coffee.", at),
        ),
        categories=CATEGORIES,
        roles=ROLES,
        max_facts=max_facts,
    )


def fact(content: str, **overrides: object) -> dict[str, object]:
    item: dict[str, object] = {
        "content": content,
        "subject": "user",
        "predicate": "is",
        "object": content.lower(),
        "category": "profile",
        "role": "core",
        "confidence": 0.9,
        "source_message_ids": ["m1"],
        "historical": False,
        "negated": False,
    }
    item.update(overrides)
    return item


def good_answer() -> dict[str, object]:
    return {
        "episode": {
            "title": "Diet, family and home",
            "summary": "The speaker talked about their diet, daughter and where they live.",
            "excerpt": "my daughter is named Maya",
            "source_message_ids": ["m1", "m2", "m3"],
        },
        "facts": [
            fact("Is vegetarian", category="diet", predicate="is", object="vegetarian"),
            fact(
                "Daughter is named Maya",
                category="relationship",
                predicate="has daughter named",
                object="Maya",
            ),
            fact(
                "Used to live in Delhi",
                category="location",
                role="context",
                predicate="lives in",
                object="Delhi",
                source_message_ids=["m2"],
                historical=True,
                confidence=0.8,
            ),
            fact(
                "Does not take sugar in coffee",
                category="diet",
                role="detail",
                predicate="takes",
                object="sugar in coffee",
                source_message_ids=["m3"],
                negated=True,
            ),
        ],
        "topics": ["Diet", "family", "  home   town ", "diet"],
    }


def existing_facts() -> list[ExistingFact]:
    return [
        ExistingFact(uuid.uuid4(), "Lives in Delhi", "user", "lives in", "Delhi", 0.81),
        ExistingFact(uuid.uuid4(), "Likes coffee", "user", "likes", "coffee", 0.74),
    ]


CANDIDATE = CandidateFact(
    content="Lives in Singapore",
    category="location",
    role="core",
    confidence=0.9,
    source_message_ids=("m2",),
    predicate="lives in",
    object="Singapore",
)


def exception_texts(error: BaseException) -> list[str]:
    """str() and repr() of ``error`` and of everything it was chained from."""
    texts: list[str] = []
    current: BaseException | None = error
    while current is not None:
        texts += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    return texts


# --- extraction -------------------------------------------------------------------------


async def test_good_extraction(fake_chat: FakeChat, extractor: OpenAIChatExtractor) -> None:
    fake_chat.script(chat(good_answer()))
    result = await extractor.extract(speaker_input())

    assert result.episode is not None
    assert result.episode.title == "Diet, family and home"
    assert result.episode.source_message_ids == ("m1", "m2", "m3")
    contents = [f.content for f in result.facts]
    assert contents == [
        "Is vegetarian",
        "Daughter is named Maya",
        "Used to live in Delhi",
        "Does not take sugar in coffee",
    ]
    delhi = result.facts[2]
    assert delhi.historical and not delhi.negated
    assert (delhi.subject, delhi.predicate, delhi.object) == ("user", "lives in", "Delhi")
    assert (delhi.category, delhi.role, delhi.confidence) == ("location", "context", 0.8)
    assert delhi.source_message_ids == ("m2",)
    sugar = result.facts[3]
    assert sugar.negated and not sugar.historical
    assert result.topics == ("diet", "family", "home town")

    assert len(fake_chat.requests) == 1
    path, headers, request = fake_chat.requests[0]
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == f"Bearer {API_KEY}"
    assert headers["Content-Type"] == "application/json"
    assert request["model"] == "test-chat"
    assert request["temperature"] == 0.1
    assert request["response_format"] == {"type": "json_object"}
    system, user = request["messages"]
    assert system["role"] == "system" and "speaker" in system["content"]
    assert user["role"] == "user"
    question = fake_chat.question()
    assert question["turns"][0] == {
        "message_id": "m1",
        "text": "I'm vegetarian, and my daughter is named Maya.",
        "sent_at": "2025-03-01T09:30:00+00:00",
    }
    assert question["categories"] == list(CATEGORIES)
    assert question["roles"] == list(ROLES)
    assert question["max_facts"] == 50


async def test_unknown_vocabulary_and_foreign_ids_are_dropped(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    answer = good_answer()
    answer["episode"] = {
        "title": "t",
        "summary": "s",
        "excerpt": "e",
        "source_message_ids": ["other-speaker-msg"],
    }
    answer["facts"] = [
        fact("Is vegetarian", role="trivia"),  # role outside the vocabulary
        fact("Is a pilot", category="career"),  # category outside the vocabulary
        fact("Has a cat", source_message_ids=["m1", "m9", "m1"]),  # foreign id removed
        fact("Plays chess", source_message_ids=["m9"]),  # no source left: dropped
        fact("Likes tea", role="CORE", category="Preference"),  # case is forgiven
        fact("   ", source_message_ids=["m2"]),  # empty content
        fact("has a cat", source_message_ids=["m2"]),  # a repeat of an earlier fact
    ]
    fake_chat.script(chat(answer))
    result = await extractor.extract(speaker_input())

    assert [(f.content, f.source_message_ids) for f in result.facts] == [
        ("Has a cat", ("m1",)),
        ("Likes tea", ("m1",)),
    ]
    assert (result.facts[1].role, result.facts[1].category) == ("core", "preference")
    # An episode citing none of the speaker's turns is attributed to all of them.
    assert result.episode is not None
    assert result.episode.source_message_ids == ("m1", "m2", "m3")
    assert len(fake_chat.requests) == 1  # dropping is not a retry


async def test_max_facts_keeps_the_most_confident_in_order(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    answer = good_answer()
    answer["facts"] = [
        fact("A", confidence=0.5),
        fact("B", confidence=0.9),
        fact("C", confidence=0.6),
    ]
    fake_chat.script(chat(answer))
    result = await extractor.extract(speaker_input(max_facts=2))
    assert [f.content for f in result.facts] == ["B", "C"]
    assert fake_chat.question()["max_facts"] == 2


async def test_malformed_then_good_is_retried_once(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    fake_chat.script(chat('{"episode": {"title": '), chat(good_answer()))
    result = await extractor.extract(speaker_input())
    assert len(result.facts) == 4
    assert len(fake_chat.requests) == 2
    # The retry asks the same question.
    assert fake_chat.requests[0][2] == fake_chat.requests[1][2]


def _without(key: str) -> dict[str, object]:
    answer = good_answer()
    del answer[key]
    return answer


def _bad_fact(**overrides: object) -> dict[str, object]:
    answer = good_answer()
    answer["facts"] = [fact("Is vegetarian"), fact("Is tall", **overrides)]
    return answer


def _fact_without(key: str) -> dict[str, object]:
    item = fact("Is tall")
    del item[key]
    answer = good_answer()
    answer["facts"] = [item]
    return answer


EMPTY_CHOICES = (200, orjson.dumps({"choices": []}))
MALFORMED: dict[str, Reply] = {
    "body not json": (200, b"<html>gateway</html>"),
    "no choices": (200, orjson.dumps({"object": "chat.completion"})),
    "empty choices": EMPTY_CHOICES,
    "null content": (200, orjson.dumps({"choices": [{"message": {"content": None}}]})),
    "content not json": chat("Sure! Here are the facts: ..."),
    "content not an object": chat([good_answer()]),
    "missing facts": chat(_without("facts")),
    "missing episode": chat(_without("episode")),
    "missing topics": chat(_without("topics")),
    "facts not a list": chat({**good_answer(), "facts": {"content": "x"}}),
    "fact not an object": chat({**good_answer(), "facts": ["Is vegetarian"]}),
    "confidence a string": chat(_bad_fact(confidence="high")),
    "confidence a bool": chat(_bad_fact(confidence=True)),
    "confidence above 1": chat(_bad_fact(confidence=1.5)),
    "historical a string": chat(_bad_fact(historical="false")),
    "source ids a string": chat(_bad_fact(source_message_ids="m1")),
    "source id a number": chat(_bad_fact(source_message_ids=[1])),
    "fact without negated": chat(_fact_without("negated")),
    "fact without role": chat(_fact_without("role")),
    "episode missing title": chat({**good_answer(), "episode": {"summary": "s"}}),
    "topics not strings": chat({**good_answer(), "topics": ["diet", 3]}),
}


@pytest.mark.parametrize("reply", list(MALFORMED.values()), ids=list(MALFORMED))
async def test_malformed_twice_is_an_extraction_error(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor, reply: Reply
) -> None:
    fake_chat.script(reply, reply)
    with pytest.raises(ExtractionError, match="no valid extraction in 2 attempt"):
        await extractor.extract(speaker_input())
    assert len(fake_chat.requests) == 2


async def test_no_retry_when_configured_off(fake_chat: FakeChat) -> None:
    ex = OpenAIChatExtractor(
        base_url=fake_chat.base_url, model="m", api_key=API_KEY, max_retries_on_malformed=0
    )
    try:
        fake_chat.script(EMPTY_CHOICES, chat(good_answer()))
        with pytest.raises(ExtractionError):
            await ex.extract(speaker_input())
        assert len(fake_chat.requests) == 1
    finally:
        await ex.aclose()


async def test_http_500_is_an_extraction_error_without_retry(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    fake_chat.script((500, b'{"error": {"message": "model crashed"}}'), chat(good_answer()))
    with pytest.raises(ExtractionError, match="HTTP 500: model crashed"):
        await extractor.extract(speaker_input())
    assert len(fake_chat.requests) == 1


async def test_timeout_is_an_extraction_error(fake_chat: FakeChat) -> None:
    fake_chat.delay_s = 5.0
    fake_chat.script(chat(good_answer()))
    ex = OpenAIChatExtractor(base_url=fake_chat.base_url, model="m", timeout_s=0.2)
    try:
        started = time.perf_counter()
        with pytest.raises(ExtractionError, match="did not answer") as info:
            await ex.extract(speaker_input())
        assert time.perf_counter() - started < 2.0
        assert isinstance(info.value.__cause__, HTTPTimeout)
    finally:
        await ex.aclose()


async def test_unreachable_endpoint_is_an_extraction_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ex = OpenAIChatExtractor(base_url=f"http://127.0.0.1:{port}", model="m", api_key=API_KEY)
    try:
        with pytest.raises(ExtractionError) as info:
            await ex.extract(speaker_input())
        assert isinstance(info.value.__cause__, HTTPError)
        assert all(API_KEY not in text for text in exception_texts(info.value))
    finally:
        await ex.aclose()


async def test_no_turns_asks_nothing(fake_chat: FakeChat, extractor: OpenAIChatExtractor) -> None:
    empty = ExtractionInput("u", "s", (), CATEGORIES, ROLES, 50)
    result = await extractor.extract(empty)
    assert result.episode is None and result.facts == () and result.topics == ()
    assert fake_chat.requests == []


# --- decisions --------------------------------------------------------------------------


async def test_decide_with_a_valid_target(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    existing = existing_facts()
    target = existing[0].memory_id
    fake_chat.script(
        chat({"decision": "conflict", "target_id": str(target), "reason": "moved"}),
        chat({"decision": "add", "target_id": None, "reason": "new"}),
    )
    result = await extractor.decide(CANDIDATE, existing)
    assert result is not None
    assert (result.decision, result.target_id, result.reason) == (
        Decision.CONFLICT,
        target,
        "moved",
    )
    _, headers, request = fake_chat.requests[0]
    assert headers["Authorization"] == f"Bearer {API_KEY}"
    assert request["response_format"] == {"type": "json_object"}
    assert request["temperature"] == 0.1
    question = fake_chat.question()
    assert question["candidate"]["content"] == "Lives in Singapore"
    assert [s["id"] for s in question["stored"]] == [str(f.memory_id) for f in existing]

    added = await extractor.decide(CANDIDATE, existing)
    assert added is not None
    assert (added.decision, added.target_id) == (Decision.ADD, None)


@pytest.mark.parametrize(
    "answer",
    [
        {"decision": "update", "target_id": str(uuid.uuid4()), "reason": "not a given id"},
        {"decision": "noop", "target_id": None, "reason": "no target"},
        {"decision": "noop", "target_id": "not-a-uuid", "reason": "garbage"},
        {"decision": "merge", "target_id": None, "reason": "unknown decision"},
        {"decision": "add", "target_id": 7, "reason": "wrong type"},
        {"decision": "add", "target_id": None},
    ],
    ids=["foreign id", "missing target", "garbage id", "bad decision", "id type", "no reason"],
)
async def test_decide_malformed_twice_falls_back_to_rules(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor, answer: dict[str, object]
) -> None:
    fake_chat.script(chat(answer), chat(answer))
    assert await extractor.decide(CANDIDATE, existing_facts()) is None
    assert len(fake_chat.requests) == 2


async def test_decide_invalid_then_valid_target(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    existing = existing_facts()
    target = existing[1].memory_id
    fake_chat.script(
        chat({"decision": "update", "target_id": str(uuid.uuid4()), "reason": "r"}),
        chat({"decision": "noop", "target_id": str(target).upper(), "reason": "same"}),
    )
    result = await extractor.decide(CANDIDATE, existing)
    assert result is not None
    assert (result.decision, result.target_id) == (Decision.NOOP, target)


async def test_decide_http_error_is_an_extraction_error(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    fake_chat.script((503, b'{"error": "overloaded"}'))
    with pytest.raises(ExtractionError, match="HTTP 503: overloaded"):
        await extractor.decide(CANDIDATE, existing_facts())


async def test_decide_with_nothing_stored_adds_without_asking(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    result = await extractor.decide(CANDIDATE, [])
    assert result is not None and result.decision is Decision.ADD
    assert fake_chat.requests == []


# --- secrets, identity, configuration ---------------------------------------------------


async def test_api_key_never_in_repr_or_errors(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    assert API_KEY not in repr(extractor)
    assert "test-chat" in repr(extractor)
    echoed = orjson.dumps({"error": {"message": f"Incorrect API key provided: {API_KEY}"}})
    fake_chat.script((401, echoed))
    with pytest.raises(ExtractionError, match="HTTP 401") as info:
        await extractor.extract(speaker_input())
    fake_chat.script(chat(API_KEY), chat(API_KEY))
    with pytest.raises(ExtractionError) as malformed:
        await extractor.extract(speaker_input())
    for error in (info.value, malformed.value):
        assert all(API_KEY not in text for text in exception_texts(error))


async def test_is_an_extractor(extractor: OpenAIChatExtractor) -> None:
    assert isinstance(extractor, Extractor)
    assert extractor.name == "openai"


def test_rejects_bad_configuration() -> None:
    with pytest.raises(ValueError) as info:
        OpenAIChatExtractor(base_url="http://127.0.0.1:1", model="m", api_key="sk-x\r\nX: y")
    assert "sk-x" not in str(info.value)
    with pytest.raises(ValueError):
        OpenAIChatExtractor(base_url="ftp://example.invalid", model="m")
    with pytest.raises(ValueError):
        OpenAIChatExtractor(base_url="http://127.0.0.1:1", model="")
    with pytest.raises(ValueError):
        OpenAIChatExtractor(base_url="http://127.0.0.1:1", model="m", temperature=3.0)
    with pytest.raises(ValueError):
        OpenAIChatExtractor(base_url="http://127.0.0.1:1", model="m", max_retries_on_malformed=-1)


def test_endpoint_paths() -> None:
    bare = OpenAIChatExtractor(base_url="http://localhost:8080", model="m")
    assert "http://localhost:8080/v1/chat/completions" in repr(bare)
    prefixed = OpenAIChatExtractor(base_url="https://llm.example.invalid/openai/v1/", model="m")
    assert "https://llm.example.invalid/openai/v1/chat/completions" in repr(prefixed)
