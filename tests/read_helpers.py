"""Seeding for the read-path tests: messages, episodes, topics and edges written straight to
PostgreSQL with real embeddings (what Ingest's workers write), plus small request builders."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import grpc
import numpy as np
import numpy.typing as npt
import pytest

from memsvc.config import Settings
from memsvc.embedding import Embedder
from memsvc.extraction.base import CandidateEpisode
from memsvc.server.app import MemsvcServer
from memsvc.storage import extraction, topics, versions
from memsvc.storage.messages import (
    StoredMessage,
    insert_messages,
    set_message_embeddings,
    units,
)
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import Caller, _KeyedStub
from tests.slowed_stages import slow_stages

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
    """Store messages (one per text, a minute apart) with the embeddings of their units, as
    the workers make them; returns ids."""
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
    async with pool.acquire() as conn:
        unit_texts = await units(conn, [(m.sender_name, m.sender_id, m.text) for m in stored])
    vectors = await embedder.embed(unit_texts)
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


# -- more servers on the session's databases ----------------------------------------------

# Test servers keep more back from each deadline than the default: the client, the servers
# and the test share one event loop on a shared 2-core box.
TEST_MARGIN_MS = 50


class WrappedEmbedder:
    """The real embedder (the session's, which it leaves open), for a test to hold or slow
    down: subclasses override :meth:`embed` and call it."""

    def __init__(self, inner: Embedder) -> None:
        self._inner = inner

    @property
    def model_id(self) -> str:
        return self._inner.model_id

    @property
    def dimension(self) -> int:
        return self._inner.dimension

    async def embed(
        self, texts: Sequence[str], *, timeout_s: float | None = None
    ) -> npt.NDArray[np.float32]:
        return await self._inner.embed(texts, timeout_s=timeout_s)

    async def aclose(self) -> None:
        """The wrapped embedder belongs to the session."""


class SlowEmbedder(WrappedEmbedder):
    """The real embedder, answering only after ``delay_s`` (an overloaded model server)."""

    def __init__(self, inner: Embedder, delay_s: float) -> None:
        super().__init__(inner)
        self._delay_s = delay_s

    async def embed(
        self, texts: Sequence[str], *, timeout_s: float | None = None
    ) -> npt.NDArray[np.float32]:
        await asyncio.sleep(self._delay_s)
        return await super().embed(texts, timeout_s=timeout_s)


StartServer = Callable[..., Awaitable[tuple[MemsvcServer, grpc.aio.Channel]]]


@pytest.fixture
async def start_server(settings: Settings, embedder: Embedder) -> AsyncIterator[StartServer]:
    """Factory: another memsvc on the session's databases, with settings overridden (with
    ``slow_embedder_s``, an embedder that is that slow; with ``slow_stages_ms``, read stages
    that sleep in PostgreSQL, see tests/slowed_stages.py). Stopped after the test."""
    started: list[tuple[MemsvcServer, grpc.aio.Channel]] = []

    async def start(
        *,
        slow_embedder_s: float = 0.0,
        slow_stages_ms: Mapping[str, float] | None = None,
        **overrides: Any,
    ) -> tuple[MemsvcServer, grpc.aio.Channel]:
        used: Embedder = SlowEmbedder(embedder, slow_embedder_s) if slow_embedder_s else embedder
        overrides.setdefault("deadline_margin_ms", TEST_MARGIN_MS)
        srv = MemsvcServer(settings.with_overrides(**overrides), embedder=used, with_worker=False)
        await srv.start()
        slow_stages(srv, slow_stages_ms or {})
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}")
        started.append((srv, channel))
        return srv, channel

    yield start
    for srv, channel in started:
        await channel.close()
        await srv.stop(grace_s=1.0)


def stub_for(channel: grpc.aio.Channel, caller: Caller) -> Any:
    """A stub on another server's channel, sending the caller's key."""
    return _KeyedStub(memory_pb2_grpc.MemoryServiceStub(channel), caller.key)
