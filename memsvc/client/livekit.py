"""memsvc in a LiveKit Agents session (needs ``livekit-agents`` 1.8).

One :class:`MemsvcMemory` per conversation, attached to the ``AgentSession`` before it
starts; the agent hands it each finished user turn::

    memory = MemsvcMemory(client, scope("u-42"), session_id=ctx.room.name)
    session = AgentSession(stt=..., llm=..., tts=..., vad=...)
    memory.attach(session)
    await session.start(MemsvcAgent(memory, instructions="..."), room=ctx.room)

An agent of your own calls ``await memory.add_to_turn(turn_ctx, new_message)`` in its
``on_user_turn_completed`` instead of deriving from :class:`MemsvcAgent`.

- ``attach`` starts the Prefetch; the packet joins each turn's context, as data in a system
  message after the instructions, from the first turn that finds it ready.
- While the user speaks, each interim transcript (session event ``user_input_transcribed``)
  goes to a ``RecallStream``, so the final is usually answered from work already done;
  without interims each turn is a plain Recall. Either way ``on_user_turn_completed`` waits
  at most ``recall_timeout_s`` (the voice preset, 200 ms, by default) and the items found go
  in one system message just before the user's message. LiveKit hands the hook a copy of the
  agent's context for this turn's reply only, so each turn's memories replace the last's.
- Each finished message (event ``conversation_item_added``: the user's, and the assistant's
  before it; the last at the session's ``close``) is ingested in the background
  (``MemoryClient.ingest_nowait``): the session never waits for a write.
- memsvc slow or down: the turn goes on without memory, with a WARNING in the log.

With preemptive generation on (LiveKit's default), a turn whose memory changed the context
discards the reply LiveKit started early and generates it again, with the memory.

The client belongs to the caller (close it after the session).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from livekit.agents import Agent, AgentSession, llm
from livekit.agents.llm.chat_context import Instructions
from livekit.agents.voice.events import (
    CloseEvent,
    ConversationItemAddedEvent,
    UserInputTranscribedEvent,
)

from memsvc.client.call_memory import PACKET_HEADER, RECALL_HEADER, CallMemory, Said

__all__ = ["PACKET_HEADER", "RECALL_HEADER", "MemsvcAgent", "MemsvcMemory"]

log = logging.getLogger(__name__)

PACKET_ID = "memsvc.packet"
RECALL_ID = "memsvc.recall"
# Transcripts are handed over by session events (callbacks that cannot wait) and fed to the
# stream in order by one task; the turn's end waits this long for the last of them (each
# hand-off is itself bounded, INTERIM_HANDOFF_S).
SETTLE_S = 0.02
# The turn's memories sort (by creation time) just before the user's message.
BEFORE_S = 1e-4


class MemsvcMemory(CallMemory):
    """The memory of one conversation (one ``AgentSession``); the arguments are
    :class:`memsvc.client.call_memory.CallMemory`'s."""

    _session: AgentSession[Any] | None = None
    _feeder: asyncio.Task[None] | None = None
    _closing: asyncio.Task[None] | None = None
    _packet_text = ""

    def attach(self, session: AgentSession[Any]) -> None:
        """Follow ``session`` (before ``session.start``): the Prefetch starts now."""
        if self._session is not None:
            raise RuntimeError("this MemsvcMemory already follows a session")
        self._session = session
        self._pending: list[Said] = []  # assistant messages not ingested yet
        self._transcripts: asyncio.Queue[tuple[str, bool]] = asyncio.Queue()
        self._feeder = asyncio.ensure_future(self._feed())
        session.on("user_input_transcribed", self._on_transcribed)
        session.on("conversation_item_added", self._on_item)
        session.on("close", self._on_close)
        self.start_prefetch()

    # -- session events ----------------------------------------------------------------------

    def _on_transcribed(self, ev: UserInputTranscribedEvent) -> None:
        self._transcripts.put_nowait((ev.transcript, ev.is_final))

    async def _feed(self) -> None:
        while True:
            text, final = await self._transcripts.get()
            try:
                await self.on_transcript(text, final=final)
            except Exception:
                # One transcript lost costs the turn its work ahead, not the rest of the call.
                log.warning("memsvc could not take a transcript", exc_info=True)
            finally:
                self._transcripts.task_done()

    def _on_item(self, ev: ConversationItemAddedEvent) -> None:
        item = ev.item
        if not isinstance(item, llm.ChatMessage) or item.role not in ("user", "assistant"):
            return
        said = Said(
            "user" if item.role == "user" else "assistant",
            item.text_content or "",
            message_id=item.id,
            sent_at=datetime.fromtimestamp(item.created_at, UTC),
        )
        if said.role == "assistant":
            self._pending.append(said)
            return
        turn, self._pending = [*self._pending, said], []
        self.ingest(turn)

    def _on_close(self, _ev: CloseEvent) -> None:
        self._flush()
        self._closing = asyncio.ensure_future(self.aclose())

    def _flush(self) -> None:
        turn, self._pending = self._pending, []
        self.ingest(turn)

    # -- each user turn ----------------------------------------------------------------------

    async def add_to_turn(self, turn_ctx: llm.ChatContext, new_message: llm.ChatMessage) -> None:
        """For ``Agent.on_user_turn_completed``: the packet and the memories for
        ``new_message`` into ``turn_ctx``, within ``recall_timeout_s`` (the first turn may
        also wait for what is left of the prefetch's deadline)."""
        turn_ctx.items = [i for i in turn_ctx.items if i.id not in (PACKET_ID, RECALL_ID)]
        if packet := await self.packet():
            self._packet_text = packet
        if self._packet_text:
            at = _after_instructions(turn_ctx.items)
            stamp = turn_ctx.items[at - 1].created_at if at else new_message.created_at
            turn_ctx.items.insert(
                at,
                llm.ChatMessage(
                    id=PACKET_ID,
                    role="system",
                    content=[f"{PACKET_HEADER}\n{self._packet_text}"],
                    created_at=stamp,
                ),
            )
        text = (new_message.text_content or "").strip()
        if not text:
            return
        if self._feeder is not None:
            try:
                async with asyncio.timeout(SETTLE_S):
                    await self._transcripts.join()
            except TimeoutError:
                pass  # the recall goes on with what the stream has
        found = await self.recall(text)
        if found:
            note = "\n".join(f"- {line}" for line in found)
            turn_ctx.insert(
                llm.ChatMessage(
                    id=RECALL_ID,
                    role="system",
                    content=[f"{RECALL_HEADER}\n{note}"],
                    created_at=new_message.created_at - BEFORE_S,
                )
            )

    async def aclose(self) -> None:
        """Stop following the session: the messages not ingested yet are handed over, the
        stream and an unfinished prefetch stopped (done by the session's ``close`` too)."""
        session, self._session = self._session, None
        if session is not None:
            session.off("user_input_transcribed", self._on_transcribed)
            session.off("conversation_item_added", self._on_item)
            session.off("close", self._on_close)
            self._flush()
        feeder, self._feeder = self._feeder, None
        if feeder is not None:
            feeder.cancel()
            await asyncio.wait({feeder})
        await super().aclose()


class MemsvcAgent(Agent):
    """An ``Agent`` whose every finished user turn gets memory (``memory.add_to_turn``)."""

    def __init__(
        self, memory: MemsvcMemory, *, instructions: str | Instructions, **kwargs: Any
    ) -> None:
        """``kwargs``: the other arguments of ``Agent``."""
        super().__init__(instructions=instructions, **kwargs)
        self.memory = memory

    async def on_user_turn_completed(
        self, turn_ctx: llm.ChatContext, new_message: llm.ChatMessage
    ) -> None:
        await self.memory.add_to_turn(turn_ctx, new_message)


def _after_instructions(items: list[llm.ChatItem]) -> int:
    """The index after the context's leading instructions (system and developer messages,
    configuration records)."""
    at = 0
    while at < len(items):
        item = items[at]
        if isinstance(item, llm.ChatMessage):
            if item.role not in ("system", "developer"):
                break
        elif item.type != "agent_config_update":
            break
        at += 1
    return at
