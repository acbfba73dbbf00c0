"""Server lifecycle: dependencies, gRPC with health and reflection, graceful stop."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Self

import asyncpg
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer as AsyncHealthServicer
from grpc_reflection.v1alpha import reflection

from memsvc.config import Settings
from memsvc.embedding import Embedder
from memsvc.extraction import parser_process
from memsvc.extraction.base import Extractor
from memsvc.observability import gc_pauses
from memsvc.observability.metrics_http import MetricsEndpoint
from memsvc.overload.core_queue import server_ids
from memsvc.server.auth import Authenticator
from memsvc.server.interceptor import ObservingInterceptor
from memsvc.server.runtime import Runtime
from memsvc.server.servicer import MemoryServicer
from memsvc.server.tls import server_credentials
from memsvc.server.warmup import warm_read_path
from memsvc.v1 import memory_pb2, memory_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# gRPC drops a request over this many times max_request_bytes before anything reads it
# (RESOURCE_EXHAUSTED); up to it, the interceptor answers INVALID_ARGUMENT with the size.
TRANSPORT_REQUEST_FACTOR = 2


class MemsvcServer:
    """One memsvc process: pool, cache client, embedder, servicer and the gRPC server."""

    def __init__(
        self,
        settings: Settings,
        *,
        embedder: Embedder | None = None,
        extractor: Extractor | None = None,
        with_worker: bool | None = None,
        metrics_any_port_if_taken: bool = False,
        reuse_port: bool = False,
    ) -> None:
        """``reuse_port``: bind with SO_REUSEPORT, sharing the port with the other serving
        processes (server/processes.py); off, a second server on a taken port fails."""
        self.settings = settings
        self._reuse_port = reuse_port
        self._metrics_any_port = metrics_any_port_if_taken
        self._metrics = MetricsEndpoint()
        self.runtime = Runtime(
            settings, embedder=embedder, extractor=extractor, with_worker=with_worker
        )
        self._server: grpc.aio.Server | None = None
        self._health: AsyncHealthServicer | None = None
        self._auth: Authenticator | None = None
        self.pool: asyncpg.Pool | None = None
        self.port: int = 0
        #: Where /metrics is served (0: not served).
        self.metrics_port: int = 0

    async def start(self) -> int:
        """Connect, migrate, start workers, bind and start serving; returns the bound port."""
        settings = self.settings
        # First, so a refused plaintext bind or an unreadable certificate fails before any
        # connection is made.
        credentials = server_credentials(settings)
        await self.runtime.start()
        try:
            runtime = self.runtime
            self.pool = runtime.pool
            auth = Authenticator(
                runtime.pool,
                enabled=settings.auth_enabled,
                default_tenant=settings.default_tenant,
                listener=runtime.listener,
                acquire_timeout_s=settings.pg_acquire_timeout_ms / 1000,
                unknown_lookups_per_s=settings.auth_unknown_lookups_per_s,
                unknown_cache_size=settings.auth_unknown_cache_size,
            )
            auth.start()
            self._auth = auth
            worker = runtime.worker
            core_queue = runtime.core_queue
            servicer = MemoryServicer(
                settings,
                auth,
                runtime.services,
                on_read=(lambda s: worker.kick(s.tenant_id, s.user_id)) if worker else None,
                load=runtime.load,
            )
            if runtime.warmer is not None:
                # Rebuilds packets after changes (any process's), after this server's reads.
                runtime.warmer.busy = servicer.reads_busy
                runtime.warmer.start()
            servers_before = server_ids()
            server = grpc.aio.server(
                interceptors=[
                    ObservingInterceptor(
                        max_request_bytes=settings.max_request_bytes,
                        core_queue=core_queue,
                        stream_stall_s=settings.stream_stall_s,
                    )
                ],
                options=[
                    (
                        "grpc.max_receive_message_length",
                        TRANSPORT_REQUEST_FACTOR * settings.max_request_bytes,
                    ),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.so_reuseport", int(self._reuse_port)),
                    # Gateways keep one connection warm between calls with keepalive pings
                    # (memsvc.client pings every 30 s); the default (one per 5 min without a
                    # call) would answer them with GOAWAY too_many_pings.
                    ("grpc.keepalive_permit_without_calls", 1),
                    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ],
            )
            # The one channelz id the new server added (servers are created on this thread).
            new_ids = server_ids() - servers_before
            if len(new_ids) == 1:
                core_queue.watch(new_ids.pop())
            memory_pb2_grpc.add_MemoryServiceServicer_to_server(servicer, server)
            health_servicer = AsyncHealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            reflection.enable_server_reflection(
                (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
            )
            address = f"{settings.grpc_host}:{settings.grpc_port}"
            if credentials is None:
                self.port = server.add_insecure_port(address)
            else:
                self.port = server.add_secure_port(address, credentials)
            if self.port == 0:
                raise OSError(f"cannot bind {settings.grpc_host}:{settings.grpc_port}")
            # Before the port answers: the first callers must not pay the one-time costs.
            warmed_s = await warm_read_path(
                runtime.recall,
                runtime.prefetch,
                pool=runtime.pool,
                redis=runtime.redis,
                packet_chars=settings.packet_default_chars,
                dimension=settings.embedding_dim,
            )
            log.debug("read path warmed in %.0f ms", warmed_s * 1000)
            await server.start()
            self._server = server
            if settings.reads_max_queue_ms > 0 or settings.reads_degrade_queue_ms > 0:
                core_queue.start()
            for name in ("", SERVICE_NAME):
                await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
            self._health = health_servicer
            if settings.metrics_port is not None:
                self.metrics_port = self._metrics.start(
                    settings.metrics_host,
                    settings.metrics_port,
                    any_port_if_taken=self._metrics_any_port,
                )
        except BaseException:
            self.runtime.core_queue.stop()
            if self._server is not None:
                await self._server.stop(None)
                self._server = None
            await self._stop_auth()
            await self.runtime.close()
            raise
        return self.port

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting calls and claiming jobs; in-flight calls and running jobs finish
        within one grace period, side by side (never one grace after the other: SIGTERM's
        bound is the grace, not twice it); then close every connection."""
        grace = self.settings.shutdown_grace_s if grace_s is None else grace_s
        self.runtime.core_queue.stop()
        worker = self.runtime.worker
        drained = asyncio.ensure_future(worker.stop(grace)) if worker is not None else None
        try:
            if self._server is not None:
                if self._health is not None:
                    await self._health.enter_graceful_shutdown()
                await self._server.stop(grace)
                self._server = None
        finally:
            if drained is not None:
                await drained
        await self._metrics.stop()
        self.metrics_port = 0
        await self._stop_auth()
        await self.runtime.close()

    async def _stop_auth(self) -> None:
        auth, self._auth = self._auth, None
        if auth is not None:
            await auth.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def serve_until_signalled(
    server: MemsvcServer,
    *,
    on_serving: Callable[[], None] | None = None,
    signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM),
) -> None:
    """Serve until one of ``signals``, then shut down gracefully; ``on_serving`` is called
    once the port answers."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        if on_serving is not None:
            on_serving()
        settings = server.settings
        log.info(
            "memsvc serving gRPC (%s) on %s:%d",
            "TLS" if settings.tls_cert_file else "plaintext",
            settings.grpc_host,
            server.port,
        )
        if server.metrics_port:
            log.info("metrics on http://%s:%d/metrics", settings.metrics_host, server.metrics_port)
        async with gc_pauses.frozen_and_observed():
            await stop.wait()
        log.info("shutting down (grace %.1fs)", server.settings.shutdown_grace_s)
    finally:
        await server.stop()
        # The calls and jobs had their grace: a parse still in hand must not hold the exit.
        parser_process.stop()
        for sig in signals:
            loop.remove_signal_handler(sig)
