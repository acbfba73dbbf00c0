"""Repairing embedding projections: re-embed rows marked missing or stale, in bounded batches."""

from __future__ import annotations

import logging

import asyncpg

from memsvc.embedding import Embedder, EmbeddingError
from memsvc.observability import metrics
from memsvc.storage import projections

log = logging.getLogger(__name__)


async def mark_stale(pool: asyncpg.Pool, model_id: str) -> int:
    """After a model change, every vector of another model is stale."""
    async with pool.acquire() as conn:
        return await projections.mark_stale(conn, model_id)


async def reconcile_once(pool: asyncpg.Pool, embedder: Embedder, *, batch: int = 64) -> int:
    """Re-embed up to `batch` rows per tier whose projection is missing or stale."""
    repaired = 0
    for tier in projections.TIERS:
        async with pool.acquire() as conn:
            rows = await projections.unembedded(conn, tier, batch)
        rows = [r for r in rows if (r["text"] or "").strip()]
        if not rows:
            continue
        try:
            vectors = await embedder.embed([r["text"] for r in rows])
        except EmbeddingError as exc:
            log.warning("reconcile: embedding %s failed (%s)", tier.table, type(exc).__name__)
            return repaired
        async with pool.acquire() as conn:
            await projections.write_vectors(conn, tier, embedder.model_id, rows, vectors)
        metrics.RECONCILED.labels(tier.table).inc(len(rows))
        repaired += len(rows)
    return repaired
