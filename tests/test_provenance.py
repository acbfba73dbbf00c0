"""Provenance is the conversation's time: an extracted fact's ``valid_from`` and its
"from a conversation on ..." label in the Prefetch packet come from when the user said it
(the message's ``sent_at``), never from when memsvc ingested it."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from google.protobuf.timestamp_pb2 import Timestamp

from memsvc.prefetch import packet
from memsvc.storage.model import MemoryRecord, Scope
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import ingest, status
from tests.read_helpers import prefetch, pscope

# A conversation days before the ingestion (the issue: said on Nov 29, ingested on Dec 2).
SAID = datetime(2025, 11, 29, 14, 30, tzinfo=UTC)
SAID_LABEL = "from a conversation on Nov 29, 2025"


def said(text: str, at: datetime, message_id: str) -> pb.Message:
    sent_at = Timestamp()
    sent_at.FromDatetime(at)
    return pb.Message(
        message_id=message_id,
        sender_id="alice",
        role=pb.MESSAGE_ROLE_USER,
        text=text,
        sent_at=sent_at,
    )


async def extracted_facts(caller: Caller) -> list[pb.Memory]:
    reply = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=pscope(), page_size=100))
    return [m for m in reply.memories if m.origin == "extraction"]


async def test_extracted_facts_carry_the_time_they_were_said(
    caller: Caller, drain: Callable[[], Awaitable[int]]
) -> None:
    sent = {
        "m-home": SAID,
        "m-allergy": SAID + timedelta(minutes=3),
    }
    reply = await ingest(
        caller,
        [
            said("I live in Singapore.", sent["m-home"], "m-home"),
            said("I am allergic to peanuts.", sent["m-allergy"], "m-allergy"),
        ],
        session="call-2025-11-29",
    )
    assert await drain() >= 1
    done = await status(caller, reply.ingest_id)
    assert done.state == pb.INGEST_STATE_DONE, done.last_error

    facts = await extracted_facts(caller)
    sources = {source for fact in facts for source in fact.source_message_ids}
    assert sources == set(sent), [(f.content, list(f.source_message_ids)) for f in facts]
    for fact in facts:
        said_at = max(sent[s] for s in fact.source_message_ids)
        assert fact.valid_from.ToDatetime(UTC) == said_at, fact.content
        # Recorded today: the ingestion time stays in recorded_at only.
        assert fact.recorded_at.ToDatetime(UTC) > SAID + timedelta(days=1)

    # Prefetch from a later session: every extracted fact is dated by its conversation.
    text = (await prefetch(caller, session_id="call-later")).text
    lines = [line for line in text.splitlines() if "from a conversation on" in line]
    assert len(lines) == len(facts), text
    for fact in facts:
        line = next(line for line in lines if fact.content in line)
        assert line.endswith(f"{SAID_LABEL})"), line
        recorded_day = packet.day(fact.recorded_at.ToDatetime(UTC))
        assert f"from a conversation on {recorded_day}" not in text
    # The conversation itself is dated by when it happened, too.
    assert "- Nov 29, 2025: " in text, text


def record(*, valid_from: datetime, recorded_at: datetime, origin: str) -> MemoryRecord:
    mid = uuid.uuid4()
    return MemoryRecord(
        scope=Scope("t", "alice"),
        memory_id=mid,
        lineage_id=mid,
        content="Plans to move to Tokyo",
        category="goal",
        role="context",
        confidence=0.9,
        reinforced_count=0,
        pinned=False,
        valid_from=valid_from,
        recorded_at=recorded_at,
        status="active",
        origin=origin,
    )


def test_provenance_labels() -> None:
    ingested = datetime(2025, 12, 2, 8, 0, tzinfo=UTC)
    extracted = record(valid_from=SAID, recorded_at=ingested, origin="extraction")
    assert packet.provenance(extracted) == SAID_LABEL
    # A planned fact may hold from a future date: it was still said no later than recorded.
    planned = record(
        valid_from=datetime(2026, 6, 1, tzinfo=UTC), recorded_at=ingested, origin="extraction"
    )
    assert packet.provenance(planned) == "from a conversation on Dec 2, 2025"
    # Remember and Correct are dated by the call that wrote them.
    explicit = record(valid_from=SAID, recorded_at=ingested, origin="explicit")
    assert packet.provenance(explicit) == "recorded Dec 2, 2025"
    corrected = record(valid_from=SAID, recorded_at=ingested, origin="correction")
    assert packet.provenance(corrected) == "you corrected it on Dec 2, 2025"
