"""Test session: real PostgreSQL+pgvector and valkey (embedded, or MEMSVC_PG_DSN/MEMSVC_REDIS_URL),
one real memsvc server with authentication on, and a fresh tenant per test for isolation."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest
import redis.asyncio as aioredis

from memsvc.config import Settings
from memsvc.embedding import Embedder
from memsvc.embedding.onnx_minilm import OnnxMiniLMEmbedder
from memsvc.server.app import MemsvcServer
from memsvc.storage import api_keys
from memsvc.v1 import memory_pb2_grpc

_CLUSTER_TESTS = Path(__file__).resolve().parent / "cluster"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """tests/cluster runs memsvc on a Citus cluster (make test-cluster): collected only when
    the command line names it, never by the plain suite."""
    if collection_path.resolve() != _CLUSTER_TESTS:
        return None
    named = (
        (config.invocation_params.dir / str(arg).split("::", 1)[0]).resolve() for arg in config.args
    )
    return not any(path == _CLUSTER_TESTS or _CLUSTER_TESTS in path.parents for path in named)


# The read gates that answer to load, off in every server the suite starts: the suite itself
# keeps both cores busy (pytest, PostgreSQL, the embedder), and its clients share the
# server's event loop, so a burst of calls queues in front of the handlers while the loop
# sends them; a read degraded or refused because of that would fail tests about something
# else. tests/test_cpu_busy.py and tests/test_core_queue.py turn them on, each under control.
LOAD_GATES_OFF: dict[str, Any] = {
    "reads_max_cpu_busy": 0.0,
    "reads_max_queue_ms": 0,
    "reads_degrade_queue_ms": 0,
}


@pytest.fixture(scope="session")
def backing_urls() -> Iterator[tuple[str, str]]:
    """(pg_dsn, redis_url): external servers when configured, else embedded ones for the session."""
    external_pg = os.environ.get("MEMSVC_PG_DSN")
    external_redis = os.environ.get("MEMSVC_REDIS_URL")
    if external_pg and external_redis:
        yield external_pg, external_redis
        return
    from memsvc.embedded import EmbeddedStack

    with tempfile.TemporaryDirectory(prefix="memsvc-test-") as tmp:
        stack = EmbeddedStack(Path(tmp), durable=False)
        dsn, url = stack.start()
        try:
            yield external_pg or dsn, external_redis or url
        finally:
            stack.stop()


@pytest.fixture(scope="session")
def settings(backing_urls: tuple[str, str]) -> Settings:
    dsn, url = backing_urls
    return Settings(
        grpc_host="127.0.0.1",
        grpc_port=0,
        pg_dsn=dsn,
        redis_url=url,
        auth_enabled=True,
        shutdown_grace_s=2.0,
        # Any free port (server.metrics_port): never the standard 9464 another run may hold.
        metrics_port=0,
        # Packet warming off in the shared server: tests that count cache misses and builds
        # must not race a background rebuild. tests/test_prefetch_warm.py turns it on.
        prefetch_warm=False,
        **LOAD_GATES_OFF,
    )


@pytest.fixture(scope="session")
def embedder() -> Iterator[Embedder]:
    yield OnnxMiniLMEmbedder(intra_op_threads=1)


@asynccontextmanager
async def started_server(
    settings: Settings, embedder: Embedder, *, grace_s: float = 0.5, **overrides: Any
) -> AsyncIterator[MemsvcServer]:
    """A memsvc on the session's databases with ``overrides``, workers off, stopped after."""
    srv = MemsvcServer(settings.with_overrides(**overrides), embedder=embedder, with_worker=False)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop(grace_s=grace_s)


@pytest.fixture(scope="session")
async def server(settings: Settings, embedder: Embedder) -> AsyncIterator[MemsvcServer]:
    # Workers off in the shared server: write-path tests drain explicitly (see `drain`), so
    # no background job races an assertion. Tests of the in-server worker start their own.
    async with started_server(settings, embedder, grace_s=1.0) as srv:
        yield srv


@pytest.fixture(scope="session")
async def pool(server: MemsvcServer) -> asyncpg.Pool:
    assert server.pool is not None
    return server.pool


@pytest.fixture
def drain(server: MemsvcServer) -> Callable[[], Awaitable[int]]:
    """Run every due ingest job now with a real worker over the server's pipeline."""
    from memsvc.ingest.worker import OutboxWorker
    from memsvc.server.runtime import worker_settings

    async def run() -> int:
        assert server.settings.pg_dsn is not None
        worker = OutboxWorker(
            server.runtime.pool,
            server.runtime.pipeline,
            worker_settings(server.settings),
            listener=server.runtime.listener,
        )
        return await worker.drain()

    return run


@pytest.fixture
async def redis_client(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    assert settings.redis_url is not None
    client = aioredis.Redis.from_url(settings.redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
async def channel(server: MemsvcServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        yield ch


@dataclass
class Caller:
    """A tenant with its API key and a stub that sends the key on every call."""

    tenant_id: str
    key: str
    stub: memory_pb2_grpc.MemoryServiceStub

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-api-key", self.key),)


class _KeyedStub:
    """Wraps a stub so every call carries the caller's API key and a test deadline."""

    def __init__(self, stub: memory_pb2_grpc.MemoryServiceStub, key: str) -> None:
        self._stub = stub
        self._key = key

    def __getattr__(self, name: str) -> Callable[..., Awaitable[object]]:
        method = getattr(self._stub, name)

        def call(request: object, **kwargs: object) -> Awaitable[object]:
            kwargs.setdefault("metadata", (("x-api-key", self._key),))
            kwargs.setdefault("timeout", 10.0)
            return method(request, **kwargs)  # type: ignore[no-any-return]

        return call


@pytest.fixture
def new_caller(pool: asyncpg.Pool, channel: grpc.aio.Channel) -> Callable[[], Awaitable[Caller]]:
    """Factory: a fresh tenant (unique per call) with a real API key."""

    async def make() -> Caller:
        tenant = f"t-{uuid.uuid4().hex[:12]}"
        async with pool.acquire() as conn:
            key = await api_keys.create_key(conn, tenant, "test")
        stub = _KeyedStub(memory_pb2_grpc.MemoryServiceStub(channel), key)
        return Caller(tenant, key, stub)  # type: ignore[arg-type]

    return make


@pytest.fixture
async def caller(new_caller: Callable[[], Awaitable[Caller]]) -> Caller:
    return await new_caller()
