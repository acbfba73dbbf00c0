"""The extraction pipeline end to end: attribution, gate, guardrails, decisions, goals, personas."""

from __future__ import annotations

import pytest

from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import ASSISTANT, contents, ingest, msg, status


async def test_three_person_session_with_a_bot_attributes_each_fact(
    caller: Caller, drain, pool
) -> None:  # type: ignore[no-untyped-def]
    reply = await ingest(
        caller,
        [
            msg("alice", "Hi everyone, can you hear me?"),
            msg("alice", "I'm a vegetarian and my daughter is named Maya."),
            msg("bob", "I live in Singapore now."),
            msg("carol", "I work at Siemens."),
            msg("bot:notetaker", "I live in the cloud and I love minutes."),  # malformed id
            msg("agent-7", "I am an assistant and I live in a datacenter.", ASSISTANT),
        ],
    )
    assert await drain() >= 1
    done = await status(caller, reply.ingest_id)
    assert done.state == pb.INGEST_STATE_DONE, done.last_error
    assert done.outcome.speakers == 3
    assert done.outcome.added == 4
    assert done.outcome.messages_indexed == 6
    assert done.outcome.dropped_by_gates >= 1  # "can you hear me?"
    # The organizer receives only her own facts; each participant only theirs. One fact per
    # clause: the compound sentence is split.
    assert await contents(caller, "alice") == [
        "The user is a vegetarian.",
        "The user's daughter is named Maya.",
    ]
    assert await contents(caller, "bob") == ["The user lives in Singapore now."]
    assert await contents(caller, "carol") == ["The user works at Siemens."]
    assert await contents(caller, "bot:notetaker") == []
    assert await contents(caller, "agent-7") == []
    async with pool.acquire() as conn:
        users = {
            r["user_id"]
            for r in await conn.fetch(
                "SELECT DISTINCT user_id FROM memories WHERE tenant_id = $1", caller.tenant_id
            )
        }
        episodes = await conn.fetch(
            "SELECT user_id, session_id, array_length(source_message_ids, 1) AS n"
            " FROM episodes WHERE tenant_id = $1 ORDER BY user_id",
            caller.tenant_id,
        )
        embedded = await conn.fetchval(
            "SELECT count(*) FROM messages WHERE tenant_id = $1 AND embedding_state = 'ok'",
            caller.tenant_id,
        )
    assert users == {"alice", "bob", "carol"}
    assert [(e["user_id"], e["session_id"]) for e in episodes] == [
        ("alice", "s1"),
        ("bob", "s1"),
        ("carol", "s1"),
    ]
    assert embedded == 6


async def test_phatic_speech_yields_nothing(caller: Caller, drain, pool) -> None:  # type: ignore[no-untyped-def]
    reply = await ingest(
        caller,
        [msg("alice", t) for t in ("Hello? Can you hear me now?", "Thanks, bye!", "ok", "one sec")],
    )
    await drain()
    done = await status(caller, reply.ingest_id)
    assert done.state == pb.INGEST_STATE_DONE
    assert done.outcome.dropped_by_gates == 4
    assert done.outcome.added == 0 and done.outcome.episodes == 0
    assert await contents(caller) == []


async def test_exact_repeat_reinforces_without_quota(caller: Caller, drain, server) -> None:  # type: ignore[no-untyped-def]
    await ingest(caller, [msg("alice", "I'm allergic to peanuts.")])
    await drain()
    reply = await ingest(caller, [msg("alice", "I am allergic to peanuts")], session="s2")
    await drain()
    done = await status(caller, reply.ingest_id)
    assert (done.outcome.added, done.outcome.reinforced) == (0, 1)
    listed = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=pb.Scope(user_id="alice")))
    [fact] = listed.memories
    assert fact.reinforced_count == 1
    assert len(fact.source_message_ids) == 2


async def test_update_supersedes_and_history_keeps_the_old_value(caller: Caller, drain) -> None:  # type: ignore[no-untyped-def]
    await ingest(caller, [msg("alice", "I live in Delhi.")])
    await drain()
    reply = await ingest(caller, [msg("alice", "I just moved to Singapore!")], session="s2")
    await drain()
    done = await status(caller, reply.ingest_id)
    assert done.outcome.updated == 1
    assert await contents(caller) == ["The user just moved to Singapore."]
    assert await contents(caller, include_superseded=True) == [
        "The user just moved to Singapore.",
        "The user lives in Delhi.",
    ]
    listed = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=pb.Scope(user_id="alice")))
    history = await caller.stub.GetMemoryHistory(
        pb.GetMemoryHistoryRequest(
            scope=pb.Scope(user_id="alice"), memory_id=listed.memories[0].memory_id
        )
    )
    assert [v.content for v in history.versions] == [
        "The user lives in Delhi.",
        "The user just moved to Singapore.",
    ]
    old, new = history.versions
    assert old.status == pb.MEMORY_STATUS_SUPERSEDED and old.superseded_by_id == new.memory_id
    assert new.origin == "extraction" and new.supersedes_id == old.memory_id
    assert new.correction_reason.startswith("update")
    assert list(new.source_message_ids)


async def test_historical_statement_never_overwrites_the_current_one(caller: Caller, drain) -> None:  # type: ignore[no-untyped-def]
    await ingest(caller, [msg("alice", "I live in Singapore now.")])
    await drain()
    await ingest(caller, [msg("alice", "I lived in Delhi in 2022.")], session="s2")
    await drain()
    assert await contents(caller) == [
        "The user lived in Delhi in 2022.",
        "The user lives in Singapore now.",
    ]
    assert await contents(caller, include_superseded=True) == [
        "The user lived in Delhi in 2022.",
        "The user lives in Singapore now.",
    ]


async def test_negation_resolves_a_conflict(caller: Caller, drain) -> None:  # type: ignore[no-untyped-def]
    await ingest(caller, [msg("alice", "I'm vegetarian.")])
    await drain()
    reply = await ingest(caller, [msg("alice", "I'm not vegetarian anymore.")], session="s2")
    await drain()
    done = await status(caller, reply.ingest_id)
    assert done.outcome.conflicts_resolved == 1
    assert await contents(caller) == ["The user is not vegetarian anymore."]


async def test_goals_become_core_facts_of_the_owner_only(caller: Caller, drain) -> None:  # type: ignore[no-untyped-def]
    await ingest(
        caller,
        [msg("bob", "I work at Acme.")],
        goals=["Book a flight to Tokyo"],
        end_of_session=True,
    )
    await drain()
    listed = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=pb.Scope(user_id="alice")))
    [goal] = listed.memories
    assert goal.content == "Goal: Book a flight to Tokyo"
    assert (goal.role, goal.category, goal.confidence) == ("core", "goal", 1.0)
    assert await contents(caller, "bob") == ["The user works at Acme."]


async def test_counterpart_persona_stamps_every_row(caller: Caller, drain, pool) -> None:  # type: ignore[no-untyped-def]
    await ingest(caller, [msg("alice", "My dog's name is Rex.")], counterpart_persona_id="nova")
    await drain()
    assert await contents(caller, persona="nova") == ["The user's dog's name is Rex."]
    assert await contents(caller) == []
    async with pool.acquire() as conn:
        for table in ("memories", "episodes", "topics"):
            personas = {
                r["persona_id"]
                for r in await conn.fetch(
                    f"SELECT persona_id FROM {table} WHERE tenant_id = $1", caller.tenant_id
                )
            }
            assert personas == {"nova"}, table


async def test_topics_are_merged_into_the_users_own_topics(caller: Caller, drain, pool) -> None:  # type: ignore[no-untyped-def]
    await ingest(caller, [msg("alice", "I live in Oslo.")], session="s1")
    await ingest(caller, [msg("alice", "I love skiing near Oslo.")], session="s2")
    await ingest(caller, [msg("bob", "I live in Oslo.")], user="bob", session="s3")
    await drain()
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT user_id, name, weight FROM topics WHERE tenant_id = $1 ORDER BY user_id",
            caller.tenant_id,
        )
        edges = await conn.fetchval(
            "SELECT count(*) FROM topic_episodes WHERE tenant_id = $1 AND user_id = 'alice'",
            caller.tenant_id,
        )
    assert [(r["user_id"], r["name"], r["weight"]) for r in rows] == [
        ("alice", "Oslo", 2.0),
        ("bob", "Oslo", 1.0),
    ]
    assert edges == 2


@pytest.mark.parametrize("turns", [1, 3])
async def test_one_session_ingested_turn_by_turn_grows_one_episode(
    caller: Caller, drain, pool, turns: int
) -> None:  # type: ignore[no-untyped-def]
    for i in range(turns):
        await ingest(caller, [msg("alice", f"I love hiking trail number {i}.")])
        await drain()
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT array_length(source_message_ids, 1) AS n FROM episodes WHERE tenant_id = $1",
            caller.tenant_id,
        )
    assert [r["n"] for r in rows] == [turns]


async def test_messages_are_indexed_with_their_session_context(caller: Caller, drain, pool) -> None:  # type: ignore[no-untyped-def]
    words = ["apple", "banana", "cherry", "damson", "elder"]
    await ingest(
        caller,
        [msg("alice", f"I talked about {w}", message_id=f"c{i}") for i, w in enumerate(words)],
    )
    await drain()

    async def context(message_id: str) -> dict[str, str]:
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT lexeme, weights FROM messages, unnest(context_tsv)"
                " WHERE tenant_id = $1 AND message_id = $2",
                caller.tenant_id,
                message_id,
            )
        return {r["lexeme"]: "".join(sorted(r["weights"])) for r in rows}

    middle = await context("c2")
    assert middle["cherri"] == "A"
    assert middle["banana"] == "B" and middle["damson"] == "B"
    assert middle["appl"] == "C" and middle["elder"] == "C"
    # Each unit names its speaker ("alice said, ..."); the day it was said is not indexed.
    assert "A" in middle["alic"] and "said" in middle
    assert not any(lexeme.isdigit() for lexeme in middle), middle
    # A later turn of the same session reaches back into the two before it.
    await ingest(caller, [msg("alice", "I talked about fig", message_id="c5")])
    await drain()
    assert (await context("c4")).get("fig") == "B"
    assert (await context("c3")).get("fig") == "C"
    assert "fig" not in await context("c2")


async def test_a_growing_episode_keeps_the_vector_of_its_head(
    caller: Caller, drain, pool, embedder
) -> None:  # type: ignore[no-untyped-def]
    said = [
        "I live in Porto and I work at a bakery near the river.",
        "My brother Tiago moved to Lisbon last year for a job at a bank.",
        "We adopted a cat named Nata two weeks ago.",
        "I'm training for the Porto marathon in November and I run every morning.",
        "My best friend Rita is a nurse at the children's hospital downtown.",
        "My mom is a retired teacher who loves gardening.",
        "I started learning the guitar in January.",
    ]
    for i, text in enumerate(said):
        await ingest(caller, [msg("alice", text, message_id=f"m{i}")])
        await drain()
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT title, summary, embedding FROM episodes WHERE tenant_id = $1",
            caller.tenant_id,
        )
    assert len(row["summary"]) > 300  # the summary grew past the part its vector is made of
    [expected] = await embedder.embed([f"{row['title']}. {row['summary']}"[:300]], timeout_s=10)
    assert float(expected @ row["embedding"].to_numpy()) > 0.999
