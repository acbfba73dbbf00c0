"""The Pipecat integration (memsvc.client.pipecat) in Pipecat's own test pipeline
(pipecat.tests.utils.run_test) against the real memsvc of the test session: the packet and
each turn's memories reach the LLM context, interims go through RecallStream, finished turns
are ingested, and a memsvc that is down costs the turn its memory, not the turn."""

from __future__ import annotations

import logging
import warnings
from collections.abc import AsyncIterator, Sequence

import asyncpg
import pytest

with warnings.catch_warnings():
    # Pipecat's audio utilities import the standard library's audioop, deprecated in 3.11:
    # not memsvc's warning to fix (every other warning still fails the suite).
    warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
    from pipecat.frames.frames import (
        Frame,
        InterimTranscriptionFrame,
        LLMContextFrame,
        TranscriptionFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.tests.utils import run_test

from memsvc.client import MemoryClient
from memsvc.client.builders import scope
from memsvc.client.pipecat import PACKET_HEADER, RECALL_HEADER, MemsvcMemory
from memsvc.server.app import MemsvcServer
from tests.conftest import Caller
from tests.test_cli_dev import free_port
from tests.test_explicit_memory import remember
from tests.voice_helpers import ahead_used, messages_stored

# Generous for a shared test machine: what reaches the context is the point, not speed.
TURN_TIMEOUT_S = 5.0
QUESTION = "what is my daughter called"


@pytest.fixture
async def client(server: MemsvcServer, caller: Caller) -> AsyncIterator[MemoryClient]:
    async with MemoryClient(f"127.0.0.1:{server.port}", api_key=caller.key) as c:
        yield c


def memory_for(client: MemoryClient, **options: object) -> MemsvcMemory:
    return MemsvcMemory(
        client,
        scope("alice"),
        session_id="call-1",
        recall_timeout_s=TURN_TIMEOUT_S,
        prefetch_timeout_s=TURN_TIMEOUT_S,
        **options,  # type: ignore[arg-type]
    )


def spoken(words: str) -> list[Frame]:
    """An STT's frames for one utterance: an interim per word, then the final."""
    parts = words.split()
    frames: list[Frame] = [
        InterimTranscriptionFrame(text=" ".join(parts[:n]), user_id="alice", timestamp="")
        for n in range(1, len(parts))
    ]
    frames.append(TranscriptionFrame(text=words, user_id="alice", timestamp=""))
    return frames


def turn(context: LLMContext, text: str) -> LLMContextFrame:
    """What the user aggregator sends the LLM at the end of the user's turn."""
    context.add_message({"role": "user", "content": text})
    return LLMContextFrame(context=context)


def contents(frame: Frame) -> list[str]:
    assert isinstance(frame, LLMContextFrame)
    return [str(m.get("content")) for m in frame.context.get_messages() if isinstance(m, dict)]


async def run(memory: MemsvcMemory, frames: Sequence[Frame]) -> list[Frame]:
    down, _up = await run_test(
        Pipeline([memory.transcripts, memory.context]),
        frames_to_send=frames,
        start_timeout=TURN_TIMEOUT_S,
    )
    return [f for f in down if isinstance(f, LLMContextFrame)]


async def test_the_packet_and_the_turns_memories_reach_the_llm_context(
    caller: Caller, client: MemoryClient, pool: asyncpg.Pool
) -> None:
    await remember(caller, "Daughter is named Maya")
    memory = memory_for(client)
    context = LLMContext([{"role": "system", "content": "You are a helpful voice assistant."}])
    before = ahead_used()

    frames = await run(memory, [*spoken(QUESTION), turn(context, QUESTION)])

    assert len(frames) == 1
    messages = contents(frames[0])
    # The packet right after the system prompt; the turn's memories right before the
    # user's message; both as data.
    assert messages[0] == "You are a helpful voice assistant."
    assert messages[1].startswith(PACKET_HEADER) and "Maya" in messages[1]
    assert messages[-2].startswith(RECALL_HEADER) and "Daughter is named Maya" in messages[-2]
    assert messages[-1] == QUESTION
    # The interims went through RecallStream, and the final was answered from them.
    assert ahead_used() == before + 1
    # The finished user turn was ingested in the background (flushed when the client closes).
    await client.aclose()
    assert client.ingest_stats.sent == 1
    assert await messages_stored(pool, caller.tenant_id) == [("alice", QUESTION)]


async def test_each_turn_replaces_the_last_memories_and_the_reply_is_ingested(
    caller: Caller, client: MemoryClient, pool: asyncpg.Pool
) -> None:
    await remember(caller, "Daughter is named Maya")
    await remember(caller, "Plays the cello on Sundays")
    memory = memory_for(client, use_interims=False)
    context = LLMContext([{"role": "system", "content": "You are a helpful voice assistant."}])
    first = turn(context, QUESTION)
    # The LLM answered and the assistant aggregator added the reply before the next turn.
    reply = {"role": "assistant", "content": "Her name is Maya."}
    second_question = "what instrument do I play"

    async def second() -> LLMContextFrame:
        context.add_message(reply)
        return turn(context, second_question)

    frames = await run(memory, [first])
    memories_first = [m for m in contents(frames[0]) if m.startswith(RECALL_HEADER)]
    assert len(memories_first) == 1 and "Maya" in memories_first[0]

    frames = await run(memory, [await second()])
    messages = contents(frames[0])
    recalled = [m for m in messages if m.startswith(RECALL_HEADER)]
    # One memory message, this turn's, just before this turn's question.
    assert len(recalled) == 1 and "cello" in recalled[0]
    assert messages[-2] == recalled[0] and messages[-1] == second_question
    await client.aclose()
    stored = await messages_stored(pool, caller.tenant_id)
    assert sorted(stored) == sorted(
        [
            ("alice", QUESTION),
            ("assistant", "Her name is Maya."),
            ("alice", second_question),
        ]
    )


async def test_memsvc_down_the_turn_goes_on_without_memory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Nothing listens there: every call fails at once (UNAVAILABLE after its retries).
    async with MemoryClient(f"127.0.0.1:{free_port()}", api_key="k") as down:
        memory = memory_for(down)
        memory.recall_timeout_s = 0.2
        memory.prefetch_timeout_s = 0.2
        context = LLMContext([{"role": "system", "content": "You are a helpful voice assistant."}])
        with caplog.at_level(logging.WARNING, logger="memsvc.client.call_memory"):
            frames = await run(memory, [*spoken(QUESTION), turn(context, QUESTION)])
    assert len(frames) == 1
    assert contents(frames[0]) == ["You are a helpful voice assistant.", QUESTION]
    assert any("without memory" in r.getMessage() for r in caplog.records)
