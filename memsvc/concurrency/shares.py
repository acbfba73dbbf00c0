"""Per-tenant shares of a shared pool: no tenant holds more than its share of the slots.

Two kinds. ``TenantSlots`` refuses at once (export and import streams, read slots, which a
caller retries), naming the limit it hit; ``TenantWaits`` lets a tenant wait, within a
timeout, for one of its own slots (database connections: a tenant's calls queue behind
that tenant's other calls, never behind another tenant's).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

from memsvc.errors import ResourceExhausted


class TenantSlots:
    """At most ``total`` slots held at once, at most ``per_tenant`` (0: no own cap) by one
    tenant. ``what`` names the slots in refusals ("ExportMemories streams"). ``share_now``:
    a tenant's share at this moment when the pool itself shrinks under load (the read gate's
    cap), never more than ``per_tenant``; it applies while other tenants hold slots."""

    def __init__(
        self,
        what: str,
        *,
        total: int,
        per_tenant: int,
        retry_after_s: float,
        share_now: Callable[[], int] | None = None,
    ) -> None:
        if total < 1 or per_tenant < 0:
            raise ValueError(f"{what}: total must be >= 1 and per_tenant >= 0")
        self._what = what
        self._total = total
        self._per_tenant = per_tenant
        self._share_now = share_now
        self._retry_after_s = retry_after_s
        self._held: dict[str, int] = {}
        self._in_use = 0

    @property
    def in_use(self) -> int:
        return self._in_use

    def held(self, tenant: str) -> int:
        return self._held.get(tenant, 0)

    def take(self, tenant: str) -> None:
        """Take a slot (give it back with :meth:`give_back`); ResourceExhausted when none is
        free for this tenant."""
        held = self._held.get(tenant, 0)
        share = self._per_tenant
        if share and self._share_now is not None and self._in_use > held:
            # The shrunk share protects the other tenants holding slots now; a tenant alone
            # is held by the pool's own cap (the read gate's, which says why it refuses).
            share = max(1, min(share, self._share_now()))
        if share and held >= share:
            raise ResourceExhausted(
                f"this tenant already holds {share} {self._what} on this server, "
                "its share; let one finish or retry shortly",
                retry_after_s=self._retry_after_s,
            )
        if self._in_use >= self._total:
            raise ResourceExhausted(
                f"{self._total} {self._what} are already running on this server; retry shortly",
                retry_after_s=self._retry_after_s,
            )
        self._held[tenant] = held + 1
        self._in_use += 1

    def give_back(self, tenant: str) -> None:
        self._in_use -= 1
        left = self._held[tenant] - 1
        if left:
            self._held[tenant] = left
        else:
            del self._held[tenant]

    @contextmanager
    def hold(self, tenant: str) -> Iterator[None]:
        """Hold a slot for the block."""
        self.take(tenant)
        try:
            yield
        finally:
            self.give_back(tenant)


class TenantWaits:
    """At most ``per_tenant`` held by one tenant; a tenant at its share waits for one of its
    own to free, up to a timeout (TimeoutError). Idle tenants cost nothing."""

    def __init__(self, per_tenant: int) -> None:
        if per_tenant < 1:
            raise ValueError("per_tenant must be >= 1")
        self.per_tenant = per_tenant
        self._semaphores: dict[str, asyncio.Semaphore] = {}
        # Holding or waiting, per tenant: the semaphore goes when this drops to 0.
        self._users: dict[str, int] = {}
        self._held: dict[str, int] = {}

    def held(self, tenant: str) -> int:
        return self._held.get(tenant, 0)

    @asynccontextmanager
    async def hold(self, tenant: str, timeout_s: float) -> AsyncIterator[None]:
        semaphore = self._semaphores.get(tenant)
        if semaphore is None:
            semaphore = self._semaphores[tenant] = asyncio.Semaphore(self.per_tenant)
        self._users[tenant] = self._users.get(tenant, 0) + 1
        try:
            async with asyncio.timeout(timeout_s):
                await semaphore.acquire()
            self._held[tenant] = self._held.get(tenant, 0) + 1
            try:
                yield
            finally:
                semaphore.release()
                left = self._held[tenant] - 1
                if left:
                    self._held[tenant] = left
                else:
                    del self._held[tenant]
        finally:
            users = self._users[tenant] - 1
            if users:
                self._users[tenant] = users
            else:
                # Nobody holds or waits: a fresh semaphore next time is the same.
                del self._users[tenant]
                del self._semaphores[tenant]
