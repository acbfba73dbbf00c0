"""A failed embedding never loses a Remember: stored, with the projection marked missing."""

from __future__ import annotations

import socket

import asyncpg

from memsvc.cache.client import CacheClient
from memsvc.cache.invalidation import PacketInvalidator
from memsvc.concurrency.deadline import Budget
from memsvc.config import Settings
from memsvc.embedding.openai_http import OpenAIHTTPEmbedder
from memsvc.memories.service import MemoryService
from memsvc.storage.model import NewMemory, Scope


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_embedder_stores_the_memory_unembedded(
    pool: asyncpg.Pool, settings: Settings
) -> None:
    # A real HTTP embedder pointed at a port nobody listens on.
    embedder = OpenAIHTTPEmbedder(
        base_url=f"http://127.0.0.1:{closed_port()}", model="m", dimension=384, timeout_s=1
    )
    assert settings.redis_url is not None
    client = CacheClient(settings.redis_url, timeout_s=0.05)
    service = MemoryService(
        pool,
        embedder,
        PacketInvalidator(client, timeout_s=0.05),
        acquire_timeout_s=1,
        embed_timeout_s=1,
    )
    scope = Scope("t-embed-failure", "alice")
    try:
        done = await service.remember(
            scope,
            NewMemory(
                content="Speaks Portuguese", category="profile", role="context", confidence=0.9
            ),
            Budget(5),
        )
    finally:
        await client.aclose()
        await embedder.aclose()
    assert not done.reinforced and not done.displaced
    record = done.record
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT embedding IS NULL AS no_vector, embedding_state, content FROM memories"
            " WHERE tenant_id = $1 AND memory_id = $2",
            scope.tenant_id,
            record.memory_id,
        )
    assert row["no_vector"] and row["embedding_state"] == "missing"
    assert row["content"] == "Speaks Portuguese"
