"""Builders shared by the write-path tests."""

from __future__ import annotations

import hashlib
import itertools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from memsvc.storage import memories
from memsvc.storage.model import MemoryRecord, NewMemory, Scope
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller

_clock = itertools.count()
BASE = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)

USER = pb.MESSAGE_ROLE_USER
ASSISTANT = pb.MESSAGE_ROLE_ASSISTANT


def ts() -> Timestamp:
    t = Timestamp()
    t.FromDatetime(BASE + timedelta(seconds=next(_clock)))
    return t


def msg(sender: str, text: str, role: int = USER, message_id: str | None = None) -> pb.Message:
    return pb.Message(
        message_id=message_id or f"m-{uuid.uuid4().hex[:10]}",
        sender_id=sender,
        role=role,  # type: ignore[arg-type]
        text=text,
        sent_at=ts(),
    )


async def ingest(
    caller: Caller,
    messages: list[pb.Message],
    *,
    user: str = "alice",
    session: str = "s1",
    key: str | None = None,
    **fields: object,
) -> pb.IngestResponse:
    reply: pb.IngestResponse = await caller.stub.Ingest(
        pb.IngestRequest(
            scope=pb.Scope(
                user_id=user,
                persona_id=str(fields.pop("persona", "")),
                agent_id=str(fields.pop("agent", "")),
            ),
            session_id=session,
            messages=messages,
            idempotency_key=key or uuid.uuid4().hex,
            **fields,  # type: ignore[arg-type]
        )
    )
    return reply


async def contents(
    caller: Caller,
    user: str = "alice",
    persona: str = "",
    agent: str = "",
    include_superseded: bool = False,
) -> list[str]:
    reply = await caller.stub.ListMemories(
        pb.ListMemoriesRequest(
            scope=pb.Scope(user_id=user, persona_id=persona, agent_id=agent),
            page_size=500,
            include_superseded=include_superseded,
        )
    )
    return sorted(m.content for m in reply.memories)


async def status(caller: Caller, ingest_id: str) -> pb.IngestStatus:
    reply: pb.IngestStatus = await caller.stub.GetIngestStatus(
        pb.GetIngestStatusRequest(ingest_id=ingest_id)
    )
    return reply


async def stored_fact(
    conn: Any, scope: Scope, text: str, *, session_id: str, message_id: str
) -> MemoryRecord:
    """A fact stored as extraction stores one, taken from one line of a session (storage
    level: no embedding)."""
    record, _ = await memories.insert_or_reinforce(
        conn,
        scope,
        NewMemory(
            content=text,
            category="preference",
            role="fact",
            confidence=0.9,
            source_message_ids=(message_id,),
            session_id=session_id,
        ),
        content_hash=hashlib.sha256(text.encode()).digest(),
        embedding=None,
        embedding_model="",
    )
    return record
