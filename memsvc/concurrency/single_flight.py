"""Single flight: concurrent requests for one key share one build (in this process)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    """The first caller for a key starts the build as a task; later callers join it.

    The build is a task of its own, not part of the first caller: if that caller is
    cancelled (its client went away), the others still get the result. The build must bound
    itself (it runs under the budget its starter gave it); a joiner waits at most its own
    budget and gets TimeoutError after, while the build carries on for the rest.
    """

    def __init__(self) -> None:
        self._flights: dict[K, asyncio.Task[V]] = {}

    def __len__(self) -> int:
        return len(self._flights)

    async def do(
        self, key: K, build: Callable[[], Awaitable[V]], *, join_timeout_s: float
    ) -> tuple[V, bool]:
        """The build's value, and whether this caller joined another's build.

        The caller that starts the build waits for it to finish (the build bounds itself by
        that caller's budget: a timeout here would race the build's own and throw away a
        result that was ready). A joiner waits at most ``join_timeout_s``.
        """
        task = self._flights.get(key)
        if task is None:
            task = asyncio.ensure_future(build())
            self._flights[key] = task
            task.add_done_callback(functools.partial(self._forget, key))
            return await asyncio.shield(task), False
        # shield: a joiner giving up (timeout, cancellation) must not cancel the shared build.
        value = await asyncio.wait_for(asyncio.shield(task), timeout=max(join_timeout_s, 0.0))
        return value, True

    def _forget(self, key: K, task: asyncio.Task[V]) -> None:
        if self._flights.get(key) is task:
            del self._flights[key]
        if not task.cancelled():
            # Retrieve the error so a build nobody waited for is not reported as unhandled;
            # the callers that awaited it got it already.
            task.exception()
