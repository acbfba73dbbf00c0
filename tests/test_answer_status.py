"""server/status.py: when an answer still has somebody to reach.

A handler that reaches its answer after the caller's deadline (a saturated loop) must not
send it: grpc's core has ended the call, the send fails there, and grpc logs an ERROR with a
traceback (ExecuteBatchError; 18 of them in a day of overload runs before this check). The
race needs a loop stalled at the right microsecond, so the rule is tested on a scripted
context; the overload benchmark's server logs show the effect (bench/overload.py).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from memsvc.errors import ResourceExhausted
from memsvc.server import status


class ScriptedContext:
    """The three things status.abort reads of a servicer context, and what it sent."""

    def __init__(self, *, done: bool = False, remaining: float | None = 1.0) -> None:
        self._done = done
        self._remaining = remaining
        self.sent: list[tuple[grpc.StatusCode, str]] = []

    def done(self) -> bool:
        return self._done

    def time_remaining(self) -> float | None:
        return self._remaining

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    async def abort(self, code: grpc.StatusCode, details: str, **_: object) -> None:
        self.sent.append((code, details))
        raise grpc.aio.AbortError


@pytest.mark.parametrize(
    ("done", "remaining", "gone"),
    [
        (False, 0.05, False),  # time left
        (False, None, False),  # no deadline
        (False, 0.0, True),  # the deadline has passed (grpc reports 0, never less)
        (True, 0.05, True),  # already answered or cancelled
    ],
)
def test_caller_gone(done: bool, remaining: float | None, gone: bool) -> None:
    context = ScriptedContext(done=done, remaining=remaining)
    assert status.caller_gone(context) is gone  # type: ignore[arg-type]


async def test_a_refusal_after_the_deadline_is_not_sent() -> None:
    late = ScriptedContext(remaining=0.0)
    with pytest.raises(asyncio.CancelledError):
        await status.abort(late, ResourceExhausted("busy", retry_after_s=0.1))  # type: ignore[arg-type]
    assert late.sent == []
    in_time = ScriptedContext(remaining=0.05)
    with pytest.raises(grpc.aio.AbortError):
        await status.abort(in_time, ResourceExhausted("busy", retry_after_s=0.1))  # type: ignore[arg-type]
    assert in_time.sent == [(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy")]
