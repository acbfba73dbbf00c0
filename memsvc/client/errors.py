"""The client's one error: a failed call, with its status code and the request id to quote."""

from __future__ import annotations

import grpc


class MemsvcCallError(Exception):
    """A call that ended with a non-OK status (after any retries the policy allowed)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        *,
        rpc: str,
        request_id: str,
        attempts: int,
    ) -> None:
        super().__init__(f"{rpc} failed with {code.name}: {details} (request id {request_id})")
        self.code = code
        self.details = details
        self.rpc = rpc
        self.request_id = request_id
        self.attempts = attempts


def from_rpc_error(
    exc: grpc.aio.AioRpcError, *, rpc: str, request_id: str, attempts: int
) -> MemsvcCallError:
    """Map grpc's error to the client's; decisions read the code, never the message text."""
    return MemsvcCallError(
        exc.code(), exc.details() or "", rpc=rpc, request_id=request_id, attempts=attempts
    )
