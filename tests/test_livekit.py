"""The LiveKit Agents integration (memsvc.client.livekit) in a real, in-process AgentSession
(no LiveKit server: a scripted STT and LLM, tests/livekit_fakes.py) against the real memsvc of
the test session. Each user turn ends through LiveKit's own audio-recognition path (STT end of
speech), which calls ``Agent.on_user_turn_completed``: the packet and the turn's memories reach
the LLM's context, interims go through RecallStream, finished messages are ingested, and a
memsvc that is down costs the turn its memory, not its reply."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

import asyncpg
import pytest
from livekit.agents import Agent, llm

from memsvc.client import MemoryClient
from memsvc.client.builders import scope
from memsvc.client.livekit import PACKET_HEADER, RECALL_HEADER, MemsvcAgent, MemsvcMemory
from memsvc.server.app import MemsvcServer
from tests.conftest import Caller
from tests.livekit_fakes import Replies, ScriptedLLM, ScriptedSTT, scripted_session
from tests.test_cli_dev import free_port
from tests.test_explicit_memory import remember
from tests.voice_helpers import ahead_used, messages_stored

# Generous for a shared test machine: what reaches the context is the point, not speed.
TURN_TIMEOUT_S = 5.0
QUESTION = "what is my daughter called"
INSTRUCTIONS = "You are a helpful voice assistant."


@pytest.fixture
async def client(
    server: MemsvcServer, caller: Caller, drain: Callable[[], Awaitable[int]]
) -> AsyncIterator[MemoryClient]:
    async with MemoryClient(f"127.0.0.1:{server.port}", api_key=caller.key) as c:
        yield c
    # Closed: every turn is ingested. Their extraction jobs run now, not in a later test that
    # drains the outbox and counts only its own jobs (tests/test_llm_extraction_rules.py).
    await drain()


def memory_for(client: MemoryClient, **options: object) -> MemsvcMemory:
    return MemsvcMemory(
        client,
        scope("alice"),
        session_id="room-1",
        recall_timeout_s=TURN_TIMEOUT_S,
        prefetch_timeout_s=TURN_TIMEOUT_S,
        **options,  # type: ignore[arg-type]
    )


async def converse(
    memory: MemsvcMemory | None,
    agent: Agent,
    utterances: Sequence[str],
    replies: Sequence[str],
    *,
    interims: bool = True,
) -> list[llm.ChatContext]:
    """Run one session: the user says each utterance after the last reply; the chat contexts
    the LLM was given, one per turn."""
    model = ScriptedLLM(replies)
    ears = ScriptedSTT(interims=interims)
    async with scripted_session(model, ears) as session:
        if memory is not None:
            memory.attach(session)
        heard = Replies(session)
        await session.start(agent)
        for text, reply in zip(utterances, replies, strict=True):
            ears.speak(text)
            async with asyncio.timeout(3 * TURN_TIMEOUT_S):
                assert await heard.next_reply() == reply
    return model.contexts


def texts(ctx: llm.ChatContext) -> list[str]:
    return [m.text_content or "" for m in ctx.messages()]


async def test_the_packet_and_the_turns_memories_reach_the_llm_context(
    caller: Caller, client: MemoryClient, pool: asyncpg.Pool
) -> None:
    await remember(caller, "Daughter is named Maya")
    memory = memory_for(client)
    before = ahead_used()

    contexts = await converse(
        memory, MemsvcAgent(memory, instructions=INSTRUCTIONS), [QUESTION], ["Maya."]
    )

    assert len(contexts) == 1
    messages = texts(contexts[0])
    # The packet right after the instructions; the turn's memories right before the user's
    # message; both as data.
    assert messages[0] == INSTRUCTIONS
    assert messages[1].startswith(PACKET_HEADER) and "Maya" in messages[1]
    assert messages[-2].startswith(RECALL_HEADER) and "Daughter is named Maya" in messages[-2]
    assert messages[-1] == QUESTION
    # The interims went through RecallStream, and the final was answered from them.
    assert ahead_used() == before + 1
    # The user's message was handed to the background ingest at its turn, the reply at the
    # session's close; both are stored once the client has flushed its queue.
    assert client.ingest_stats.submitted == 2
    await memory.aclose()
    await client.aclose()
    assert client.ingest_stats.sent == 2
    assert sorted(await messages_stored(pool, caller.tenant_id)) == [
        ("alice", QUESTION),
        ("assistant", "Maya."),
    ]


async def test_each_turn_replaces_the_last_memories_and_every_message_is_ingested(
    caller: Caller, client: MemoryClient, pool: asyncpg.Pool
) -> None:
    await remember(caller, "Daughter is named Maya")
    await remember(caller, "Plays the cello on Sundays")
    memory = memory_for(client, use_interims=False)
    second = "what instrument do I play"
    before = ahead_used()

    contexts = await converse(
        memory,
        MemsvcAgent(memory, instructions=INSTRUCTIONS),
        [QUESTION, second],
        ["Her name is Maya.", "The cello."],
        interims=False,
    )

    assert len(contexts) == 2
    first_recalled = [m for m in texts(contexts[0]) if m.startswith(RECALL_HEADER)]
    assert len(first_recalled) == 1 and "Maya" in first_recalled[0]
    messages = texts(contexts[1])
    # One packet and one memory message, this turn's, just before this turn's question,
    # after the first exchange.
    assert sum(m.startswith(PACKET_HEADER) for m in messages) == 1
    recalled = [m for m in messages if m.startswith(RECALL_HEADER)]
    assert len(recalled) == 1 and "cello" in recalled[0]
    assert messages[-4:] == [QUESTION, "Her name is Maya.", recalled[0], second]
    # Without interims each turn is a plain Recall.
    assert ahead_used() == before
    await memory.aclose()
    await client.aclose()
    assert sorted(await messages_stored(pool, caller.tenant_id)) == sorted(
        [
            ("alice", QUESTION),
            ("assistant", "Her name is Maya."),
            ("alice", second),
            ("assistant", "The cello."),
        ]
    )


@contextmanager
def silent_server() -> Iterator[str]:
    """An address that takes connections and never answers: a stalled memsvc."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


@contextmanager
def refusing_server() -> Iterator[str]:
    """Nothing listens there: every call fails at once (UNAVAILABLE after its retries)."""
    yield f"127.0.0.1:{free_port()}"


@pytest.mark.parametrize("memsvc", [refusing_server, silent_server], ids=["down", "stalled"])
async def test_memsvc_down_or_stalled_the_turn_gets_its_reply_without_memory(
    memsvc: Callable[[], AbstractContextManager[str]], caplog: pytest.LogCaptureFixture
) -> None:
    with memsvc() as address:
        async with MemoryClient(address, api_key="k") as unusable:
            memory = memory_for(unusable)
            memory.recall_timeout_s = 0.2
            memory.prefetch_timeout_s = 0.2
            with caplog.at_level(logging.WARNING, logger="memsvc.client.call_memory"):
                contexts = await converse(
                    memory, MemsvcAgent(memory, instructions=INSTRUCTIONS), [QUESTION], ["Hi!"]
                )
                await memory.aclose()
    assert [texts(c) for c in contexts] == [[INSTRUCTIONS, QUESTION]]
    assert any(
        r.name == "memsvc.client.call_memory" and "without memory" in r.getMessage()
        for r in caplog.records
    )
