"""Recall and Prefetch results to proto messages (pure)."""

from __future__ import annotations

from memsvc.cache.packets import CacheStatus
from memsvc.prefetch.service import PrefetchResult
from memsvc.retrieval.query import ItemKind
from memsvc.retrieval.recall import DENSE, LEXICAL, RecallResult
from memsvc.v1 import memory_pb2 as pb
from memsvc.wire.convert import memory, timestamp

_ITEM_TYPES = {
    ItemKind.FACT: pb.ITEM_TYPE_FACT,
    ItemKind.EPISODE: pb.ITEM_TYPE_EPISODE,
    ItemKind.MESSAGE: pb.ITEM_TYPE_MESSAGE,
}
_ROLES = {
    "user": pb.MESSAGE_ROLE_USER,
    "assistant": pb.MESSAGE_ROLE_ASSISTANT,
    "system": pb.MESSAGE_ROLE_SYSTEM,
    "tool": pb.MESSAGE_ROLE_TOOL,
}
_CACHE = {
    CacheStatus.HIT: pb.CACHE_STATUS_HIT,
    CacheStatus.MISS: pb.CACHE_STATUS_MISS,
    CacheStatus.BYPASSED: pb.CACHE_STATUS_BYPASSED,
    CacheStatus.SKIPPED: pb.CACHE_STATUS_SKIPPED,
}


def recall_response(result: RecallResult) -> pb.RecallResponse:
    items = []
    for ranked in result.items:
        fused = ranked.fused
        hit = fused.hit
        item = pb.RecallItem(
            type=_ITEM_TYPES[hit.kind],
            id=hit.id,
            text=hit.text,
            score=ranked.score,
            relevance=ranked.relevance,
            fused_score=fused.fused_score,
            dense_rank=fused.rank_in(DENSE),
            lexical_rank=fused.rank_in(LEXICAL),
            session_id=hit.session_id,
            occurred_at=timestamp(hit.occurred_at),
            sender_id=hit.sender_id,
            sender_name=hit.sender_name,
            role=(
                _ROLES.get(hit.role, pb.MESSAGE_ROLE_UNSPECIFIED)
                if hit.kind is ItemKind.MESSAGE
                else pb.MESSAGE_ROLE_UNSPECIFIED
            ),
        )
        record = ranked.memory or hit.memory
        if record is not None:
            item.memory.CopyFrom(memory(record))
        items.append(item)
    t = result.timings
    return pb.RecallResponse(
        degraded=result.degraded,
        items=items,
        missing_legs=list(result.missing_legs),
        skipped_legs=list(result.skipped_legs),
        timings=pb.StageTimings(
            embed_ms=t.embed_ms,
            dense_ms=t.dense_ms,
            lexical_ms=t.lexical_ms,
            fuse_ms=t.fuse_ms,
            total_ms=t.total_ms,
        ),
        route=result.route,
    )


def prefetch_response(result: PrefetchResult) -> pb.PrefetchResponse:
    response = result.wire
    response.text = result.text
    response.cache = _CACHE[result.cache]
    t = result.timings
    response.timings.CopyFrom(
        pb.StageTimings(
            embed_ms=t.embed_ms, cache_ms=t.cache_ms, build_ms=t.build_ms, total_ms=t.total_ms
        )
    )
    return response
