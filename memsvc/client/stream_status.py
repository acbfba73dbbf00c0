"""The server's status of a call that streams requests, kept from grpc's write race.

grpc's asyncio client has a known bug (grpc/grpc#36066, fix proposed in grpc/grpc#43486):
when the server ends a request-streaming call (a refusal, a bad request mid-stream) while
the client is still writing, the failed write replaces the status the server sent with
``INTERNAL: Internal error from Core``. Measured here: a RecallStream refused for its key
after five interims was reported INTERNAL in 246 calls of 300. The client must report the
server's answer, so :class:`ServerStatus` records each status grpc sets on the call and
:meth:`ServerStatus.error` swaps grpc's invented INTERNAL for the server's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

# What grpc sets when a write fails (grpc/_cython/_cygrpc/aio/call.pyx.pxi, set_internal_error).
CORE_WRITE_FAILED = "Internal error from Core"
# How long to wait for the server's status once grpc reported its own: it is already on its
# way (the write failed because the server had ended the call).
STATUS_WAIT_S = 1.0

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _is_write_failure(code: grpc.StatusCode, details: str | None) -> bool:
    return code == grpc.StatusCode.INTERNAL and details == CORE_WRITE_FAILED


class ServerStatus:
    """Watches one stream-stream call for the server's status. (ImportMemories, stream-unary,
    was not seen to lose it: 20 refused imports of 5,000 lines each kept UNAUTHENTICATED.)"""

    def __init__(self, call: grpc.aio.Call) -> None:
        self._error: grpc.aio.AioRpcError | None = None
        self._arrived = asyncio.Event()
        call.add_done_callback(self._on_status)

    def _on_status(self, call: Any) -> None:
        # Called synchronously each time grpc sets the call's status: read it now, before a
        # failed write can replace it. The status object has no public accessor outside a
        # coroutine (Call.code() awaits), hence the cython call's attribute.
        status = getattr(getattr(call, "_cython_call", None), "_status", None)
        if status is None or self._error is not None:
            return
        code = _CODES.get(status.code(), grpc.StatusCode.UNKNOWN)
        if code == grpc.StatusCode.OK or _is_write_failure(code, status.details()):
            return
        self._error = grpc.aio.AioRpcError(
            code,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(*(status.trailing_metadata() or ())),
            status.details(),
            status.debug_error_string(),
        )
        self._arrived.set()

    async def error(self, exc: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
        """``exc``, or the server's own status when ``exc`` is grpc's write failure."""
        if not _is_write_failure(exc.code(), exc.details()):
            return exc
        try:
            async with asyncio.timeout(STATUS_WAIT_S):
                await self._arrived.wait()
        except TimeoutError:
            return exc
        assert self._error is not None
        return self._error
