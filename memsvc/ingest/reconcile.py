"""Repairing embedding projections: re-embed rows marked missing or stale, in bounded batches."""

from __future__ import annotations

import logging

import asyncpg

from memsvc.config import WORKER_ACQUIRE_TIMEOUT_S
from memsvc.embedding import Embedder, EmbeddingError
from memsvc.observability import metrics
from memsvc.storage import projections

log = logging.getLogger(__name__)


async def mark_stale(
    pool: asyncpg.Pool, model_id: str, *, acquire_timeout_s: float = WORKER_ACQUIRE_TIMEOUT_S
) -> int:
    """After a model change, every vector of another model is stale."""
    async with pool.acquire(timeout=acquire_timeout_s) as conn:
        return await projections.mark_stale(conn, model_id)


async def reconcile_once(
    pool: asyncpg.Pool,
    embedder: Embedder,
    *,
    batch: int = 64,
    acquire_timeout_s: float = WORKER_ACQUIRE_TIMEOUT_S,
    embed_timeout_s: float | None = None,
) -> int:
    """Re-embed up to `batch` rows per tier whose projection is missing or stale.

    Each acquire and embedding call is bounded (``embed_timeout_s`` None: the embedder's own
    default); statements by the pool's command_timeout."""
    repaired = 0
    for tier in projections.TIERS:
        async with pool.acquire(timeout=acquire_timeout_s) as conn:
            rows = await projections.unembedded(conn, tier, batch)
        rows = [r for r in rows if (r["text"] or "").strip()]
        if not rows:
            continue
        try:
            vectors = await embedder.embed([r["text"] for r in rows], timeout_s=embed_timeout_s)
        except EmbeddingError as exc:
            log.warning("reconcile: embedding %s failed (%s)", tier.table, type(exc).__name__)
            return repaired
        async with pool.acquire(timeout=acquire_timeout_s) as conn:
            await projections.write_vectors(conn, tier, embedder.model_id, rows, vectors)
        metrics.RECONCILED.labels(tier.table).inc(len(rows))
        repaired += len(rows)
    return repaired
