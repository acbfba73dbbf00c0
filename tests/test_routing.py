"""Query routing: the classifier, the dates a query names, the route effects on the final
ordering (pure), and the effects end to end over gRPC with MEMSVC_ROUTING on and off."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from memsvc.config import ConfigError, Settings
from memsvc.embedding import Embedder
from memsvc.retrieval import route, route_effects
from memsvc.retrieval.fusion import rrf
from memsvc.retrieval.query import Hit, ItemKind
from memsvc.retrieval.query_dates import Period, periods
from memsvc.retrieval.ranking import final_order
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.read_helpers import StartServer, dscope, recall, seed_messages, stub_for
from tests.read_helpers import start_server as start_server  # fixture

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
ROLES = ("core", "context", "detail", "temporal", "causal")
MESSAGE = pb.ITEM_TYPE_MESSAGE


def day(y: int, m: int, d: int) -> datetime:
    return datetime(y, m, d, tzinfo=UTC)


# -- classifier ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "question",
    [
        "When did Caroline go to the LGBTQ support group?",
        "What year did John start surfing?",
        "Which month was John in Italy?",
        "In which month's game did John achieve a career-high score?",
        "How long ago was Caroline's 18th birthday?",
        "What did Nate do for Joanna on 25 May, 2022?",
        "What setback did Melanie face in October 2023?",
        "Which outdoor spot did Joanna visit in May?",
        "what did I tell you yesterday about the move",
        "what did we talk about last week",
        "the thing my sister said before the wedding",  # temporal wins over relationship
    ],
)
def test_temporal_questions(question: str) -> None:
    assert route.classify(question) == route.TEMPORAL


@pytest.mark.parametrize(
    "question",
    [
        "What is my daughter's name?",
        "What country is Caroline's grandma from?",
        "What activity did John's colleague, Rob, invite him to?",
        "How does my boss take his coffee?",
        "Why did Maria need to help her cousin find a new place to live?",
    ],
)
def test_relationship_questions(question: str) -> None:
    assert route.classify(question) == route.RELATIONSHIP


@pytest.mark.parametrize(
    "question",
    [
        "favourite food",
        "may I ask what she drinks in the morning",  # "may" the modal, not the month
        "Did the protesters march on the capital?",  # "march" the verb
        "What kind of pot did Mel make?",
        "Who looks after the dog?",  # "after" without time
        "What is Tim's favourite book?",
        "What did Maria donate her car to?",
    ],
)
def test_near_misses_are_plain_facts(question: str) -> None:
    assert route.classify(question) == route.FACT


def test_no_text_is_the_vector_route() -> None:
    assert route.classify("") == route.VECTOR
    assert route.classify("   ") == route.VECTOR


@pytest.mark.parametrize(
    ("question", "asks"),
    [
        ("When did Melanie run a charity race?", True),
        ("what year did John start surfing", True),
        ("In which month did Tim visit the UK?", True),
        ("How long has Tim been playing the piano?", True),
        ("And when is the dentist appointment?", True),
        # Mentions a time but asks for something else.
        ("What did Nate do for Joanna on 25 May, 2022?", False),
        ("What did Caroline do when she was young?", False),
        ("What movie has Nate recently seen?", False),
    ],
)
def test_asks_when(question: str, asks: bool) -> None:
    assert route.asks_when(question) is asks


# -- dates in a query ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("on 25 May, 2022", [(day(2022, 5, 25), day(2022, 5, 26))]),
        ("on May 23, 2023", [(day(2023, 5, 23), day(2023, 5, 24))]),
        ("on 8th December, 2023", [(day(2023, 12, 8), day(2023, 12, 9))]),
        ("the 3rd of Sept 2021", [(day(2021, 9, 3), day(2021, 9, 4))]),
        ("in December 2023", [(day(2023, 12, 1), day(2024, 1, 1))]),
        ("in February, 2024", [(day(2024, 2, 1), day(2024, 3, 1))]),
        ("back in 2019", [(day(2019, 1, 1), day(2020, 1, 1))]),
        (
            "between March 2022 and 2023",
            [(day(2022, 3, 1), day(2022, 4, 1)), (day(2023, 1, 1), day(2024, 1, 1))],
        ),
    ],
)
def test_periods_named_by_a_query(text: str, expected: list[tuple[datetime, datetime]]) -> None:
    assert [(p.start, p.end) for p in periods(text)] == expected


@pytest.mark.parametrize(
    "text",
    [
        "what did she do in May",
        "may I ask",
        "order 12345 shipped",
        "room 2500",
        "call 555 2020 1",
        "",
    ],
)
def test_no_period(text: str) -> None:
    assert periods(text) == ()


def test_an_impossible_day_falls_back_to_its_month() -> None:
    assert periods("on 30 February 2023") == (Period(day(2023, 2, 1), day(2023, 3, 1)),)


def test_period_slack() -> None:
    p = Period(day(2023, 5, 8), day(2023, 5, 9))
    kw = {"slack_before": timedelta(days=1), "slack_after": timedelta(days=7)}
    assert p.contains(day(2023, 5, 8) + timedelta(hours=13), **kw)
    assert p.contains(day(2023, 5, 7) + timedelta(hours=1), **kw)
    assert p.contains(day(2023, 5, 15), **kw)
    assert not p.contains(day(2023, 5, 16) + timedelta(hours=1), **kw)
    assert not p.contains(day(2023, 5, 6), **kw)


# -- route effects on the ordering (pure) --------------------------------------------------


def msg(id_: str, text: str, at: datetime) -> Hit:
    return Hit(
        kind=ItemKind.MESSAGE,
        id=id_,
        text=text,
        session_id="s1",
        occurred_at=at,
        scope=Scope("t1", "alice"),
        shared_all_agents=False,
        shared_all_personas=False,
        score=0.0,
    )


def order(hits: list[Hit], query: str, *, enabled: bool = True) -> list[str]:
    fused = rrf({"lexical": hits}, k=10)
    plan = route_effects.plan(query, enabled=enabled)
    return [r.fused.hit.id for r in final_order(fused, now=NOW, role_order=ROLES, plan=plan)]


def test_a_named_date_favours_items_from_that_period() -> None:
    hits = [
        msg("wrong-day", "I made pottery with the kids", day(2023, 6, 20)),
        msg("that-day", "Pottery class was fun", day(2023, 5, 25)),
        msg("week-after", "Told you about the pottery", day(2023, 5, 30)),
    ]
    query = "What did Melanie make on 25 May, 2023?"
    assert order(hits, query) == ["that-day", "week-after", "wrong-day"]
    # Routing off: relevance alone.
    assert order(hits, query, enabled=False) == ["wrong-day", "that-day", "week-after"]


def test_a_when_question_favours_items_that_say_when() -> None:
    hits = [
        msg("about", "Charity races are such a good cause, I love them", day(2023, 5, 20)),
        msg("says-when", "I ran a charity race last Saturday", day(2023, 5, 20)),
    ]
    assert order(hits, "When did Melanie run a charity race?") == ["says-when", "about"]
    assert order(hits, "When did Melanie run a charity race?", enabled=False) == [
        "about",
        "says-when",
    ]
    # Asking what, not when: no effect.
    assert order(hits, "What race did Melanie run recently?") == ["about", "says-when"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("I ran a charity race last Saturday", True),
        ("We moved here back in 2019", True),
        ("Got back from Paris three weeks ago", True),
        ("We are going in May", True),
        ("It opens on 3 March", True),
        ("I'll start next month", True),
        ("Yesterday's hike was amazing", True),
        ("I may go, we'll see", False),
        ("They march on and on", False),
        ("My son is 3 and loves trains", False),
        ("Order 20155 shipped", False),
        ("Charity races are such a good cause", False),
    ],
)
def test_states_time(text: str, says: bool) -> None:
    assert route_effects.states_time(text) is says


def test_routes_without_a_kept_effect_are_neutral() -> None:
    hit = msg("m", "My mom visited last Saturday, 25 May 2023", day(2023, 5, 25))
    for query in ("What did my mom bring?", "favourite food", "", "what happened recently"):
        assert route_effects.plan(query).factor(hit) == 1.0
    off = route_effects.plan("When did my mom visit on 25 May 2023?", enabled=False)
    assert off.route == route.TEMPORAL and off.factor(hit) == 1.0
    on = route_effects.plan("When did my mom visit on 25 May 2023?")
    assert on.factor(hit) == 1.0 + on.weights.date_weight + on.weights.when_weight


def test_routing_setting() -> None:
    assert Settings().routing is True
    assert Settings.from_env({"MEMSVC_ROUTING": "off"}).routing is False
    assert Settings.from_env({"MEMSVC_ROUTING": "on"}).routing is True
    with pytest.raises(ConfigError, match="MEMSVC_ROUTING"):
        Settings.from_env({"MEMSVC_ROUTING": "sometimes"})


# -- end to end ----------------------------------------------------------------------------


async def test_routing_end_to_end_on_and_off(
    caller: Caller, pool: asyncpg.Pool, embedder: Embedder, start_server: StartServer
) -> None:
    scope = dscope(caller)
    # The same story told twice: the better text match on the wrong date, the weaker one on
    # the date the question names.
    await seed_messages(
        pool,
        embedder,
        scope,
        ["Caroline said she cooks lasagna and Caroline loves to cook lasagna"],
        session_id="june",
        start=day(2025, 6, 2),
    )
    await seed_messages(
        pool,
        embedder,
        scope,
        ["Cooked lasagna for everyone"],
        session_id="march",
        start=day(2025, 3, 14),
    )
    query = "What did Caroline cook on 14 March 2025?"
    on = await recall(caller, query, types=[MESSAGE])
    assert on.route == "temporal"
    assert [i.session_id for i in on.items] == ["march", "june"]

    _, channel = await start_server(routing=False)
    off_stub = stub_for(channel, caller)
    off = await off_stub.Recall(
        pb.RecallRequest(scope=pb.Scope(user_id="alice"), query=query, types=[MESSAGE])
    )
    assert off.route == "temporal"  # still reported
    assert [i.session_id for i in off.items] == ["june", "march"]
