"""The current call's request id, RPC name and tenant, carried by contextvars for the logs.

The server interceptor sets the request id and RPC when a handler starts, the servicer adds
the tenant once the caller is authenticated. Tasks started by the handler (retrieval legs)
copy the context, so their log lines carry the same ids.
"""

from __future__ import annotations

import contextvars
import uuid

REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID_CHARS = 128

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "memsvc_request_id", default=None
)
rpc: contextvars.ContextVar[str | None] = contextvars.ContextVar("memsvc_rpc", default=None)
tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("memsvc_tenant", default=None)


def new_request_id() -> str:
    return uuid.uuid4().hex


def accept_request_id(value: str | bytes | None) -> str:
    """The caller's id when it is 1..128 visible ASCII characters, else a fresh one.

    Anything else (spaces, control or non-ASCII characters, too long, binary) is replaced,
    not trimmed: the id is copied into every log line, so it must never smuggle in text that
    could forge a line or carry content.
    """
    if (
        isinstance(value, str)
        and 0 < len(value) <= MAX_REQUEST_ID_CHARS
        and all("!" <= ch <= "~" for ch in value)
    ):
        return value
    return new_request_id()
