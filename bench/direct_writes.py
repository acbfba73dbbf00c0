"""The floor of the write path: Remember's and Ingest's SQL and Redis calls issued directly.

The statements are memsvc's own, issued through its storage functions (each one statement,
or two where the service's are: a reinforced row's lineage is aligned in the same call) in
the order memsvc/memories/service.py and memsvc/ingest/service.py issue them, on the same
kind of pool -- not copied, so the floor can never drift from what the service runs. What
memsvc adds on top (gRPC, auth, validation, the PII screen, admission, the service layer)
is what the ratio measures.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import asyncpg
import numpy as np
import redis.asyncio as aioredis

from memsvc.cache.keys import user_index_key
from memsvc.embedding.onnx_minilm import OnnxMiniLMEmbedder
from memsvc.ingest.payload import JobPayload
from memsvc.storage import memories, memory_batches, outbox, versions
from memsvc.storage.messages import StoredMessage, insert_messages
from memsvc.storage.model import NewMemory, Scope
from memsvc.storage.normalize import content_hash


async def drop_cached_packets(client: aioredis.Redis, scope: Scope) -> None:
    """The cache invalidation every write ends with: the user's key index, then its keys."""
    index = user_index_key(scope.tenant_id, scope.user_id)
    keys = await client.smembers(index)
    await client.unlink(index, *keys)


async def remember(
    pool: asyncpg.Pool,
    client: aioredis.Redis,
    embedder: OnnxMiniLMEmbedder,
    scope: Scope,
    content: str,
    *,
    timeout_s: float,
) -> str:
    """Remember's work for a plain fact (category and role "context", confidence 0.9, kept
    until forgotten): "new" when stored, "reinforced" when the identical one was."""
    digest = content_hash(content)
    async with pool.acquire(timeout=timeout_s) as conn:
        # As the service: an exact duplicate is seen first and needs no embedding.
        duplicate = await memories.find_active_duplicate(conn, scope, digest)
        vector: np.ndarray | None = None
        if duplicate is None:
            [vector] = await embedder.embed([content], timeout_s=timeout_s)
        async with conn.transaction():
            _record, reinforced = await memories.insert_or_reinforce(
                conn,
                scope,
                NewMemory(content=content, category="context", role="context", confidence=0.9),
                content_hash=digest,
                embedding=vector,
                embedding_model=embedder.model_id,
            )
            await versions.bump_version(conn, scope.tenant_id, scope.user_id)
    await drop_cached_packets(client, scope)
    return "reinforced" if reinforced else "new"


async def remember_batch(
    pool: asyncpg.Pool,
    client: aioredis.Redis,
    embedder: OnnxMiniLMEmbedder,
    scope: Scope,
    contents: list[str],
    *,
    timeout_s: float,
) -> str:
    """RememberBatch's rows written the fastest direct way: one embedder call for every
    content, one multi-row upsert (memsvc's own statement), the version bump and the cache
    invalidation. "new" when every row was new."""
    vectors = await embedder.embed(contents, timeout_s=timeout_s)
    rows = [
        memory_batches.BatchRow(
            scope,
            NewMemory(content=c, category="context", role="context", confidence=0.9),
            content_hash(c),
            v,
        )
        for c, v in zip(contents, vectors, strict=True)
    ]
    async with pool.acquire(timeout=timeout_s) as conn, conn.transaction():
        written = await memory_batches.insert_or_reinforce_many(
            conn,
            scope.tenant_id,
            rows,
            embedding_model=embedder.model_id,
            dimension=embedder.dimension,
        )
        await versions.bump_version(conn, scope.tenant_id, scope.user_id)
    await drop_cached_packets(client, scope)
    return "reinforced" if any(reinforced for _, reinforced in written) else "new"


@dataclass(frozen=True)
class Turn:
    """One Ingest's messages, as columns (the shape the INSERT takes them in)."""

    session_id: str
    message_ids: list[str]
    sender_ids: list[str]
    roles: list[str]
    texts: list[str]
    sent_at: list[datetime]


async def ingest(
    pool: asyncpg.Pool, scope: Scope, idempotency_key: str, turn: Turn, *, timeout_s: float
) -> bool:
    """Ingest's two writes in one transaction: the outbox row, then the messages (none for a
    key already used). True when the job is new."""
    payload = JobPayload(end_of_session=False, goals=(), counterpart_persona_id="").as_json()
    ingest_id = uuid.uuid4()
    async with pool.acquire(timeout=timeout_s) as conn, conn.transaction():
        fresh = await outbox.enqueue(
            conn,
            scope,
            ingest_id=ingest_id,
            idempotency_key=idempotency_key,
            session_id=turn.session_id,
            payload=payload,
            # The service stores a SHA-256 of the request here (microseconds): a constant
            # stands in for it in the floor.
            request_digest=f"v1:{ingest_id}",
        )
        if fresh:
            await insert_messages(
                conn,
                scope,
                ingest_id,
                [
                    StoredMessage(turn.session_id, mid, sender, role, text, sent)
                    for mid, sender, role, text, sent in zip(
                        turn.message_ids,
                        turn.sender_ids,
                        turn.roles,
                        turn.texts,
                        turn.sent_at,
                        strict=True,
                    )
                ],
            )
    return bool(fresh)
