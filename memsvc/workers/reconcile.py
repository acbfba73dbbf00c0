"""Repairing embedding projections: re-embed rows marked missing or stale, in bounded batches."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

from memsvc import metrics
from memsvc.embedding import Embedder, EmbeddingError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Tier:
    table: str
    key: str  # columns identifying a row within (tenant_id, user_id)
    text: str  # SQL expression of the embedded text


TIERS = (
    _Tier("memories", "memory_id", "content"),
    _Tier("messages", "persona_id, agent_id, session_id, message_id", "text"),
    _Tier("episodes", "episode_id", "title || '. ' || summary"),
    _Tier("topics", "topic_id", "name"),
)


async def mark_stale(pool: asyncpg.Pool, model_id: str) -> int:
    """After a model change, every vector of another model is stale (one UPDATE per tier)."""
    total = 0
    async with pool.acquire() as conn:
        for tier in TIERS:
            status: str = await conn.execute(
                f"UPDATE {tier.table} SET embedding_state = 'stale'"
                " WHERE embedding_state = 'ok' AND embedding_model <> $1",
                model_id,
            )
            total += int(status.split()[-1])
    return total


async def reconcile_once(pool: asyncpg.Pool, embedder: Embedder, *, batch: int = 64) -> int:
    """Re-embed up to `batch` rows per tier whose projection is missing or stale."""
    repaired = 0
    for tier in TIERS:
        keys = f"tenant_id, user_id, {tier.key}"
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                f"SELECT {keys}, {tier.text} AS text FROM {tier.table}"
                f" WHERE embedding_state <> 'ok' LIMIT $1",
                batch,
            )
        rows = [r for r in rows if (r["text"] or "").strip()]
        if not rows:
            continue
        try:
            vectors = await embedder.embed([r["text"] for r in rows])
        except EmbeddingError as exc:
            log.warning("reconcile: embedding %s failed (%s)", tier.table, type(exc).__name__)
            return repaired
        key_names = [k.strip() for k in keys.split(",")]
        where = " AND ".join(f"{k} = ${i + 3}" for i, k in enumerate(key_names))
        async with pool.acquire() as conn:
            # The text is re-checked so a row edited meanwhile is left for the next round.
            await conn.executemany(
                f"UPDATE {tier.table} SET embedding = $1, embedding_model = $2,"
                f" embedding_state = 'ok' WHERE {where} AND {tier.text} = ${len(key_names) + 3}",
                [
                    (vec, embedder.model_id, *(r[k] for k in key_names), r["text"])
                    for r, vec in zip(rows, vectors, strict=True)
                ],
            )
        metrics.RECONCILED.labels(tier.table).inc(len(rows))
        repaired += len(rows)
    return repaired
