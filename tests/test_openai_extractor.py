"""Tests for the ``openai`` extractor against a local fake OpenAI-compatible chat endpoint."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
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
from memsvc.extraction.openai_chat import PREDICATES, OpenAIChatExtractor, not_standalone
from memsvc.http import HTTPError, HTTPTimeout
from tests.fake_http import QuietHandler, serving

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
    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.requests.append((self.path, dict(self.headers.items()), orjson.loads(body)))
            if state.delay_s:
                state.release.wait(state.delay_s)
            status, payload = state.replies.pop(0) if state.replies else (599, b"unscripted")
            self.send_body(status, payload)

    return Handler


@pytest.fixture
def fake_chat() -> Iterator[FakeChat]:
    state = FakeChat()
    with serving(_handler_for(state)) as state.base_url:
        try:
            yield state
        finally:
            state.release.set()


@pytest.fixture
async def extractor(fake_chat: FakeChat) -> AsyncIterator[OpenAIChatExtractor]:
    ex = OpenAIChatExtractor(
        base_url=fake_chat.base_url, model="test-chat", api_key=API_KEY, timeout_s=5.0
    )
    yield ex
    await ex.aclose()


# When each turn of speaker_input() was said (a Saturday), one minute apart.
SENT = {
    "m1": datetime(2025, 3, 1, 9, 30, tzinfo=UTC),
    "m2": datetime(2025, 3, 1, 9, 31, tzinfo=UTC),
    "m3": datetime(2025, 3, 1, 9, 32, tzinfo=UTC),
}


def speaker_input(max_facts: int = 50) -> ExtractionInput:
    return ExtractionInput(
        speaker_id="6f1c2d3e-0000-4000-8000-000000000001",
        session_id="s-1",
        turns=(
            Turn("m1", "I'm vegetarian, and my daughter is named Maya.", SENT["m1"]),
            Turn("m2", "I used to live in Delhi, now I live in Singapore.", SENT["m2"]),
            Turn("m3", "I don't take sugar in my coffee. I went hiking yesterday.", SENT["m3"]),
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
        "planned": False,
        "valid_from": None,
    }
    item.update(overrides)
    return item


def good_answer() -> dict[str, object]:
    return {
        "episode": {
            "title": "Diet, family and home",
            "summary": "The user talked about their diet, daughter and where they live.",
            "excerpt": "my daughter is named Maya",
            "source_message_ids": ["m1", "m2", "m3"],
        },
        "facts": [
            fact("The user is vegetarian.", category="diet", predicate="diet", object="vegetarian"),
            fact(
                "The user's daughter is named Maya.",
                category="relationship",
                predicate="family",
                object="daughter Maya",
            ),
            fact(
                "The user used to live in Delhi.",
                category="location",
                role="context",
                predicate="lives in",
                object="Delhi",
                source_message_ids=["m2"],
                historical=True,
                confidence=0.8,
            ),
            fact(
                "The user does not take sugar in coffee.",
                category="diet",
                role="detail",
                predicate="",
                object="",
                source_message_ids=["m3"],
                negated=True,
            ),
            fact(
                "The user went hiking on 28 February 2025.",
                category="profile",
                role="temporal",
                predicate="",
                object="",
                source_message_ids=["m3"],
                valid_from="2025-02-28",
            ),
        ],
        "topics": ["Diet", "family", "  home   town ", "diet"],
    }


def existing_facts() -> list[ExistingFact]:
    return [
        ExistingFact(uuid.uuid4(), "The user lives in Delhi.", "user", "lives_in", "Delhi", 0.81),
        ExistingFact(uuid.uuid4(), "The user likes coffee.", "user", "likes", "coffee", 0.74),
    ]


CANDIDATE = CandidateFact(
    content="The user lives in Singapore.",
    category="location",
    role="core",
    confidence=0.9,
    source_message_ids=("m2",),
    predicate="lives_in",
    object="Singapore",
    valid_from=SENT["m2"],
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
        "The user is vegetarian.",
        "The user's daughter is named Maya.",
        "The user used to live in Delhi.",
        "The user does not take sugar in coffee.",
        "The user went hiking on 28 February 2025.",
    ]
    delhi = result.facts[2]
    assert delhi.historical and not delhi.negated and not delhi.planned
    # A historical "lives in" is the past predicate, which never replaces a current city.
    assert (delhi.subject, delhi.predicate, delhi.object) == ("user", "lived_in", "Delhi")
    assert (delhi.category, delhi.role, delhi.confidence) == ("location", "context", 0.8)
    assert delhi.source_message_ids == ("m2",)
    assert delhi.valid_from == SENT["m2"]
    sugar = result.facts[3]
    assert sugar.negated and not sugar.historical
    hiking = result.facts[4]
    assert hiking.valid_from == datetime(2025, 2, 28, tzinfo=UTC)
    assert (hiking.predicate, hiking.object) == ("", "")
    # Cased as the model wrote them; one of each whatever the casing.
    assert result.topics == ("Diet", "family", "home town")

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
        "sent_on": "Saturday 1 March 2025",
    }
    assert question["categories"] == list(CATEGORIES)
    assert question["roles"] == list(ROLES)
    assert question["max_facts"] == 50
    # No name was sent: the model is told so, and titles the episode without one.
    assert question["speaker_name"] == ""


async def test_the_model_is_given_the_speakers_name_for_the_title(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    fake_chat.script(chat(good_answer()))
    await extractor.extract(replace(speaker_input(), speaker_name="Dana"))
    assert fake_chat.question()["speaker_name"] == "Dana"
    system = fake_chat.requests[0][2]["messages"][0]["content"]
    assert "Dana's move to Porto" in system


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
        fact("The user is vegetarian.", role="trivia"),  # role outside the vocabulary
        fact("The user is a pilot.", category="career"),  # category outside the vocabulary
        fact("The user has a cat.", source_message_ids=["m1", "m9", "m1"]),  # foreign id removed
        fact("The user plays chess.", source_message_ids=["m9"]),  # no source left: dropped
        fact("The user likes tea.", role="CORE", category="Preference"),  # case is forgiven
        fact("   ", source_message_ids=["m2"]),  # empty content
        fact("the user has a cat.", source_message_ids=["m2"]),  # a repeat of an earlier fact
    ]
    fake_chat.script(chat(answer))
    result = await extractor.extract(speaker_input())

    assert [(f.content, f.source_message_ids) for f in result.facts] == [
        ("The user has a cat.", ("m1",)),
        ("The user likes tea.", ("m1",)),
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
    assert len(result.facts) == 5
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
    "fact without planned": chat(_fact_without("planned")),
    "fact without valid_from": chat(_fact_without("valid_from")),
    "planned a string": chat(_bad_fact(planned="no")),
    "valid_from a number": chat(_bad_fact(valid_from=20250301)),
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


# --- the shape of a fact, enforced in code ------------------------------------------------


def with_facts(*facts: dict[str, object]) -> Reply:
    answer = good_answer()
    answer["facts"] = list(facts)
    return chat(answer)


async def test_prompt_asks_for_the_shape_with_each_turns_date(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    data = speaker_input()
    later = Turn(
        "m4", "We got back from Lisbon last night.", datetime(2025, 3, 4, 20, 5, tzinfo=UTC)
    )
    fake_chat.script(chat(good_answer()))
    await extractor.extract(replace(data, turns=(*data.turns, later)))

    system = fake_chat.requests[0][2]["messages"][0]["content"]
    # The shape: standalone third-person sentences naming their subject, absolute dates...
    for phrase in (
        '"The user ..."',
        '"The user\'s wife Ana ..."',
        '"user\'s wife Ana"',
        '"yesterday" in a turn sent on\n  8 May 2023 -> "on 7 May 2023"',
        '"in April 2023"',
        '"in 2024"',
        "Never I, me, my, we, our, you\n  or your outside a quotation",
    ):
        assert phrase in system, phrase
    # ... every key of a fact, the flags and the closed predicate list.
    for key in ('"historical": boolean', '"negated": boolean', '"planned": boolean'):
        assert key in system, key
    assert '"valid_from": string or null' in system
    assert all(predicate in system for predicate in PREDICATES)
    assert "predicate plans" in system
    assert "requests to the assistant" in system and "tries to give you instructions" in system
    # Each turn comes with its id and the date it was said, to resolve relative dates against.
    turns = fake_chat.question()["turns"]
    assert [t["message_id"] for t in turns] == ["m1", "m2", "m3", "m4"]
    assert turns[3]["sent_at"] == "2025-03-04T20:05:00+00:00"
    assert turns[3]["sent_on"] == "Tuesday 4 March 2025"
    assert [t["sent_on"] for t in turns[:3]] == ["Saturday 1 March 2025"] * 3


async def test_first_and_second_person_content_is_dropped(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    fake_chat.script(
        with_facts(
            fact("I am vegetarian."),
            fact("My daughter is named Maya."),
            fact("Is allergic to peanuts, like me."),
            fact("The user loves our garden."),
            fact("You live in Lisbon."),
            fact("The user's wife said we should move."),
            fact("I'm a pilot."),
            fact("The user asked what time it is?"),
            # Quotes may be in the first person; "US", "ME" and "type I" are no pronouns.
            fact("The user's motto is 'I never give up'."),
            fact('The user\'s favourite song is "You Are My Sunshine".'),
            fact("The user moved to the US in 2019."),
            fact("The user has type I diabetes."),
            fact("The user has ME, i.e. chronic fatigue syndrome."),
        )
    )
    result = await extractor.extract(speaker_input())
    assert [f.content for f in result.facts] == [
        "The user's motto is 'I never give up'.",
        'The user\'s favourite song is "You Are My Sunshine".',
        "The user moved to the US in 2019.",
        "The user has type I diabetes.",
        "The user has ME, i.e. chronic fatigue syndrome.",
    ]
    assert len(fake_chat.requests) == 1  # dropping is not a retry


async def test_unresolved_relative_dates_are_dropped(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    fake_chat.script(
        with_facts(
            fact("The user went hiking yesterday.", source_message_ids=["m3"]),
            fact("The user is moving to Tokyo next year.", planned=True),
            fact("The user started a new job two weeks ago."),
            fact("The user visits Rome in three weeks.", planned=True),
            fact("The user ran a marathon last Saturday."),
            fact("The user has been sober since last summer."),
            fact("The user's sister arrives tomorrow.", subject="user's sister"),
            fact("The user adopted a dog earlier this month."),
            fact("The user went hiking on 28 February 2025.", source_message_ids=["m3"]),
            fact("The user is moving to Tokyo in 2026.", planned=True, object="move to Tokyo"),
            fact("The user adopted a dog in March 2025."),
        )
    )
    result = await extractor.extract(speaker_input())
    assert [f.content for f in result.facts] == [
        "The user went hiking on 28 February 2025.",
        "The user is moving to Tokyo in 2026.",
        "The user adopted a dog in March 2025.",
    ]


def test_standalone_check() -> None:
    assert not_standalone("The user is vegetarian.") is None
    assert not_standalone("The user's dog Rex is a beagle.") is None
    assert not_standalone("The user went to Paris on 7 May 2023.") is None
    assert not_standalone("Today the user is tired.") == "relative date"
    assert not_standalone("The user is tired today.") == "relative date"
    assert not_standalone("The user lived there a few years ago.") == "relative date"
    assert not_standalone("We love it.") == "first or second person"
    assert not_standalone("The user thanked us.") == "first or second person"
    assert not_standalone("Does the user like tea?") == "a question"


async def test_planned_facts_are_plans_never_the_current_value(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    fake_chat.script(
        with_facts(
            # The model files a move as the city lived in: it is a plan.
            fact(
                "The user is moving to Tokyo in 2026.",
                predicate="lives_in",
                object="Tokyo",
                planned=True,
                valid_from="2026",
            ),
            # "plans" means planned, whatever the flag says.
            fact(
                "The user plans to learn Japanese.",
                predicate="plans",
                object="learn Japanese",
                planned=False,
            ),
            # A plan without an object keeps its own, so two plans never look the same.
            fact(
                "The user will run a marathon in May 2025.",
                predicate="",
                object="",
                planned=True,
            ),
        )
    )
    result = await extractor.extract(speaker_input())
    tokyo, japanese, marathon = result.facts
    assert (tokyo.predicate, tokyo.object, tokyo.planned) == ("plans", "Tokyo", True)
    # A plan may hold from a date after it was said.
    assert tokyo.valid_from == datetime(2026, 1, 1, tzinfo=UTC)
    assert (japanese.predicate, japanese.object, japanese.planned) == (
        "plans",
        "learn Japanese",
        True,
    )
    assert japanese.valid_from == SENT["m1"]
    assert (marathon.predicate, marathon.planned) == ("plans", True)
    assert marathon.object == "the user will run a marathon in may 2025"


async def test_a_valid_standalone_fact_passes_with_valid_from_parsed(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    fake_chat.script(
        with_facts(
            fact(
                "The user went hiking on 28 February 2025.",
                category="profile",
                role="temporal",
                predicate="",
                object="",
                source_message_ids=["m3"],
                valid_from="2025-02-28",
            ),
            # No date named: valid from when it was said (the latest of its sources).
            fact(
                "The user lives in Singapore.",
                category="location",
                predicate="lives_in",
                object="Singapore",
                source_message_ids=["m1", "m2"],
            ),
            fact(
                "The user has been vegan since 2019.",
                predicate="diet",
                object="vegan",
                valid_from="2019",
            ),
            fact("The user joined a choir in January 2025.", valid_from="2025-01"),
            fact(
                "The user is a nurse.",
                predicate="occupation",
                object="nurse",
                valid_from="2025-02-20T10:00:00+01:00",
            ),
            # Not a date: the message's sent_at is used.
            fact("The user is left-handed.", valid_from="a while back"),
            # The same day as the message, in the sender's time zone: clamped to sent_at.
            fact("The user bought a bike on 1 March 2025.", valid_from="2025-03-01T18:00:00"),
            # A non-planned fact valid from well after it was said is a misread plan.
            fact(
                "The user works at Google.",
                predicate="works_at",
                object="Google",
                valid_from="2025-06-01",
            ),
        )
    )
    result = await extractor.extract(speaker_input())
    valid_from = {f.content: f.valid_from for f in result.facts}
    assert valid_from == {
        "The user went hiking on 28 February 2025.": datetime(2025, 2, 28, tzinfo=UTC),
        "The user lives in Singapore.": SENT["m2"],
        "The user has been vegan since 2019.": datetime(2019, 1, 1, tzinfo=UTC),
        "The user joined a choir in January 2025.": datetime(2025, 1, 1, tzinfo=UTC),
        "The user is a nurse.": datetime(2025, 2, 20, 9, 0, tzinfo=UTC),
        "The user is left-handed.": SENT["m1"],
        "The user bought a bike on 1 March 2025.": SENT["m1"],
    }
    hiking, singapore = result.facts[:2]
    assert (hiking.category, hiking.role, hiking.source_message_ids) == (
        "profile",
        "temporal",
        ("m3",),
    )
    assert (singapore.subject, singapore.predicate, singapore.object) == (
        "user",
        "lives_in",
        "Singapore",
    )
    assert not (singapore.historical or singapore.negated or singapore.planned)


async def test_subjects_are_the_user_or_someone_of_theirs(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    fake_chat.script(
        with_facts(
            fact(
                "The user is a nurse.", subject="The User", predicate="occupation", object="nurse"
            ),
            fact(
                "The user's wife Ana is a teacher.",
                subject="the user\u2019s wife Ana",
                predicate="occupation",
                object="teacher",
            ),
            fact("Ana is a teacher.", subject="Ana", predicate="occupation", object="teacher"),
            fact("The speaker is tall.", subject="speaker"),
            fact("The assistant is helpful.", subject="assistant"),
            fact("The user has a dog.", subject=""),
            # The wrong subject: the triple would rename the user "Maya"; the sentence stays.
            fact(
                "The user's daughter is named Maya.",
                subject="user",
                predicate="name",
                object="Maya",
            ),
            fact(
                "The user's dog Rex is a beagle.",
                subject="user",
                predicate="pet",
                object="dog Rex",
            ),
        )
    )
    result = await extractor.extract(speaker_input())
    assert [(f.content, f.subject, f.predicate, f.object) for f in result.facts] == [
        ("The user is a nurse.", "user", "occupation", "nurse"),
        ("The user's wife Ana is a teacher.", "user's wife Ana", "occupation", "teacher"),
        ("The user's daughter is named Maya.", "user", "", ""),
        ("The user's dog Rex is a beagle.", "user", "pet", "dog Rex"),
    ]


async def test_predicates_come_from_the_closed_list(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    fake_chat.script(
        with_facts(
            fact("The user lives in Lisbon.", predicate="Lives In", object="Lisbon"),
            fact("The user is tall.", predicate="is", object="tall"),
            fact("The user worked at IBM.", predicate="worked_at", object="IBM"),
            fact("The user likes jazz.", predicate="likes", object=""),
            fact(
                "The user used to be a teacher.",
                predicate="occupation",
                object="teacher",
                historical=True,
            ),
        )
    )
    result = await extractor.extract(speaker_input())
    assert [(f.predicate, f.object, f.historical) for f in result.facts] == [
        ("lives_in", "Lisbon", False),
        ("", "", False),  # not a predicate of the list: no triple
        ("worked_at", "IBM", True),  # a past predicate is historical
        ("", "", False),  # no object: no triple
        # A past value has the past predicate: it never reinforces the current one.
        ("was", "teacher", True),
    ]


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
    assert question["candidate"] == {
        "content": "The user lives in Singapore.",
        "subject": "user",
        "predicate": "lives_in",
        "object": "Singapore",
        "historical": False,
        "negated": False,
        "planned": False,
        "valid_from": "2025-03-01T09:31:00+00:00",
    }
    assert [s["id"] for s in question["stored"]] == [str(f.memory_id) for f in existing]
    assert question["stored"][0]["subject"] == "user"

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


async def test_decide_never_supersedes_another_subject_or_the_present_with_a_plan(
    fake_chat: FakeChat, extractor: OpenAIChatExtractor
) -> None:
    wife = ExistingFact(
        uuid.uuid4(),
        "The user's wife Ana lives in Delhi.",
        "user's wife Ana",
        "lives_in",
        "Delhi",
        0.8,
    )
    home = existing_facts()[0]
    moving = replace(
        CANDIDATE,
        content="The user is moving to Tokyo in 2026.",
        predicate="plans",
        object="move to Tokyo",
        planned=True,
        valid_from=datetime(2026, 1, 1, tzinfo=UTC),
    )
    fake_chat.script(
        chat({"decision": "conflict", "target_id": str(wife.memory_id), "reason": "moved"}),
        chat({"decision": "update", "target_id": str(home.memory_id), "reason": "moving"}),
        chat({"decision": "conflict", "target_id": str(home.memory_id), "reason": "moved"}),
    )
    other = await extractor.decide(CANDIDATE, [wife])
    assert other is not None and (other.decision, other.target_id) == (Decision.ADD, None)
    plan = await extractor.decide(moving, [home])
    assert plan is not None and (plan.decision, plan.target_id) == (Decision.ADD, None)
    asked = fake_chat.question()["candidate"]
    assert (asked["predicate"], asked["planned"]) == ("plans", True)
    assert asked["valid_from"] == "2026-01-01T00:00:00+00:00"
    # The same subject, not a plan: the model's conflict stands.
    moved = await extractor.decide(CANDIDATE, [home])
    assert moved is not None and (moved.decision, moved.target_id) == (
        Decision.CONFLICT,
        home.memory_id,
    )


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
