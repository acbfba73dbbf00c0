"""Legs that know their worth: under a voice-sized deadline, a lexical match holding every
word of the query makes the embedding and the dense leg unnecessary."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import asyncpg
import pytest

from memsvc.concurrency.fanout import LegRunner
from memsvc.embedding import Embedder
from memsvc.retrieval.fusion import Fused
from memsvc.retrieval.leg_policy import lexical_suffices
from memsvc.retrieval.query import Hit, ItemKind, Mode, RecallQuery
from memsvc.retrieval.ranking import Ranked
from memsvc.retrieval.recall import keep_relevant
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.read_helpers import dscope, pscope, seed_messages
from tests.test_read_units import hit as read_unit_hit

MESSAGE = pb.ITEM_TYPE_MESSAGE
TEXTS = [
    "We had ramen for dinner at the new place downtown",
    "My sister is visiting next week",
    "I started learning the violin",
]


def hit(coverage: float | None, kind: ItemKind = ItemKind.MESSAGE) -> Hit:
    """A lexical hit whose query-word coverage is ``coverage`` (tests.test_read_units.hit)."""
    return replace(read_unit_hit(uuid.uuid4().hex, kind=kind), coverage=coverage)


def test_only_a_best_hit_holding_every_word_suffices() -> None:
    assert lexical_suffices([hit(1.0), hit(0.2)])
    assert not lexical_suffices([hit(0.75), hit(1.0)])  # only the best hit counts
    assert not lexical_suffices([hit(None)])
    assert not lexical_suffices([])


async def test_the_runner_stops_waiting_for_a_leg_settled_by_another() -> None:
    runner = LegRunner()
    slow_cancelled = asyncio.Event()

    async def fast() -> str:
        return "enough"

    async def slow() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            slow_cancelled.set()
            raise
        return "late"

    results = await runner.run(
        {"a": fast(), "b": slow()},
        budget_s=30,
        settle=lambda name, value: ("b",) if value == "enough" else (),
    )
    assert results["a"].ok and results["a"].value == "enough"
    assert results["b"].skipped and not results["b"].timed_out and not results["b"].ok
    await asyncio.wait_for(slow_cancelled.wait(), 5)

    # Nothing settled: every leg is waited for.
    async def quick(value: str) -> str:
        await asyncio.sleep(0.01)
        return value

    results = await runner.run(
        {"a": quick("not enough"), "b": quick("late")},
        budget_s=30,
        settle=lambda name, value: ("b",) if value == "enough" else (),
    )
    assert results["b"].ok and results["b"].value == "late"


async def _recall(
    caller: Caller, query: str, deadline_s: float, **fields: object
) -> pb.RecallResponse:
    reply: pb.RecallResponse = await caller.stub.Recall(
        pb.RecallRequest(query=query, scope=pscope(), types=[MESSAGE], **fields),  # type: ignore[arg-type]
        timeout=deadline_s,
    )
    return reply


@pytest.mark.parametrize("query", ["ramen dinner", "Where did we have ramen for dinner?"])
async def test_a_full_lexical_match_skips_the_dense_leg_under_a_voice_deadline(
    caller: Caller, pool: asyncpg.Pool, embedder: Embedder, query: str
) -> None:
    await seed_messages(pool, embedder, dscope(caller), TEXTS)
    voice = await _recall(caller, query, 0.35)
    assert not voice.degraded and not voice.missing_legs
    assert "dense" in voice.skipped_legs
    assert voice.items[0].id == "m0"
    assert all(item.dense_rank == 0 for item in voice.items)
    # A chat deadline waits for both legs.
    chat = await _recall(caller, query, 5.0)
    assert list(chat.skipped_legs) == []
    assert any(item.dense_rank > 0 for item in chat.items)


async def test_the_dense_leg_is_waited_for_when_it_is_needed_or_asked_for(
    caller: Caller, pool: asyncpg.Pool, embedder: Embedder
) -> None:
    await seed_messages(pool, embedder, dscope(caller), TEXTS)
    # No message holds every word: both legs.
    partial = await _recall(caller, "ramen for breakfast", 0.35)
    assert list(partial.skipped_legs) == [] and not partial.degraded
    assert any(item.dense_rank > 0 for item in partial.items)
    # DENSE mode, or a caller's vector (no embedding to save): never skipped.
    dense = await _recall(caller, "ramen dinner", 0.35, mode=pb.RECALL_MODE_DENSE)
    assert list(dense.skipped_legs) == [] and dense.items[0].dense_rank == 1
    [vector] = await embedder.embed(["ramen dinner"])
    given = await _recall(caller, "ramen dinner", 0.35, query_vector=[float(x) for x in vector])
    assert list(given.skipped_legs) == [] and any(i.dense_rank > 0 for i in given.items)


async def test_a_skipped_leg_leaves_no_trace_in_the_answer(
    caller: Caller, pool: asyncpg.Pool, embedder: Embedder
) -> None:
    """Whether or not the embedding finished (here: cached by the first call), a skipped
    dense leg changes nothing: relevance is the lexical coverage both times."""
    await seed_messages(pool, embedder, dscope(caller), TEXTS)
    first = await _recall(caller, "ramen dinner", 0.35)
    again = await _recall(caller, "ramen dinner", 0.35)
    for reply in (first, again):
        assert "dense" in reply.skipped_legs
        assert reply.items[0].id == "m0" and reply.items[0].relevance == pytest.approx(1.0)
    assert [(i.id, i.relevance) for i in first.items] == [(i.id, i.relevance) for i in again.items]


def _ranked(kind: ItemKind, coverage: float) -> Ranked:
    return Ranked(Fused(hit(coverage, kind), 1.0, {"lexical": 1}), 1.0)


def test_only_a_fact_or_message_opens_the_default_gate() -> None:
    query = RecallQuery(
        scope=Scope("t", "u", "", ""),
        text="q",
        vector=None,
        top_k=5,
        kinds=(ItemKind.FACT, ItemKind.EPISODE),
        mode=Mode.HYBRID,
        min_relevance=0.2,
        min_relevance_episode=0.05,
        relevance_gate=True,
    )
    weak_episode = [_ranked(ItemKind.EPISODE, 0.1), _ranked(ItemKind.FACT, 0.1)]
    # Closed: each item needs its own minimum (the episode stays, the fact goes).
    assert [r.fused.hit.kind for r in keep_relevant(query, weak_episode, None)] == [
        ItemKind.EPISODE
    ]
    opened = [_ranked(ItemKind.FACT, 0.3), _ranked(ItemKind.FACT, 0.1)]
    assert [r.relevance for r in keep_relevant(query, opened, None)] == pytest.approx([0.3, 0.1])
    per_item = replace(query, relevance_gate=False)
    assert [r.relevance for r in keep_relevant(per_item, opened, None)] == pytest.approx([0.3])
