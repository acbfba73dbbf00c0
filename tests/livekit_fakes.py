"""Deterministic stand-ins for a LiveKit Agents session's speech and model services: an STT
that "hears" scripted utterances (interim per word, final, end of speech), and an LLM that
records each chat context it is given and answers with scripted replies. With
``turn_detection="stt"`` and no VAD, LiveKit's own audio-recognition path ends each user
turn and calls ``Agent.on_user_turn_completed``, as it does in a call."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from livekit import rtc
from livekit.agents import AgentSession, llm, stt
from livekit.agents.language import LanguageCode
from livekit.agents.types import (
    DEFAULT_API_CONNECT_OPTIONS,
    NOT_GIVEN,
    APIConnectOptions,
    NotGivenOr,
)
from livekit.agents.utils import AudioBuffer, shortuuid
from livekit.agents.voice import io
from livekit.agents.voice.events import ConversationItemAddedEvent

FRAME_S = 0.02
SAMPLE_RATE = 16000
ENGLISH = LanguageCode("en")


class ScriptedSTT(stt.STT[Any]):
    """A streaming STT with interim results; :meth:`speak` queues what the user says next."""

    def __init__(self, *, interims: bool = True, word_s: float = 0.0) -> None:
        super().__init__(
            capabilities=stt.STTCapabilities(
                streaming=True,
                interim_results=interims,
                offline_recognize=False,
                chat_context=True,  # accepts (and ignores) the conversation, without a warning
            )
        )
        self.interims = interims
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


def _said(kind: stt.SpeechEventType, text: str = "") -> stt.SpeechEvent:
    alternatives = [stt.SpeechData(language=ENGLISH, text=text, confidence=1.0)] if text else []
    return stt.SpeechEvent(type=kind, alternatives=alternatives)


class ScriptedStream(stt.RecognizeStream):
    _stt: ScriptedSTT

    async def _run(self) -> None:
        audio = asyncio.ensure_future(self._swallow_audio())
        try:
            while True:
                text = await self._stt.utterances.get()
                await self._utter(text)
        finally:
            audio.cancel()
            await asyncio.wait({audio})

    async def _swallow_audio(self) -> None:
        async for _ in self._input_ch:
            pass

    async def _utter(self, text: str) -> None:
        send = self._event_ch.send_nowait
        send(_said(stt.SpeechEventType.START_OF_SPEECH))
        words = text.split()
        if self._stt.interims:
            for n in range(1, len(words)):
                await asyncio.sleep(self._stt.word_s)
                send(_said(stt.SpeechEventType.INTERIM_TRANSCRIPT, " ".join(words[:n])))
        await asyncio.sleep(self._stt.word_s)
        send(_said(stt.SpeechEventType.FINAL_TRANSCRIPT, text))
        send(_said(stt.SpeechEventType.END_OF_SPEECH))


class SilentMicrophone(io.AudioInput):
    """The user's audio track: silence, in real time, for as long as the session listens
    (the STT is what "hears" the words)."""

    def __init__(self) -> None:
        super().__init__(label="SilentMicrophone")
        self._samples = int(SAMPLE_RATE * FRAME_S)

    async def __anext__(self) -> rtc.AudioFrame:
        await asyncio.sleep(FRAME_S)
        return rtc.AudioFrame(
            data=bytes(2 * self._samples),
            sample_rate=SAMPLE_RATE,
            num_channels=1,
            samples_per_channel=self._samples,
        )


class ScriptedLLM(llm.LLM[Any]):
    """Answers each call with the next scripted reply; ``contexts`` holds what it was given."""

    def __init__(self, replies: Iterable[str]) -> None:
        super().__init__()
        self.replies = list(replies)
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
        reply = self.replies[len(self.contexts) % len(self.replies)]
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


def scripted_session(model: ScriptedLLM, ears: ScriptedSTT) -> AgentSession[None]:
    """A session that ends each turn on the STT's end of speech, at once: no VAD, no turn
    detector model, no preemptive reply, no timers; audio in from a silent microphone, no
    audio or text out."""
    session: AgentSession[None] = AgentSession(
        stt=ears,
        llm=model,
        vad=None,
        turn_handling={
            "turn_detection": "stt",
            "endpointing": {"min_delay": 0.0, "max_delay": 1.0},
            "preemptive_generation": {"enabled": False},
        },
        user_away_timeout=None,
        aec_warmup_duration=None,
        # Closing waits this long for a last transcript from the STT; a scripted one has none.
        session_close_transcript_timeout=0.1,
    )
    session.input.audio = SilentMicrophone()
    return session


class Replies:
    """The session's finished messages, as they are added to its conversation."""

    def __init__(self, session: AgentSession[Any]) -> None:
        self._items: asyncio.Queue[llm.ChatMessage] = asyncio.Queue()
        session.on("conversation_item_added", self._added)

    def _added(self, ev: ConversationItemAddedEvent) -> None:
        if isinstance(ev.item, llm.ChatMessage):
            self._items.put_nowait(ev.item)

    async def next_reply(self) -> str:
        """The text of the next assistant message."""
        while True:
            item = await self._items.get()
            if item.role == "assistant":
                return item.text_content or ""
