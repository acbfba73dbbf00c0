"""Seeding for the read-path tests: messages, episodes, topics and edges written straight to
PostgreSQL with real embeddings (what Ingest's workers write), plus small request builders."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

from memsvc.embedding import Embedder
from memsvc.extraction.base import CandidateEpisode
from memsvc.memories.model import Scope
from memsvc.storage import extraction, topics, versions
from memsvc.storage.messages import StoredMessage, insert_messages, set_message_embeddings
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller

NOW = datetime.now(UTC)


def days_ago(days: float) -> datetime:
    return NOW - timedelta(days=days)


def pscope(user: str = "alice", persona: str = "", agent: str = "") -> pb.Scope:
    return pb.Scope(user_id=user, persona_id=persona, agent_id=agent)


def dscope(caller: Caller, user: str = "alice", persona: str = "", agent: str = "") -> Scope:
    return Scope(caller.tenant_id, user, persona, agent)


async def recall(caller: Caller, query: str = "", **fields: object) -> pb.RecallResponse:
    fields.setdefault("scope", pscope())
    reply: pb.RecallResponse = await caller.stub.Recall(
        pb.RecallRequest(query=query, **fields)  # type: ignore[arg-type]
    )
    return reply


async def prefetch(caller: Caller, **fields: object) -> pb.PrefetchResponse:
    fields.setdefault("scope", pscope())
    reply: pb.PrefetchResponse = await caller.stub.Prefetch(
        pb.PrefetchRequest(**fields)  # type: ignore[arg-type]
    )
    return reply


async def seed_messages(
    pool: asyncpg.Pool,
    embedder: Embedder,
    scope: Scope,
    texts: Sequence[str],
    *,
    session_id: str = "s1",
    sender: str = "alice",
    start: datetime | None = None,
) -> list[str]:
    """Store messages (one per text, a minute apart) with their embeddings; returns ids."""
    start = start or days_ago(1)
    stored = [
        StoredMessage(
            session_id=session_id,
            message_id=f"m{i}",
            sender_id=sender,
            role="user",
            text=text,
            sent_at=start + timedelta(minutes=i),
        )
        for i, text in enumerate(texts)
    ]
    vectors = await embedder.embed(list(texts))
    async with pool.acquire() as conn, conn.transaction():
        await insert_messages(conn, scope, uuid.uuid4(), stored)
        await set_message_embeddings(
            conn, scope, [(m.session_id, m.message_id) for m in stored], vectors, embedder.model_id
        )
    return [m.message_id for m in stored]


@dataclass(frozen=True)
class SeededEpisode:
    episode_id: uuid.UUID
    topic_ids: tuple[uuid.UUID, ...]


async def seed_episode(
    pool: asyncpg.Pool,
    embedder: Embedder,
    scope: Scope,
    *,
    session_id: str,
    title: str,
    summary: str,
    ended_at: datetime,
    topic_names: Sequence[str] = (),
    memory_ids: Sequence[str] = (),
    persona_topic: bool = False,
) -> SeededEpisode:
    """An episode with its topics and fact edges, as extraction writes them (version bumped)."""
    texts = [f"{title} {summary}", *topic_names]
    vectors = await embedder.embed(texts)
    async with pool.acquire() as conn, conn.transaction():
        episode_id = await extraction.upsert_episode(
            conn,
            scope,
            session_id,
            CandidateEpisode(title=title, summary=summary, excerpt="", source_message_ids=()),
            started_at=ended_at - timedelta(minutes=30),
            ended_at=ended_at,
            embedding=vectors[0],
            embedding_model=embedder.model_id,
        )
        topic_ids = [
            await extraction.upsert_topic(
                conn,
                scope,
                name,
                seen_at=ended_at,
                embedding=vectors[1 + i],
                embedding_model=embedder.model_id,
            )
            for i, name in enumerate(topic_names)
        ]
        if persona_topic:
            topic_ids.append(await topics.ensure_persona_topic(conn, scope))
        await extraction.link(
            conn,
            scope,
            episode_id=episode_id,
            topic_ids=topic_ids,
            memory_ids=[uuid.UUID(m) for m in memory_ids],
        )
        await versions.bump_version(conn, scope.tenant_id, scope.user_id)
    return SeededEpisode(episode_id, tuple(topic_ids))
