"""A bounded background queue for Ingest: a turn hands its messages over and never waits.

Nothing here raises into the caller. A full queue, a failed send, or work still queued when
the queue is closed is reported to the ``on_failure`` callback and counted in ``stats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from memsvc.client.errors import MemsvcCallError
from memsvc.v1 import memory_pb2 as pb

log = logging.getLogger(__name__)

FailureReason = Literal["overflow", "failed", "abandoned"]


@dataclass(frozen=True)
class IngestFailure:
    """One Ingest that did not reach memsvc.

    ``overflow``: the queue was full, the request was never queued. ``failed``: every attempt
    failed (``error`` says how). ``abandoned``: still queued or in flight when ``aclose``'s
    flush timeout ran out, or submitted after close.
    """

    reason: FailureReason
    request: pb.IngestRequest
    error: MemsvcCallError | None = None


@dataclass
class IngestQueueStats:
    """Counters since the queue was created (read them for metrics or a health page)."""

    submitted: int = 0
    sent: int = 0
    failed: int = 0
    overflowed: int = 0
    abandoned: int = 0


class IngestQueue:
    """``asyncio.Queue(maxsize)`` drained by ``senders`` tasks, each sending one Ingest at once."""

    def __init__(
        self,
        send: Callable[[pb.IngestRequest], Awaitable[object]],
        *,
        maxsize: int,
        senders: int,
        on_failure: Callable[[IngestFailure], None] | None = None,
    ) -> None:
        if maxsize < 1 or senders < 1:
            raise ValueError("maxsize and senders must be at least 1")
        self._send = send
        self._queue: asyncio.Queue[pb.IngestRequest] = asyncio.Queue(maxsize=maxsize)
        self._senders = senders
        self._tasks: set[asyncio.Task[None]] = set()
        self._on_failure = on_failure
        self._closed = False
        self.stats = IngestQueueStats()

    @property
    def depth(self) -> int:
        """Requests waiting to be sent (not counting those in flight)."""
        return self._queue.qsize()

    def submit(self, request: pb.IngestRequest) -> bool:
        """Queue ``request`` without waiting; False (and a report) when it was not queued.

        Must be called from the event loop's thread (the senders start on first use).
        """
        self.stats.submitted += 1
        if self._closed:
            self._report(IngestFailure("abandoned", request))
            return False
        self._start_senders()
        try:
            self._queue.put_nowait(request)
        except asyncio.QueueFull:
            self._report(IngestFailure("overflow", request))
            return False
        return True

    async def aclose(self, timeout_s: float) -> None:
        """Send what is queued for up to ``timeout_s``, then stop; the rest is reported."""
        self._closed = True
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._queue.join()
        for task in self._tasks:
            task.cancel()
        # Senders report their own in-flight request when cancelled, then end.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        while not self._queue.empty():
            self._report(IngestFailure("abandoned", self._queue.get_nowait()))
            self._queue.task_done()

    def _start_senders(self) -> None:
        if self._tasks:
            return
        for i in range(self._senders):
            task = asyncio.get_running_loop().create_task(
                self._run_sender(), name=f"memsvc-ingest-sender-{i}"
            )
            self._tasks.add(task)

    async def _run_sender(self) -> None:
        while True:
            request = await self._queue.get()
            try:
                await self._send(request)
                self.stats.sent += 1
            except asyncio.CancelledError:
                self._report(IngestFailure("abandoned", request))
                raise
            except MemsvcCallError as exc:
                self._report(IngestFailure("failed", request, exc))
            except Exception:
                # A bug, not an outage: log it, keep the sender alive for the next turn.
                log.exception("background Ingest failed unexpectedly")
                self._report(IngestFailure("failed", request))
            finally:
                self._queue.task_done()

    def _report(self, failure: IngestFailure) -> None:
        if failure.reason == "overflow":
            self.stats.overflowed += 1
        elif failure.reason == "failed":
            self.stats.failed += 1
        else:
            self.stats.abandoned += 1
        if self._on_failure is None:
            return
        try:
            self._on_failure(failure)
        except Exception:
            # The callback belongs to the gateway: its bug must not stop the senders.
            log.exception("the on_ingest_failure callback raised")
