"""memsvc in a Pipecat pipeline (needs ``pipecat-ai``; README: why no extra yet).

Two frame processors share one :class:`MemsvcMemory`::

    memory = MemsvcMemory(client, scope("u-42"), session_id=call_id)
    Pipeline([
        transport.input(), stt,
        memory.transcripts,          # sees the interim transcripts (the aggregator drops them)
        user_aggregator,
        memory.context,              # memory into the LLM context, turns ingested
        llm, tts, transport.output(), assistant_aggregator,
    ])

- When the pipeline starts (``StartFrame``) the packet is prefetched; it joins the context,
  as data in a system message, at the first turn that finds it ready.
- While the user speaks, each interim transcript goes to a ``RecallStream`` (when the STT
  sends interims), so the final is usually answered from work already done; without
  interims each turn is a plain Recall. Either way the turn waits at most
  ``recall_timeout_s`` (the voice preset, 200 ms, by default) and the items found replace
  the previous turn's in one system message just before the user's message.
- Each finished turn (the user's, and the assistant's before it) is ingested in the
  background (``MemoryClient.ingest_nowait``): the pipeline never waits for a write.
- memsvc slow or down: the turn goes on without memory, with a WARNING in the log.

The client belongs to the caller (close it after the pipeline).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    InterimTranscriptionFrame,
    LLMContextFrame,
    StartFrame,
    TranscriptionFrame,
)
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from memsvc.client.call_memory import PACKET_HEADER, RECALL_HEADER, CallMemory, Said

__all__ = ["PACKET_HEADER", "RECALL_HEADER", "MemsvcContext", "MemsvcMemory", "MemsvcTranscripts"]


class MemsvcMemory(CallMemory):
    """The memory of one conversation (one pipeline), with its two frame processors."""

    @cached_property
    def transcripts(self) -> MemsvcTranscripts:
        return MemsvcTranscripts(self)

    @cached_property
    def context(self) -> MemsvcContext:
        return MemsvcContext(self)


class MemsvcTranscripts(FrameProcessor):
    """Between the STT and the user aggregator: reads the transcripts, passes every frame."""

    def __init__(self, memory: MemsvcMemory) -> None:
        super().__init__(name="MemsvcTranscripts")
        self._memory = memory

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        # Before the frame moves on: the stream hears the words as early as possible (the
        # hand-off is bounded, INTERIM_HANDOFF_S).
        if isinstance(frame, InterimTranscriptionFrame):
            await self._memory.on_transcript(frame.text, final=False)
        elif isinstance(frame, TranscriptionFrame):
            await self._memory.on_transcript(frame.text, final=True)
        await self.push_frame(frame, direction)


class MemsvcContext(FrameProcessor):
    """Between the user aggregator and the LLM: memory into each turn's context."""

    def __init__(self, memory: MemsvcMemory) -> None:
        super().__init__(name="MemsvcContext")
        self._memory = memory
        self._recalled: dict[str, Any] | None = None  # this processor's recall message
        self._ours: set[int] = set()  # ids of the messages this processor put in
        self._ingested: set[int] = set()  # ids of the messages already ingested
        self._context: LLMContext | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, StartFrame):
            self._memory.start_prefetch()
        elif isinstance(frame, LLMContextFrame):
            await self._turn(frame)
        elif isinstance(frame, EndFrame | CancelFrame):
            await self._finish()
        await self.push_frame(frame, direction)

    # -- each user turn ---------------------------------------------------------------------

    async def _turn(self, frame: LLMContextFrame) -> None:
        context = frame.context
        self._context = context
        messages = context.get_messages()
        packet = await self._memory.packet()
        if packet:
            at = _after_leading_system(messages)
            self._insert(messages, at, {"role": "system", "content": f"{PACKET_HEADER}\n{packet}"})
        user_at, text = _last_user_message(messages)
        if not frame.speculation:
            self._ingest_finished(messages)
        if text is None:
            return
        found = await self._memory.recall(text)
        if self._recalled is not None:
            messages[:] = [m for m in messages if m is not self._recalled]
            user_at, _ = _last_user_message(messages)
            self._recalled = None
        if found:
            note = "\n".join(f"- {line}" for line in found)
            self._recalled = {"role": "system", "content": f"{RECALL_HEADER}\n{note}"}
            self._insert(messages, user_at, self._recalled)

    def _insert(self, messages: list[Any], at: int, added: dict[str, Any]) -> None:
        messages.insert(at, added)
        self._ours.add(id(added))

    def _ingest_finished(self, messages: Sequence[Any]) -> None:
        """Every user and assistant message of the context not ingested yet, in one Ingest
        on the client's background queue."""
        turn = []
        for item in messages:
            if not isinstance(item, dict) or id(item) in self._ours | self._ingested:
                continue
            role, content = item.get("role"), item.get("content")
            if role not in ("user", "assistant") or not isinstance(content, str):
                continue
            self._ingested.add(id(item))
            turn.append(Said("user" if role == "user" else "assistant", content))
        self._memory.ingest(turn)

    async def _finish(self) -> None:
        """The call ended: the last turns (the assistant's reply) are ingested, the stream
        and an unfinished prefetch stopped."""
        if self._context is not None:
            self._ingest_finished(self._context.get_messages())
        await self._memory.aclose()


def _after_leading_system(messages: Sequence[Any]) -> int:
    at = 0
    while at < len(messages) and isinstance(messages[at], dict):
        if messages[at].get("role") not in ("system", "developer"):
            break
        at += 1
    return at


def _last_user_message(messages: Sequence[Any]) -> tuple[int, str | None]:
    """The index and text of the context's last user message (None: there is none)."""
    for at in range(len(messages) - 1, -1, -1):
        item = messages[at]
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str) and content.strip():
                return at, content.strip()
            return at, None
    return len(messages), None
