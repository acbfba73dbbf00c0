"""What the voice-framework tests (Pipecat, LiveKit Agents) read back from the real memsvc:
how often a final was answered from work done ahead on interims, and which turns were stored."""

from __future__ import annotations

import asyncpg
from prometheus_client import REGISTRY


def ahead_used() -> float:
    """Finals answered from a RecallStream's work ahead, so far in this process."""
    return sum(
        REGISTRY.get_sample_value("memsvc_recall_ahead_total", {"outcome": o}) or 0.0
        for o in ("ready", "awaited")
    )


async def messages_stored(pool: asyncpg.Pool, tenant: str) -> list[tuple[str, str]]:
    """The tenant's stored messages as (sender_id, text), oldest first."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT sender_id, text FROM messages WHERE tenant_id = $1 ORDER BY sent_at, text",
            tenant,
        )
    return [(r["sender_id"], r["text"]) for r in rows]
