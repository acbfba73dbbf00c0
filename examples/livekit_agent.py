"""A LiveKit Agents session with memsvc's memory (needs ``livekit-agents``), no API keys needed.

    make run                                   # another terminal: memsvc dev on :50051
    .venv/bin/python examples/livekit_agent.py
    .venv/bin/python examples/livekit_agent.py --address host:50051 --api-key KEY

The session is a real LiveKit ``AgentSession``, run in-process (no LiveKit server, no room),
with SCRIPTED STAND-INS where a call has a speech recogniser and a model:

- ``ScriptedSTT`` "hears" each user turn word by word: an interim transcript per word
  (``--word-ms`` apart, ~150 words a minute), then the final and the end of speech. The
  session ends the turn on it (``turn_detection="stt"``) and calls
  ``MemsvcAgent.on_user_turn_completed``, as it does in a call.
- ``ScriptedLLM`` answers each turn with a canned line; it keeps the chat context it was given,
  from which each turn prints what memory added.

``memory.attach(session)`` prefetches the packet and streams the interims to RecallStream;
``on_user_turn_completed`` puts the packet and the turn's memories into the LLM context;
finished messages go to the background ingest. Each turn prints the time memory added to it
(LiveKit's own ``on_user_turn_completed_delay`` metric of the user's message). With memsvc
stopped the turns go on without memory, each within the recall budget.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import uuid
from collections.abc import Sequence
from typing import Any

from livekit.agents import AgentSession, llm, stt
from livekit.agents.language import LanguageCode
from livekit.agents.types import (
    DEFAULT_API_CONNECT_OPTIONS,
    NOT_GIVEN,
    APIConnectOptions,
    NotGivenOr,
)
from livekit.agents.utils import AudioBuffer, shortuuid
from livekit.agents.voice.events import ConversationItemAddedEvent

from memsvc.client import MemoryClient, scope
from memsvc.client.livekit import PACKET_HEADER, RECALL_HEADER, MemsvcAgent, MemsvcMemory
from memsvc.v1 import memory_pb2 as pb

KNOWN_FACTS = (
    ("Is allergic to peanuts", "profile"),
    ("Takes no sugar in coffee", "preference"),
    ("Daughter is named Maya", "relationship"),
)
TURNS = (
    ("I'd like to order dinner for tonight", "Sure! What would you like?"),
    ("something with peanut sauce maybe", "Careful: you told us you're allergic to peanuts."),
    ("and a coffee for after", "No sugar, as usual?"),
    ("also something for my daughter", "Of course, something Maya likes?"),
)
# The speaker's pace: an interim per word, ~150 words a minute.
WORD_S = 0.4
ENGLISH = LanguageCode("en")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--address", default="127.0.0.1:50051", help="memsvc host:port")
    p.add_argument("--api-key", default=None, help="x-api-key (memsvc dev runs without auth)")
    p.add_argument("--user", default="caller-555-0100", help="the caller's user id")
    p.add_argument("--no-seed", action="store_true", help="do not Remember the sample facts")
    p.add_argument("--word-ms", type=float, default=WORD_S * 1000, help="time per spoken word")
    return p.parse_args(argv)


class ScriptedSTT(stt.STT[Any]):
    """SCRIPTED stand-in for a streaming STT: hears what :meth:`speak` queues."""

    def __init__(self, word_s: float) -> None:
        super().__init__(
            capabilities=stt.STTCapabilities(
                streaming=True, interim_results=True, offline_recognize=False, chat_context=True
            )
        )
        self.word_s = word_s
        self.utterances: asyncio.Queue[str] = asyncio.Queue()

    def speak(self, text: str) -> None:
        self.utterances.put_nowait(text)

    async def _recognize_impl(
        self,
        buffer: AudioBuffer,
        *,
        language: NotGivenOr[str] = NOT_GIVEN,
        conn_options: APIConnectOptions,
    ) -> stt.SpeechEvent:
        raise NotImplementedError("ScriptedSTT only streams")

    def stream(
        self,
        *,
        language: NotGivenOr[str] = NOT_GIVEN,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
    ) -> ScriptedStream:
        return ScriptedStream(stt=self, conn_options=conn_options)


class ScriptedStream(stt.RecognizeStream):
    _stt: ScriptedSTT

    async def _run(self) -> None:
        def said(kind: stt.SpeechEventType, text: str = "") -> stt.SpeechEvent:
            alternatives = [stt.SpeechData(language=ENGLISH, text=text, confidence=1.0)]
            return stt.SpeechEvent(type=kind, alternatives=alternatives if text else [])

        while True:
            text = await self._stt.utterances.get()
            words = text.split()
            self._event_ch.send_nowait(said(stt.SpeechEventType.START_OF_SPEECH))
            for n in range(1, len(words)):
                await asyncio.sleep(self._stt.word_s)
                interim = " ".join(words[:n])
                self._event_ch.send_nowait(said(stt.SpeechEventType.INTERIM_TRANSCRIPT, interim))
            await asyncio.sleep(self._stt.word_s)
            self._event_ch.send_nowait(said(stt.SpeechEventType.FINAL_TRANSCRIPT, text))
            self._event_ch.send_nowait(said(stt.SpeechEventType.END_OF_SPEECH))


class ScriptedLLM(llm.LLM[Any]):
    """SCRIPTED stand-in for the LLM: answers each turn with its canned reply, and keeps the
    chat context it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.contexts: list[llm.ChatContext] = []

    def chat(
        self,
        *,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        parallel_tool_calls: NotGivenOr[bool] = NOT_GIVEN,
        tool_choice: NotGivenOr[llm.ToolChoice] = NOT_GIVEN,
        extra_kwargs: NotGivenOr[dict[str, Any]] = NOT_GIVEN,
    ) -> ScriptedLLMStream:
        reply = TURNS[len(self.contexts) % len(TURNS)][1]
        self.contexts.append(chat_ctx.copy())
        return ScriptedLLMStream(
            self, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options, reply=reply
        )


class ScriptedLLMStream(llm.LLMStream):
    def __init__(self, model: ScriptedLLM, *, reply: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self._reply = reply

    async def _run(self) -> None:
        delta = llm.ChoiceDelta(role="assistant", content=self._reply)
        self._event_ch.send_nowait(llm.ChatChunk(id=shortuuid("chunk_"), delta=delta))


class Turns:
    """The session's finished messages: the hook's time from each user message's metrics,
    and each assistant reply as it is added."""

    def __init__(self, session: AgentSession[None]) -> None:
        self.added_ms: list[float] = []
        self._replies: asyncio.Queue[str] = asyncio.Queue()
        session.on("conversation_item_added", self._added)

    def _added(self, ev: ConversationItemAddedEvent) -> None:
        item = ev.item
        if not isinstance(item, llm.ChatMessage):
            return
        if item.role == "user":
            self.added_ms.append(item.metrics.get("on_user_turn_completed_delay", 0.0) * 1000)
        elif item.role == "assistant":
            self._replies.put_nowait(item.text_content or "")

    async def reply(self) -> str:
        return await self._replies.get()


def describe(ctx: llm.ChatContext) -> tuple[bool, int]:
    """Whether the packet is in the context, and how many memory items the turn got."""
    texts = [m.text_content or "" for m in ctx.messages()]
    packet = any(t.startswith(PACKET_HEADER) for t in texts)
    recalled = [t.count("\n- ") for t in texts if t.startswith(RECALL_HEADER)]
    return packet, recalled[0] if recalled else 0


async def call(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    who = scope(args.user)
    client = MemoryClient(args.address, api_key=args.api_key, default_preset="voice")
    try:
        if not args.no_seed:
            for content, category in KNOWN_FACTS:
                try:
                    await client.remember(
                        pb.RememberRequest(scope=who, content=content, category=category),
                        preset="chat",
                    )
                except Exception as exc:  # memsvc down: the call still runs, without memory
                    print(f"seeding failed ({type(exc).__name__}): memsvc is not reachable")
                    break
        memory = MemsvcMemory(
            client, who, session_id=f"room-{uuid.uuid4().hex[:8]}", prefetch_hint=TURNS[0][0]
        )
        model = ScriptedLLM()
        ears = ScriptedSTT(args.word_ms / 1000)
        session: AgentSession[None] = AgentSession(
            stt=ears,
            llm=model,
            vad=None,
            turn_handling={
                # The turn ends on the STT's end of speech, after LiveKit's endpointing delay
                # (its default, 0.5 s): the final transcript's Recall works meanwhile.
                "turn_detection": "stt",
                # A reply started before the turn's end would be discarded whenever memory
                # changes the context (LiveKit compares them): off, as memory is added per turn.
                "preemptive_generation": {"enabled": False},
            },
            user_away_timeout=None,
            aec_warmup_duration=None,
            session_close_transcript_timeout=0.1,
        )
        memory.attach(session)
        turns = Turns(session)
        async with session:
            await session.start(MemsvcAgent(memory, instructions="You are a friendly order-taker."))
            for n, (text, _reply) in enumerate(TURNS, 1):
                ears.speak(text)
                await turns.reply()
                packet, items = describe(model.contexts[-1])
                print(
                    f"turn {n}: memory added {turns.added_ms[-1]:6.1f} ms | "
                    f"packet {'in context' if packet else 'absent'} | "
                    f"{items} memory item(s) | user: {text!r}"
                )
        await memory.aclose()
        if turns.added_ms:
            print(
                f"memory added per turn: median {statistics.median(turns.added_ms):.1f} ms, "
                f"max {max(turns.added_ms):.1f} ms over {len(turns.added_ms)} turns"
            )
    finally:
        await client.aclose(flush_timeout_s=5.0)
    stats = client.ingest_stats
    print(f"ingest queue: {stats.sent} sent, {stats.failed} failed")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(call(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
