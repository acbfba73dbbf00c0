"""Answering a call with a memsvc error: its code and message, and a retry hint in trailers.

A retry hint goes out twice: as google.rpc.RetryInfo inside the standard rich status
(`grpc-status-details-bin`, which grpc-status libraries of every language decode), and as a
plain `retry-after-ms` entry for clients without them.
"""

from __future__ import annotations

import asyncio
import math
from typing import NoReturn

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from memsvc.errors import MemsvcError

RETRY_AFTER_HEADER = "retry-after-ms"
# The trailer gRPC libraries read a google.rpc.Status from (grpc_status's constant).
GRPC_DETAILS_METADATA_KEY = "grpc-status-details-bin"

Trailers = tuple[tuple[str, str | bytes], ...]


def retry_trailers(code: grpc.StatusCode, message: str, retry_after_s: float) -> Trailers:
    """The two trailing entries that tell a client when to retry (whole milliseconds, >= 1)."""
    ms = max(1, math.ceil(retry_after_s * 1000))
    info = error_details_pb2.RetryInfo(
        retry_delay=duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=code.value[0], message=message, details=[detail])
    return (
        (GRPC_DETAILS_METADATA_KEY, status.SerializeToString()),
        (RETRY_AFTER_HEADER, str(ms)),
    )


def caller_gone(context: grpc.aio.ServicerContext[object, object]) -> bool:
    """The call has ended (cancelled, answered) or its deadline has passed: an answer now
    reaches nobody. grpc's core ends a call at its deadline by itself, and a status sent on it
    then fails in the core, which grpc logs as an ERROR with a traceback (ExecuteBatchError)
    unless the loop already took the news of the end; on a saturated loop it has not."""
    if context.done():
        return True
    remaining = context.time_remaining()
    return remaining is not None and remaining <= 0


async def abort(context: grpc.aio.ServicerContext[object, object], error: MemsvcError) -> NoReturn:
    """End the call with ``error``, keeping trailers already set (the request id)."""
    if caller_gone(context):
        # There is nobody to answer (and grpc would log the attempt).
        raise asyncio.CancelledError
    if error.retry_after_s is None:
        await context.abort(error.code, error.message)
    else:
        # An explicit trailing_metadata replaces what was set before, so carry it over.
        kept = tuple(context.trailing_metadata() or ())
        extra = retry_trailers(error.code, error.message, error.retry_after_s)
        await context.abort(error.code, error.message, trailing_metadata=(*kept, *extra))
    raise AssertionError("unreachable: context.abort raises")
