"""Polarity end to end: a negated statement is stored, exported and shown as a negation."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import ingest, msg, status


async def test_a_negation_ends_the_fact_it_denies_and_never_carries_a_positive_triple(
    caller: Caller, drain
) -> None:  # type: ignore[no-untyped-def]
    scope = pb.Scope(user_id="alice")
    prior = await caller.stub.Remember(
        pb.RememberRequest(
            scope=scope,
            content="The user works as a nurse at Santa Maria hospital.",
            category="profile",
            subject="user",
            predicate="works_at",
            object="Santa Maria hospital",
            # Learned before the conversation (tests.ingest_helpers.BASE is 1 Nov 2026).
            valid_from=Timestamp(seconds=int(datetime(2026, 10, 1, tzinfo=UTC).timestamp())),
        )
    )
    assert not prior.memory.negated
    reply = await ingest(
        caller, [msg("alice", "I don't work at Santa Maria anymore, I switched to a clinic.")]
    )
    assert await drain() >= 1
    done = await status(caller, reply.ingest_id)
    assert done.state == pb.INGEST_STATE_DONE, done.last_error

    current = (
        await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=scope, page_size=100))
    ).memories
    negations = [m for m in current if m.negated]
    assert [(m.subject, m.predicate, m.object) for m in negations] == [
        ("user", "not_works_at", "Santa Maria")
    ]
    assert all(not (m.predicate == "works_at" and "Santa Maria" in m.object) for m in current)
    assert any("clinic" in m.content for m in current)
    assert prior.memory.memory_id not in {m.memory_id for m in current}
    # The gateway reading the packet sees the negation as such.
    packet = await caller.stub.Prefetch(pb.PrefetchRequest(scope=scope, session_id="s2"))
    line = next(line for line in packet.text.splitlines() if "Santa Maria" in line)
    assert ", negated," in line and "works as a nurse" not in packet.text
