"""Issue 29 item 6: episodes and packets read well. An episode's title says what the
conversation was about, in the speaker's casing ("Moving to Porto", never "The user on
lisbon"), with the speaker's name when the caller sends one ("Dana's move to Porto"); its
topics are the specific things talked about, cased as said ("Porto", "Stripe job", "Luna"),
never a category ("work"); Prefetch lists a session among "earlier conversations (finished
sessions …)" only once it is over: ended by Ingest end_of_session, or idle past
MEMSVC_SESSION_IDLE_S."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from memsvc.config import ConfigError, Settings
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import ASSISTANT, USER, ingest, msg
from tests.read_helpers import prefetch, pscope

Drain = Callable[[], Awaitable[int]]

# Everyday conversations (the speaker's turns of one session) and the title each must get.
CONVERSATIONS = {
    "porto": (
        ["We moved to Porto last month.", "The kids love the beach there."],
        "Moving to Porto",
    ),
    "stripe": (["I got a new job at Stripe, I start Monday."], "Getting a new job at Stripe"),
    "luna": (["My cat Luna passed away this morning."], "Luna passing away"),
    "google": (
        ["I don't work at Google anymore, I switched to a clinic."],
        "No longer working at Google",
    ),
    "marathon": (
        ["I'm training for the Lisbon marathon in April.", "My knee hurts a bit though."],
        "Training for the Lisbon marathon",
    ),
    "rita": (["My sister Rita lives in Madrid and she is a teacher."], "Rita living in Madrid"),
    "alps": (["I love hiking in the Alps with my brother."], "Hiking in the Alps with"),
    "broadway": (
        ["We went to see Hamilton on Broadway last Friday, it was amazing!"],
        "Going to see Hamilton on Broadway",
    ),
    "japan": (
        ["I'm planning a trip to Japan with my wife Sara next spring."],
        "Planning a trip to Japan",
    ),
    # A time that is the object is what happened, not a date to leave out.
    "chess": (["I just had a bad day at the chess club."], "Having a bad day at the chess club"),
    # A correction: what was taken back is not the title ("Saying Boston"), nor a value
    # denied ("Being 43 34", "Living in Austin Boston").
    "austin": (["I said Boston earlier but I meant Austin."], "Correcting Boston to Austin"),
    "age": (["I'm 43, not 34."], "Being 43"),
    "denied": (["I live in Austin, not Boston."], "Living in Austin"),
}
# Titles that must be exactly these (the others may go on: "Hiking in the Alps with ...").
WHOLE_TITLES = {"austin", "age", "denied"}


# The same conversations with the speaker's name sent (Message.sender_name = "Dana").
NAMED_TITLES = {
    "porto": "Dana's move to Porto",
    "stripe": "Dana getting a new job at Stripe",
    "luna": "Dana's cat Luna passing away",
    "google": "Dana no longer working at Google",
    "marathon": "Dana training for the Lisbon marathon",
    "rita": "Dana's sister Rita living in Madrid",
    "japan": "Dana planning a trip to Japan",
    "austin": "Dana correcting Boston to Austin",
}

# Everyday conversations and topics each must have (among at most four).
TOPICS = {
    "porto": (["We moved to Porto last month.", "The kids love the beach there."], {"Porto"}),
    "stripe": (["I got a new job at Stripe, I start Monday."], {"Stripe job"}),
    "luna": (["My cat Luna passed away this morning."], {"Luna"}),
    "bread": (["Yesterday I baked sourdough bread for the first time."], {"sourdough bread"}),
    "japan": (
        ["I'm planning a trip to Japan with my wife Sara next spring."],
        {"Japan trip", "Sara"},
    ),
    "guitar": (
        ["I've been learning to play the guitar.", "My teacher says I'm getting better."],
        {"guitar"},
    ),
    "hospital": (
        ["I'm Dana and I work as a nurse at Santa Maria hospital."],
        {"Santa Maria hospital"},
    ),
    # No fact in it: what was talked about still names it.
    "sailing": (["Can you recommend a good book about sailing?"], {"sailing"}),
}
# The categories topics used to be.
CATEGORIES = {
    "identity",
    "food and diet",
    "interests",
    "family",
    "home and places",
    "work",
    "plans and goals",
    "notes",
    "events and experiences",
    "conversation",
    "location",
}


def _at(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


async def test_episode_titles_are_cased_and_name_the_subject(caller: Caller, drain: Drain) -> None:
    for session, (texts, _) in CONVERSATIONS.items():
        await ingest(caller, [msg("alice", t) for t in texts], session=session)
    await drain()
    reply = await caller.stub.ListEpisodes(pb.ListEpisodesRequest(scope=pscope(), page_size=50))
    titles = {e.session_id: e.title for e in reply.episodes}
    assert set(titles) == set(CONVERSATIONS)
    for session, (_, expected) in CONVERSATIONS.items():
        title = titles[session]
        assert title.startswith(expected), (session, title)
        assert session not in WHOLE_TITLES or title == expected, (session, title)
        assert not title.lower().startswith("the user on"), title
        assert title[0].isupper(), title
        # The date is the episode's, not part of its title.
        assert "2026" not in title and "December" not in title, title


async def test_titles_name_the_speaker_when_the_caller_sends_a_name(
    caller: Caller, drain: Drain
) -> None:
    for session in NAMED_TITLES:
        texts, _ = CONVERSATIONS[session]
        named = [msg("alice", t) for t in texts]
        for m in named:
            m.sender_name = "Dana"
        await ingest(caller, named, session=session)
    await drain()
    reply = await caller.stub.ListEpisodes(pb.ListEpisodesRequest(scope=pscope(), page_size=50))
    titles = {e.session_id: e.title for e in reply.episodes}
    for session, expected in NAMED_TITLES.items():
        assert titles[session].startswith(expected), (session, titles[session])
        assert "the user" not in titles[session], titles[session]


async def _topics(caller: Caller, user: str = "alice") -> dict[str, list[str]]:
    reply = await caller.stub.ListEpisodes(
        pb.ListEpisodesRequest(scope=pb.Scope(user_id=user), page_size=50)
    )
    return {e.session_id: list(e.topics) for e in reply.episodes}


async def test_episode_topics_are_cased_and_specific(caller: Caller, drain: Drain) -> None:
    for session, (texts, _) in TOPICS.items():
        await ingest(caller, [msg("alice", t) for t in texts], session=session)
    await drain()
    topics = await _topics(caller)
    assert set(topics) == set(TOPICS)
    for session, (texts, expected) in TOPICS.items():
        found = topics[session]
        assert expected <= set(found), (session, found)
        assert 1 <= len(found) <= 4, (session, found)
        assert not CATEGORIES & {t.casefold() for t in found}, (session, found)
        said = " ".join(texts)
        for topic in found:
            # Cased as said: the words are the speaker's own, with their capitals.
            assert all(word in said for word in topic.split()), (session, topic)
    # The speaker's own name is who talked, not a topic.
    assert "Dana" not in topics["hospital"]


async def test_a_topic_talked_about_again_is_one_topic(caller: Caller, drain: Drain, pool) -> None:  # type: ignore[no-untyped-def]
    await ingest(caller, [msg("alice", "We moved to Porto last month.")], session="a")
    await ingest(caller, [msg("alice", "I found a great bakery in Porto.")], session="b")
    # The same words from another user are that user's topic, not alice's.
    await ingest(caller, [msg("bob", "I live in Porto.")], user="bob", session="c")
    await drain()
    assert "Porto" in (await _topics(caller))["a"]
    assert "Porto" in (await _topics(caller))["b"]
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT user_id, weight FROM topics WHERE tenant_id = $1 AND name = 'Porto'"
            " ORDER BY user_id",
            caller.tenant_id,
        )
    assert [(r["user_id"], r["weight"]) for r in rows] == [("alice", 2.0), ("bob", 1.0)]


async def test_prefetch_reaches_an_old_conversation_by_its_topic(
    caller: Caller, drain: Drain
) -> None:
    # The oldest of eleven conversations is the one the hint names: its topic ("Luna") is
    # what the walk from the hint finds, whatever is more recent (the packet lists the
    # episodes it keeps newest first).
    await ingest(caller, [msg("alice", "My cat Luna passed away this morning.")], session="luna")
    later = [
        "We went to see Hamilton on Broadway last Friday.",
        "I adopted a parrot named Kiwi.",
        "I repainted my kitchen yellow.",
        "I started running with a club in Lisbon.",
        "I baked sourdough bread for the first time.",
        "I've been learning to play the guitar.",
        "I visited my aunt in Toronto.",
        "I sold my old bike to a neighbour.",
        "I bought a new tent for camping.",
        "I finished reading a novel by Murakami.",
    ]
    for n, text in enumerate(later):
        await ingest(caller, [msg("alice", text)], session=f"later-{n}")
    await drain()
    reply = await prefetch(caller, hint="How are you holding up after losing Luna?")
    assert reply.episodes, reply.text
    shown = [e.session_id for e in reply.episodes]
    # The walk keeps MEMSVC_PREFETCH_EPISODES (8) of the eleven: by recency alone, never Luna's.
    assert len(shown) < 11, shown
    assert "luna" in shown, [e.title for e in reply.episodes]


async def test_prefetch_lists_only_finished_sessions(caller: Caller, drain: Drain) -> None:
    now = datetime.now(UTC)

    def said(text: str, minutes_ago: float, role: int = USER) -> pb.Message:
        return pb.Message(
            message_id=f"m-{uuid.uuid4().hex[:10]}",
            sender_id="alice" if role == USER else "bot",
            role=role,  # type: ignore[arg-type]
            text=text,
            sent_at=_at(now - timedelta(minutes=minutes_ago)),
        )

    # Ended by the client a minute ago: finished.
    await ingest(
        caller, [said("I adopted a parrot named Kiwi.", 3)], session="ended", end_of_session=True
    )
    # Never ended, quiet for two hours (past MEMSVC_SESSION_IDLE_S, 30 min): finished.
    await ingest(caller, [said("I repainted my kitchen yellow.", 120)], session="idle")
    # The call under way: its user spoke a minute ago and it was not ended.
    await ingest(caller, [said("I just booked a flight to Oslo.", 1)], session="live")
    await drain()

    reply = await prefetch(caller, session_id="live")
    listed = sorted(e.session_id for e in reply.episodes)
    assert listed == ["ended", "idle"], reply.text
    assert "Oslo" not in reply.text.split("Earlier conversations")[-1], reply.text
    assert (reply.counts.episodes.total, reply.counts.episodes.shown) == (2, 2)
    # Its fact is still known: only its episode is not an earlier conversation yet.
    assert "Oslo" in reply.text

    # The session ends: from then on it is an earlier conversation (the cached packet goes).
    await ingest(
        caller,
        [said("Have a good trip!", 0, role=ASSISTANT)],
        session="live",
        end_of_session=True,
    )
    await drain()
    after = await prefetch(caller, session_id="next-call")
    assert sorted(e.session_id for e in after.episodes) == ["ended", "idle", "live"], after.text


@pytest.mark.parametrize("idle", ["0", "-5"])
def test_session_idle_must_be_positive(idle: str) -> None:
    with pytest.raises(ConfigError, match="MEMSVC_SESSION_IDLE_S"):
        Settings.from_env({"MEMSVC_SESSION_IDLE_S": idle})
