"""Recall end to end over gRPC: both legs, fusion, kinds, modes, as_of, CJK."""

from __future__ import annotations

import asyncpg
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from memsvc.embedding import Embedder
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.read_helpers import days_ago, dscope, pscope, recall, seed_episode, seed_messages
from tests.test_explicit_memory import remember


async def test_hybrid_finds_by_meaning_and_by_word(caller: Caller) -> None:
    coffee = (await remember(caller, "Takes no sugar in coffee")).memory
    await remember(caller, "Daughter is named Maya")
    await remember(caller, "Works as a nurse in Lisbon")
    reply = await recall(caller, "what does she drink in the morning")
    assert not reply.degraded and list(reply.missing_legs) == []
    assert reply.items[0].id == coffee.memory_id
    top = reply.items[0]
    assert top.type == pb.ITEM_TYPE_FACT and top.memory.content == "Takes no sugar in coffee"
    assert top.dense_rank == 1 and top.fused_score > 0 and top.score >= top.fused_score
    assert reply.timings.total_ms > 0 and reply.timings.embed_ms > 0

    by_word = await recall(caller, "maya")
    assert by_word.items[0].memory.content == "Daughter is named Maya"
    assert by_word.items[0].lexical_rank == 1
