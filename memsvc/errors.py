"""One error tree: every domain error carries the gRPC status code it is answered with."""

from __future__ import annotations

import grpc


class MemsvcError(Exception):
    """Base of every error memsvc answers a call with."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    #: When set, the answer carries a retry hint (google.rpc.RetryInfo and retry-after-ms).
    retry_after_s: float | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(MemsvcError):
    """The request is malformed; nothing was written."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(MemsvcError):
    """The named object does not exist in the caller's exact scope."""

    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(MemsvcError):
    """The object exists but is in a state the operation does not accept."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class AlreadyExists(MemsvcError):
    """The request names something (an idempotency key) already used for another request."""

    code = grpc.StatusCode.ALREADY_EXISTS


class Unauthenticated(MemsvcError):
    """No valid API key was presented."""

    code = grpc.StatusCode.UNAUTHENTICATED


class ResourceExhausted(MemsvcError):
    """A limit or quota was reached; retry later."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Overloaded(ResourceExhausted):
    """The server sheds load (a read refused at once): counted and summarized in the log
    (overload/shed_log.py), not logged per call."""


class OutOfRange(MemsvcError):
    """A position or offset past what is kept (e.g. a change stream resumed too late)."""

    code = grpc.StatusCode.OUT_OF_RANGE


class Unavailable(MemsvcError):
    """A dependency (database, embedder) cannot answer right now; safe to retry."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(MemsvcError):
    """The call's deadline ran out before a write could complete; nothing was written."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED
