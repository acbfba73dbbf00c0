"""The request id a call is logged under: the caller's x-request-id when safe, else a fresh one."""

from __future__ import annotations

import uuid

REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID_CHARS = 128


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
