"""MemoryClient: reused grpc.aio channels (one by default), API key and request id per call,
deadline presets, retries only where they are safe, and ``ingest_nowait`` for turns that must
not wait."""

# ASYNC109: ``timeout`` is not a local timer but the gRPC deadline the server reads and budgets
# its own work by; asyncio.timeout around the call could not send it.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

import grpc

from memsvc.client import tracing
from memsvc.client.background import IngestFailure, IngestQueue, IngestQueueStats
from memsvc.client.errors import from_rpc_error
from memsvc.client.presets import Preset, timeout_s
from memsvc.client.recall_stream import RecallStream
from memsvc.client.retry import RetryPolicy, backoff_ms, retry_after_ms
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc

Req = TypeVar("Req")
Resp = TypeVar("Resp")

API_KEY_HEADER = "x-api-key"
REQUEST_ID_HEADER = "x-request-id"
# An attempt with less than this left would only come back DEADLINE_EXCEEDED.
MIN_ATTEMPT_S = 0.005
# ExportMemories streams a user's whole history: minutes, not a turn's milliseconds.
EXPORT_TIMEOUT_S = 600.0


def new_request_id() -> str:
    return uuid.uuid4().hex


def channel_options(keepalive_time_ms: int, keepalive_timeout_ms: int) -> list[tuple[str, int]]:
    """Keepalive that keeps an idle gateway connection warm between calls (memsvc's server
    accepts a ping every 10 s without calls; go lower and it closes the connection)."""
    return [
        ("grpc.keepalive_time_ms", keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


class MemoryClient:
    """An asyncio client for memsvc. Create one per process and share it; ``aclose()`` at exit.

    Every method takes the proto request and returns the proto response. A failed call raises
    ``MemsvcCallError`` (code, details, request id). ``preset`` ("voice" 200 ms, "chat" 800 ms)
    or ``timeout`` (seconds) bounds the whole call, retries included.
    """

    def __init__(
        self,
        target: str,
        *,
        api_key: str | None = None,
        default_preset: Preset = "chat",
        retry: RetryPolicy | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
        keepalive_time_ms: int = 30_000,
        keepalive_timeout_ms: int = 5_000,
        ingest_queue_size: int = 1000,
        ingest_senders: int = 2,
        ingest_nowait_timeout_s: float = 5.0,
        on_ingest_failure: Callable[[IngestFailure], None] | None = None,
        channels: int = 1,
    ) -> None:
        """``channels``: connections to hold, calls taking them in turn. A server started
        with ``--processes N`` spreads connections, not calls, over its processes: a client
        reaches all of them only over several connections (N or more)."""
        if channels < 1:
            raise ValueError(f"channels must be >= 1, got {channels}")
        options: list[tuple[str, int]] = channel_options(keepalive_time_ms, keepalive_timeout_ms)
        if channels > 1:
            # grpc shares one connection between channels to the same target with the same
            # options (a global subchannel pool): each channel must keep its own.
            options.append(("grpc.use_local_subchannel_pool", 1))
        self._channels: list[grpc.aio.Channel] = []
        for _ in range(channels):
            if credentials is None:
                channel = grpc.aio.insecure_channel(
                    target, options=options, interceptors=interceptors
                )
            else:
                channel = grpc.aio.secure_channel(
                    target, credentials, options=options, interceptors=interceptors
                )
            self._channels.append(channel)
        self._stubs = [pb_grpc.MemoryServiceStub(channel) for channel in self._channels]
        self._turn = 0
        self._api_key = api_key
        self._default_preset = default_preset
        self._retry = retry or RetryPolicy()
        self._random = random.Random()
        self._ingest_nowait_timeout_s = ingest_nowait_timeout_s
        self._queue = IngestQueue(
            self._send_background,
            maxsize=ingest_queue_size,
            senders=ingest_senders,
            on_failure=on_ingest_failure,
        )

    async def __aenter__(self) -> MemoryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def _stub(self) -> pb_grpc.MemoryServiceAsyncStub:
        """The next channel's stub, in turn."""
        stub = self._stubs[self._turn]
        self._turn = (self._turn + 1) % len(self._stubs)
        return stub

    @property
    def ingest_stats(self) -> IngestQueueStats:
        """Counters of the ``ingest_nowait`` queue (submitted, sent, failed, overflowed...)."""
        return self._queue.stats

    async def aclose(self, flush_timeout_s: float = 2.0) -> None:
        """Flush queued ``ingest_nowait`` work for up to ``flush_timeout_s``, then close."""
        try:
            await self._queue.aclose(flush_timeout_s)
        finally:
            await asyncio.gather(*(channel.close(None) for channel in self._channels))

    # -- reads: retried on UNAVAILABLE / RESOURCE_EXHAUSTED ----------------------------------

    async def prefetch(
        self,
        request: pb.PrefetchRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.PrefetchResponse:
        return await self._call(
            "Prefetch", self._stub.Prefetch, request, True, preset, timeout, request_id
        )

    async def recall(
        self,
        request: pb.RecallRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.RecallResponse:
        return await self._call(
            "Recall", self._stub.Recall, request, True, preset, timeout, request_id
        )

    def recall_stream(
        self,
        request: pb.RecallStreamRequest,
        *,
        final_preset: Preset | None = None,
        final_timeout: float | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> RecallStream:
        """Open a RecallStream for a voice call's utterances (see ``RecallStream``): send
        the interim transcripts, then each final for Recall's answer. ``request`` carries the
        scope and the other Recall fields; its ``final_deadline_ms``, when unset, comes from
        ``final_timeout`` or ``final_preset`` (default: the client's preset). ``timeout``:
        the whole stream's deadline (None: until closed). Not retried: a stream that failed
        raises, and the caller opens another (or recalls without it)."""
        rid, metadata = self._metadata(request_id)
        span = tracing.stream_span("RecallStream")
        tracing.inject(metadata, span)
        first = pb.RecallStreamRequest()
        first.CopyFrom(request)
        if not first.final_deadline_ms:
            first.final_deadline_ms = round(
                timeout_s(final_preset or self._default_preset, final_timeout) * 1000
            )
        return RecallStream(
            self._stub,
            first,
            metadata=metadata,
            request_id=rid,
            timeout=timeout,
            final_timeout_s=first.final_deadline_ms / 1000,
            span=span,
        )

    async def get_ingest_status(
        self,
        request: pb.GetIngestStatusRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.IngestStatus:
        return await self._call(
            "GetIngestStatus",
            self._stub.GetIngestStatus,
            request,
            True,
            preset,
            timeout,
            request_id,
        )

    async def list_memories(
        self,
        request: pb.ListMemoriesRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.ListMemoriesResponse:
        return await self._call(
            "ListMemories", self._stub.ListMemories, request, True, preset, timeout, request_id
        )

    async def get_memory_history(
        self,
        request: pb.GetMemoryHistoryRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.GetMemoryHistoryResponse:
        return await self._call(
            "GetMemoryHistory",
            self._stub.GetMemoryHistory,
            request,
            True,
            preset,
            timeout,
            request_id,
        )

    async def get_memory(
        self,
        request: pb.GetMemoryRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.Memory:
        return await self._call(
            "GetMemory", self._stub.GetMemory, request, True, preset, timeout, request_id
        )

    async def update_memory(
        self,
        request: pb.UpdateMemoryRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.UpdateMemoryResponse:
        """Retried like a read: the proto makes it safe (the same values apply once; a repeated
        "ttl" only re-arms the expiry from now again)."""
        return await self._call(
            "UpdateMemory", self._stub.UpdateMemory, request, True, preset, timeout, request_id
        )

    async def export_memories(
        self,
        request: pb.ExportMemoriesRequest,
        *,
        timeout: float = EXPORT_TIMEOUT_S,
        request_id: str | None = None,
    ) -> AsyncIterator[pb.ExportRecord]:
        """Every record of the export as it arrives (``record.json + "\\n"`` makes a JSON-lines
        file; the last record is the ``summary``). A refusal before the first record
        (UNAVAILABLE, RESOURCE_EXHAUSTED) is retried within ``timeout``; a failure after it
        raises ``MemsvcCallError``: the records seen so far are an incomplete export, so
        discard them and call again (an export always restarts from the beginning)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s(self._default_preset, timeout)
        rid, metadata = self._metadata(request_id)
        attempt = 0
        while True:
            attempt += 1
            call = self._stub.ExportMemories(
                request, timeout=deadline - loop.time(), metadata=metadata
            )
            streamed = False
            try:
                async for record in call:
                    streamed = True
                    yield record
                return
            except grpc.aio.AioRpcError as exc:
                error = from_rpc_error(exc, rpc="ExportMemories", request_id=rid, attempts=attempt)
                if (
                    streamed
                    or attempt >= self._retry.max_attempts
                    or exc.code() not in self._retry.retryable
                ):
                    raise error from exc
                delay_s = self._backoff_s(attempt, exc, deadline - loop.time())
                if delay_s is None:
                    raise error from exc
                await asyncio.sleep(delay_s)
            finally:
                # Stopping early (break, an exception in the caller's loop) ends the call, so
                # the server releases its snapshot at once.
                call.cancel()

    async def watch_memories(
        self,
        request: pb.WatchMemoriesRequest,
        *,
        timeout: float | None = None,
        request_id: str | None = None,
        max_attempts: int = 10,
    ) -> AsyncIterator[pb.MemoryChange]:
        """The scope's changes as they commit (heartbeats included), until the caller stops
        iterating or ``timeout`` (None: no end) runs out. The server opens with a heartbeat
        carrying the start position. When the stream breaks with UNAVAILABLE or
        RESOURCE_EXHAUSTED (a restart, a network cut, too many watchers) it reconnects with
        backoff and resumes after the last position received, so no change is lost or
        repeated; every other status raises ``MemsvcCallError`` (OUT_OF_RANGE: the position
        is older than the retained changes; re-read with list_memories and watch from now),
        and so does the last of ``max_attempts`` failed attempts in a row (the pauses grow to
        the retry policy's max_backoff_ms: about 10 s of outage by default)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        rid, metadata = self._metadata(request_id)
        resume = pb.WatchMemoriesRequest()
        resume.CopyFrom(request)
        # Failed attempts since the last message received.
        failures = 0
        while True:
            left = None if deadline is None else deadline - loop.time()
            call = self._stub.WatchMemories(resume, timeout=left, metadata=metadata)
            try:
                async for change in call:
                    failures = 0
                    resume.after_position = change.position
                    yield change
                return
            except grpc.aio.AioRpcError as exc:
                failures += 1
                error = from_rpc_error(exc, rpc="WatchMemories", request_id=rid, attempts=failures)
                if exc.code() not in self._retry.retryable or failures >= max_attempts:
                    raise error from exc
                delay_s = self._backoff_s(
                    failures, exc, float("inf") if deadline is None else deadline - loop.time()
                )
                if delay_s is None:
                    raise error from exc
                await asyncio.sleep(delay_s)
            finally:
                call.cancel()

    # -- Ingest: retried, because the idempotency key makes a repeat harmless -----------------

    async def ingest(
        self,
        request: pb.IngestRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.IngestResponse:
        """Store a turn's messages. Without an ``idempotency_key`` one is generated, and every
        retry reuses it: a retry after a lost reply answers ``duplicate: true``, the same
        ``ingest_id``, and stores nothing twice."""
        return await self._call(
            "Ingest", self._stub.Ingest, with_key(request), True, preset, timeout, request_id
        )

    def ingest_nowait(self, request: pb.IngestRequest) -> bool:
        """Hand an Ingest to the background queue and return at once (never raises for the
        call's outcome). False when it was not queued (full or closed): ``on_ingest_failure``
        was told. The key is fixed here, so the background retries reuse it."""
        return self._queue.submit(with_key(request))

    async def _send_background(self, request: pb.IngestRequest) -> object:
        return await self.ingest(request, timeout=self._ingest_nowait_timeout_s)

    # -- writes that are never retried: a repeat could apply twice ----------------------------

    async def remember(
        self,
        request: pb.RememberRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.RememberResponse:
        return await self._call(
            "Remember", self._stub.Remember, request, False, preset, timeout, request_id
        )

    async def remember_batch(
        self,
        request: pb.RememberBatchRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.RememberBatchResponse:
        """Up to 100 Remembers in one call; never retried (a repeat reinforces). With
        ``atomic`` all or nothing, else check ``results[i].ok`` per item."""
        return await self._call(
            "RememberBatch", self._stub.RememberBatch, request, False, preset, timeout, request_id
        )

    async def import_memories(
        self,
        scope: pb.Scope,
        lines: ImportSource,
        *,
        keep_record_scopes: bool = False,
        timeout: float = EXPORT_TIMEOUT_S,
        request_id: str | None = None,
    ) -> pb.ImportMemoriesResponse:
        """Import the JSON lines ExportMemories wrote into ``scope.user_id``: ``lines`` is a
        path of a JSON-lines file, or an iterable or async iterable of lines. Retried on
        UNAVAILABLE within ``timeout``: an import is idempotent (a record already imported
        is skipped), so a repeat never writes anything twice."""
        buffered = await _read_lines(lines)

        async def stream() -> AsyncIterator[pb.ImportMemoriesRequest]:
            yield pb.ImportMemoriesRequest(scope=scope, keep_record_scopes=keep_record_scopes)
            for line in buffered:
                yield pb.ImportMemoriesRequest(json=line)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        rid, metadata = self._metadata(request_id)
        attempt = 0
        while True:
            attempt += 1
            try:
                reply: pb.ImportMemoriesResponse = await self._stub.ImportMemories(
                    stream(), timeout=deadline - loop.time(), metadata=metadata
                )
                return reply
            except grpc.aio.AioRpcError as exc:
                error = from_rpc_error(exc, rpc="ImportMemories", request_id=rid, attempts=attempt)
                if attempt >= self._retry.max_attempts or exc.code() not in self._retry.retryable:
                    raise error from exc
                delay_s = self._backoff_s(attempt, exc, deadline - loop.time())
                if delay_s is None:
                    raise error from exc
                await asyncio.sleep(delay_s)

    async def correct(
        self,
        request: pb.CorrectRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.Memory:
        return await self._call(
            "Correct", self._stub.Correct, request, False, preset, timeout, request_id
        )

    async def forget(
        self,
        request: pb.ForgetRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.ForgetResponse:
        return await self._call(
            "Forget", self._stub.Forget, request, False, preset, timeout, request_id
        )

    async def list_sessions(
        self,
        request: pb.ListSessionsRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.ListSessionsResponse:
        return await self._call(
            "ListSessions", self._stub.ListSessions, request, True, preset, timeout, request_id
        )

    async def list_episodes(
        self,
        request: pb.ListEpisodesRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.ListEpisodesResponse:
        return await self._call(
            "ListEpisodes", self._stub.ListEpisodes, request, True, preset, timeout, request_id
        )

    async def forget_session(
        self,
        request: pb.ForgetSessionRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.ForgetSessionResponse:
        """Not retried: a repeat of a call that did delete answers NOT_FOUND."""
        return await self._call(
            "ForgetSession", self._stub.ForgetSession, request, False, preset, timeout, request_id
        )

    # -- core blocks --------------------------------------------------------------------------

    async def get_core_blocks(
        self,
        request: pb.GetCoreBlocksRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.GetCoreBlocksResponse:
        return await self._call(
            "GetCoreBlocks", self._stub.GetCoreBlocks, request, True, preset, timeout, request_id
        )

    async def update_core_block(
        self,
        request: pb.UpdateCoreBlockRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.UpdateCoreBlockResponse:
        """Not retried: a repeated APPEND would add its line twice (set expected_revision to
        retry safely yourself)."""
        return await self._call(
            "UpdateCoreBlock",
            self._stub.UpdateCoreBlock,
            request,
            False,
            preset,
            timeout,
            request_id,
        )

    async def get_core_block_history(
        self,
        request: pb.GetCoreBlockHistoryRequest,
        *,
        preset: Preset | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> pb.GetCoreBlockHistoryResponse:
        return await self._call(
            "GetCoreBlockHistory",
            self._stub.GetCoreBlockHistory,
            request,
            True,
            preset,
            timeout,
            request_id,
        )

    # -- the one call path --------------------------------------------------------------------

    async def _call(
        self,
        rpc: str,
        method: grpc.aio.UnaryUnaryMultiCallable[Req, Resp],
        request: Req,
        retryable: bool,
        preset: Preset | None,
        timeout: float | None,
        request_id: str | None,
    ) -> Resp:
        # One budget for the whole call: each attempt gets what is left, never a fresh timer.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s(preset or self._default_preset, timeout)
        rid, metadata = self._metadata(request_id)
        attempts = self._retry.max_attempts if retryable else 1
        attempt = 0
        # One span for the call, its retries included; its trace context goes to the server.
        with tracing.call_span(rpc):
            tracing.inject(metadata)
            while True:
                attempt += 1
                try:
                    # The server reads the deadline from the call: each attempt sends what is
                    # left.
                    return await method(request, timeout=deadline - loop.time(), metadata=metadata)
                except grpc.aio.AioRpcError as exc:
                    error = from_rpc_error(exc, rpc=rpc, request_id=rid, attempts=attempt)
                    if attempt >= attempts or exc.code() not in self._retry.retryable:
                        raise error from exc
                    delay_s = self._backoff_s(attempt, exc, deadline - loop.time())
                    if delay_s is None:
                        raise error from exc
                    await asyncio.sleep(delay_s)

    def _metadata(self, request_id: str | None) -> tuple[str, grpc.aio.Metadata]:
        """A call's request id (``request_id``, or a new one) and the metadata carrying it
        and the API key."""
        rid = request_id or new_request_id()
        metadata = grpc.aio.Metadata((REQUEST_ID_HEADER, rid))
        if self._api_key is not None:
            metadata.add(API_KEY_HEADER, self._api_key)
        return rid, metadata

    def _backoff_s(
        self, attempt: int, exc: grpc.aio.AioRpcError, remaining_s: float
    ) -> float | None:
        """The pause before the next attempt (the server's retry hint wins), or None when
        too little of the deadline would be left for it."""
        delay_s = (
            backoff_ms(
                self._retry,
                attempt,
                self._random.random(),
                retry_after_ms(exc.trailing_metadata()),
            )
            / 1000
        )
        return None if remaining_s - delay_s < MIN_ATTEMPT_S else delay_s


# What import_memories reads: a JSON-lines file's path, or its lines.
ImportSource = str | os.PathLike[str] | Iterable[str] | AsyncIterable[str]


async def _read_lines(source: ImportSource) -> list[str]:
    """The non-blank lines of an import source (a file is read off the event loop)."""
    if isinstance(source, str | os.PathLike):
        text = await asyncio.to_thread(Path(source).read_text, encoding="utf-8")
        return [line for line in text.split("\n") if line.strip()]
    if isinstance(source, AsyncIterable):
        return [line.rstrip("\n") async for line in source if line.strip()]
    return [line.rstrip("\n") for line in source if line.strip()]


def with_key(request: pb.IngestRequest) -> pb.IngestRequest:
    """``request`` with an idempotency key: its own, or a copy carrying a fresh one."""
    if request.idempotency_key:
        return request
    keyed = pb.IngestRequest()
    keyed.CopyFrom(request)
    keyed.idempotency_key = f"auto-{uuid.uuid4().hex}"
    return keyed
