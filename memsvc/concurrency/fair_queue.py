"""Queues served fairly across tenants, then across one tenant's users.

The next item goes to the tenant with the fewest items in hand (taken and not yet done),
ties to the tenant served longest ago, then to the one waiting longest; within it, to the
user chosen by the same rule; within the user, the oldest item. So a tenant with a thousand
items queued gets one turn in a row like a tenant with one, and one user of a tenant cannot
hold back the tenant's other users. FairQueue is the order alone (pure, not thread-safe: its
owner locks); FairTurns lets asyncio tasks in by it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

_T = TypeVar("_T")
_NEVER = -1


@dataclass
class _Turns:
    """One party's place in the order: in hand, last served, first queued (stamps)."""

    since: int
    in_hand: int = 0
    served: int = _NEVER

    def rank(self) -> tuple[int, int, int]:
        return (self.in_hand, self.served, self.since)


@dataclass
class _User(Generic[_T]):
    turns: _Turns
    items: deque[_T] = field(default_factory=deque)


@dataclass
class _Tenant(Generic[_T]):
    turns: _Turns
    users: dict[str, _User[_T]] = field(default_factory=dict)

    def waiting(self) -> bool:
        return any(u.items for u in self.users.values())


class FairQueue(Generic[_T]):
    """Items keyed by (tenant, user); ``pop`` takes the next in the fair order above and
    counts it in hand until ``done`` is called with the same keys. A party with nothing
    queued or in hand is forgotten: the queue's size follows what is live."""

    def __init__(self) -> None:
        self._tenants: dict[str, _Tenant[_T]] = {}
        self._stamp = 0  # a clock of events: smaller is earlier

    def __len__(self) -> int:
        return sum(len(u.items) for t in self._tenants.values() for u in t.users.values())

    def _tick(self) -> int:
        self._stamp += 1
        return self._stamp

    def push(self, item: _T, tenant: str, user: str) -> None:
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = _Tenant(_Turns(self._tick()))
        u = t.users.get(user)
        if u is None:
            u = t.users[user] = _User(_Turns(self._tick()))
        u.items.append(item)

    def pop(self, skip: Callable[[_T], bool] = lambda _: False) -> tuple[_T, str, str] | None:
        """The next item with its tenant and user, now in hand; None when nothing is queued.
        Items ``skip`` says are void (a cancelled request) are dropped on the way."""
        while True:
            waiting = [name for name, t in self._tenants.items() if t.waiting()]
            if not waiting:
                return None
            tenant = min(waiting, key=lambda name: self._tenants[name].turns.rank())
            t = self._tenants[tenant]
            user = min(
                (name for name, u in t.users.items() if u.items),
                key=lambda name: t.users[name].turns.rank(),
            )
            u = t.users[user]
            item = u.items.popleft()
            if skip(item):
                self._forget_idle(tenant, user)
                continue
            stamp = self._tick()
            for turns in (t.turns, u.turns):
                turns.in_hand += 1
                turns.served = stamp
            return item, tenant, user

    def done(self, tenant: str, user: str) -> None:
        """An item popped for (tenant, user) is finished: it no longer counts in hand."""
        t = self._tenants.get(tenant)
        u = None if t is None else t.users.get(user)
        if t is None or u is None or u.turns.in_hand <= 0:
            raise ValueError("done() without a matching pop()")
        t.turns.in_hand -= 1
        u.turns.in_hand -= 1
        self._forget_idle(tenant, user)

    def in_hand(self, tenant: str) -> int:
        t = self._tenants.get(tenant)
        return 0 if t is None else t.turns.in_hand

    def _forget_idle(self, tenant: str, user: str) -> None:
        t = self._tenants[tenant]
        u = t.users[user]
        if not u.items and not u.turns.in_hand:
            del t.users[user]
        if not t.users:
            del self._tenants[tenant]


class FairTurns:
    """At most ``slots`` holders at once, the waiting ones let in by the FairQueue's order
    (asyncio; one event loop). ``async with turns.turn(tenant, user):``."""

    def __init__(self, slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self._free = slots
        self._queue: FairQueue[asyncio.Future[None]] = FairQueue()

    @contextlib.asynccontextmanager
    async def turn(self, tenant: str, user: str) -> AsyncIterator[None]:
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.push(granted, tenant, user)
        self._grant()
        try:
            await granted
        except asyncio.CancelledError:
            if not granted.cancelled():  # let in, then cancelled before it could go
                self._release(tenant, user)
            raise  # (cancelled while waiting: its place is dropped at its turn)
        try:
            yield
        finally:
            self._release(tenant, user)

    def _grant(self) -> None:
        while self._free > 0:
            taken = self._queue.pop(skip=lambda waiter: waiter.done())
            if taken is None:
                return
            self._free -= 1
            taken[0].set_result(None)

    def _release(self, tenant: str, user: str) -> None:
        self._queue.done(tenant, user)
        self._free += 1
        self._grant()
