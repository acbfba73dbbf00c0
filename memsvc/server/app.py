"""Server lifecycle: dependencies, gRPC with health and reflection, graceful stop."""

from __future__ import annotations

import asyncio
import logging
import signal
from contextlib import AsyncExitStack
from typing import Self

import asyncpg
import grpc
import redis.asyncio as aioredis
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer as AsyncHealthServicer
from grpc_reflection.v1alpha import reflection

from memsvc.cache.invalidation import PacketInvalidator
from memsvc.config import Settings
from memsvc.embedding import Embedder
from memsvc.embedding.factory import build_embedder
from memsvc.memories.service import MemoryService
from memsvc.server.auth import Authenticator
from memsvc.server.servicer import MemoryServicer
from memsvc.storage.pool import connect_and_migrate
from memsvc.v1 import memory_pb2, memory_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def embedder_from_settings(settings: Settings) -> Embedder:
    return build_embedder(
        settings.embedder,
        intra_op_threads=settings.onnx_intra_op_threads,
        base_url=settings.openai_base_url,
        model=settings.openai_embedding_model,
        api_key=settings.openai_api_key,
        dimension=settings.embedding_dim,
        timeout_s=settings.embed_timeout_ms / 1000,
    )


class MemsvcServer:
    """One memsvc process: pool, cache client, embedder, servicer and the gRPC server."""

    def __init__(self, settings: Settings, *, embedder: Embedder | None = None) -> None:
        self.settings = settings
        self._embedder = embedder
        self._stack = AsyncExitStack()
        self._server: grpc.aio.Server | None = None
        self._health: AsyncHealthServicer | None = None
        self.pool: asyncpg.Pool | None = None
        self.port: int = 0

    async def start(self) -> int:
        """Connect, migrate, bind and start serving; returns the bound port."""
        settings = self.settings
        if settings.pg_dsn is None or settings.redis_url is None:
            raise ValueError("pg_dsn and redis_url must be set before the server starts")
        try:
            self.pool = await connect_and_migrate(settings)
            self._stack.push_async_callback(self.pool.close)
            redis_client = aioredis.Redis.from_url(
                settings.redis_url,
                socket_timeout=settings.redis_timeout_ms / 1000,
                socket_connect_timeout=settings.redis_timeout_ms / 1000,
            )
            self._stack.push_async_callback(redis_client.aclose)
            embedder: Embedder
            if self._embedder is not None:
                embedder = self._embedder
            else:
                embedder = await asyncio.to_thread(embedder_from_settings, settings)
                self._stack.push_async_callback(embedder.aclose)
            if embedder.dimension != settings.embedding_dim:
                raise ValueError(
                    f"the embedder produces {embedder.dimension} dimensions but "
                    f"MEMSVC_EMBEDDING_DIM is {settings.embedding_dim}"
                )
            memories = MemoryService(
                self.pool,
                embedder,
                PacketInvalidator(redis_client, timeout_s=settings.redis_timeout_ms / 1000),
                acquire_timeout_s=settings.pg_acquire_timeout_ms / 1000,
                embed_timeout_s=settings.embed_timeout_ms / 1000,
            )
            auth = Authenticator(
                self.pool,
                enabled=settings.auth_enabled,
                default_tenant=settings.default_tenant,
                acquire_timeout_s=settings.pg_acquire_timeout_ms / 1000,
            )
            server = grpc.aio.server(
                options=[
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.so_reuseport", 0),
                ]
            )
            memory_pb2_grpc.add_MemoryServiceServicer_to_server(
                MemoryServicer(settings, auth, memories), server
            )
            health_servicer = AsyncHealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            reflection.enable_server_reflection(
                (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
            )
            self.port = server.add_insecure_port(f"{settings.grpc_host}:{settings.grpc_port}")
            if self.port == 0:
                raise OSError(f"cannot bind {settings.grpc_host}:{settings.grpc_port}")
            await server.start()
            self._server = server
            for name in ("", SERVICE_NAME):
                await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
            self._health = health_servicer
        except BaseException:
            await self._stack.aclose()
            raise
        return self.port

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting calls, let in-flight ones finish within the grace period, close all."""
        if self._server is not None:
            if self._health is not None:
                await self._health.enter_graceful_shutdown()
            await self._server.stop(self.settings.shutdown_grace_s if grace_s is None else grace_s)
            self._server = None
        await self._stack.aclose()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def serve_until_signalled(server: MemsvcServer) -> None:
    """Serve until SIGINT or SIGTERM, then shut down gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        log.info("memsvc serving gRPC on %s:%d", server.settings.grpc_host, server.port)
        await stop.wait()
        log.info("shutting down (grace %.1fs)", server.settings.shutdown_grace_s)
    finally:
        await server.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
