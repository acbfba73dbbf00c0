"""One open RecallStream on the client side: interim transcripts out, an answer per final."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from memsvc.client.errors import MemsvcCallError, from_rpc_error
from memsvc.client.stream_status import ServerStatus
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc

RPC = "RecallStream"
# Past the final's own deadline the answer may still be on its way (the server answers by
# then, less its margin); this much more covers the trip back.
FINAL_SLACK_S = 0.05
# Requests not yet taken by gRPC; a transcriber sends a few per second, so a full queue means
# the connection is stuck, and interim() then waits like any write.
MAX_QUEUED = 32


class RecallStream:
    """Send every interim transcript with :meth:`interim` (it does not wait for memsvc), then
    the final one with :meth:`final`, which returns Recall's answer for it. The stream may
    carry further utterances after a final. Close it with :meth:`aclose` (or ``async with``).

    ``request``: the first request's fields (scope, top_k, types, mode, as_of, filters,
    final_deadline_ms); its ``query`` and ``final`` are ignored. A stream that failed raises
    ``MemsvcCallError`` from then on (an error is seen at the next final); open a new one.
    """

    def __init__(
        self,
        stub: pb_grpc.MemoryServiceAsyncStub,
        request: pb.RecallStreamRequest,
        *,
        metadata: grpc.aio.Metadata,
        request_id: str,
        timeout: float | None,
        final_timeout_s: float,
        span: Any = None,
    ) -> None:
        """``span``: the stream's client span (OpenTelemetry), ended when it closes."""
        self._first: pb.RecallStreamRequest | None = pb.RecallStreamRequest()
        self._first.CopyFrom(request)
        self._first.ClearField("query")
        self._first.ClearField("final")
        self._request_id = request_id
        self._final_timeout_s = final_timeout_s
        self._queue: asyncio.Queue[pb.RecallStreamRequest | None] = asyncio.Queue(MAX_QUEUED)
        self._call = stub.RecallStream(_Requests(self._queue), timeout=timeout, metadata=metadata)
        self._status = ServerStatus(self._call)
        self._responses = aiter(self._call)
        self._failed: Exception | None = None
        self._last_interim = ""
        self._span = span

    async def __aenter__(self) -> RecallStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def request_id(self) -> str:
        return self._request_id

    def _request(self, text: str, *, final: bool) -> pb.RecallStreamRequest:
        first, self._first = self._first, None
        request = first if first is not None else pb.RecallStreamRequest()
        request.query = text
        request.final = final
        return request

    async def interim(self, text: str) -> None:
        """An interim transcript (the words heard so far); a repeat of the last is not sent."""
        if self._failed is not None:
            raise self._failed
        if text == self._last_interim:
            return
        self._last_interim = text
        await self._queue.put(self._request(text, final=False))

    async def final(self, text: str) -> pb.RecallResponse:
        """The utterance's final transcript; Recall's answer for it, within the final's
        deadline (TimeoutError past it, and the stream is closed)."""
        if self._failed is not None:
            raise self._failed
        self._last_interim = ""
        await self._queue.put(self._request(text, final=True))
        try:
            async with asyncio.timeout(self._final_timeout_s + FINAL_SLACK_S):
                response = await anext(self._responses, None)
        except grpc.aio.AioRpcError as exc:
            self._failed = from_rpc_error(
                await self._status.error(exc), rpc=RPC, request_id=self._request_id, attempts=1
            )
            raise self._failed from exc
        except TimeoutError as exc:
            self._failed = exc
            self._call.cancel()
            raise
        if response is None:
            self._failed = MemsvcCallError(
                grpc.StatusCode.UNAVAILABLE,
                "the stream ended without an answer",
                rpc=RPC,
                request_id=self._request_id,
                attempts=1,
            )
            raise self._failed
        return response

    async def aclose(self) -> None:
        """End the stream (the server stops any work ahead at once)."""
        self._call.cancel()
        span, self._span = self._span, None
        if span is not None:
            if self._failed is not None:
                span.record_exception(self._failed)
            span.end()


class _Requests:
    """The requests grpc sends, as they are queued (None ends them). An iterator object, not
    an async generator: grpc cancels its consumer mid-await when the call ends, and closing a
    generator suspended there fails ("asynchronous generator is already running")."""

    def __init__(self, queue: asyncio.Queue[pb.RecallStreamRequest | None]) -> None:
        self._queue = queue

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> pb.RecallStreamRequest:
        request = await self._queue.get()
        if request is None:
            raise StopAsyncIteration
        return request
