"""Caller authentication: API key in metadata -> tenant; never from a request field.

Each serving process holds a directory of every active key's digest and tenant, loaded when
its LISTEN connection (storage/notifications.py) connects and kept current by the
``memsvc_keys`` notifications every creation and revocation sends at commit: a revoked key
is refused by every process as soon as the notification arrives (milliseconds), and an
unknown key costs no query. While that connection is down the directory may be stale, so a
key is then looked up again after ``UNSYNCED_CACHE_S`` (a revocation still holds within a
second). A key the directory does not know is looked up (a notification may not have
arrived yet) only at a bounded rate per process, and remembered as unknown in a bounded
cache of its own that never evicts a good key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import asyncpg

from memsvc.errors import ResourceExhausted, Unauthenticated
from memsvc.observability import metrics
from memsvc.observability.auth_log import AuthFailureLog
from memsvc.server.admission import Bucket, take_token
from memsvc.storage import api_keys
from memsvc.storage.api_keys import hash_key
from memsvc.storage.notifications import ChangeListener

log = logging.getLogger(__name__)

# (key, value) pairs as grpc hands them over.
Metadata = Sequence[tuple[str, str | bytes]]

# How long an answer is trusted while the directory is not kept current by notifications:
# the promise that a revocation holds everywhere within a second.
UNSYNCED_CACHE_S = 1.0
# How often the keys used since are stamped last_used_at (one UPDATE per process).
STAMP_INTERVAL_S = 60.0


def key_from_metadata(metadata: Metadata) -> str | None:
    """The API key from `x-api-key`, or from `authorization: Bearer <key>`."""
    for name, value in metadata:
        if isinstance(value, bytes):
            continue
        if name == "x-api-key":
            return value.strip()
        if name == "authorization" and value[:7].lower() == "bearer ":
            return value[7:].strip()
    return None


class UnknownKeys:
    """A bounded LRU of digests found unknown, each for ``ttl_s``: a client repeating a wrong
    key costs no query. Only unknown keys enter, so a flood of them evicts only each other."""

    def __init__(self, size: int, ttl_s: float) -> None:
        self._size = size
        self._ttl_s = ttl_s
        self._until: OrderedDict[bytes, float] = OrderedDict()

    def __contains__(self, digest: bytes) -> bool:
        until = self._until.get(digest)
        if until is None:
            return False
        if until <= time.monotonic():
            del self._until[digest]
            return False
        self._until.move_to_end(digest)
        return True

    def add(self, digest: bytes) -> None:
        if self._size <= 0:
            return
        self._until[digest] = time.monotonic() + self._ttl_s
        self._until.move_to_end(digest)
        while len(self._until) > self._size:
            self._until.popitem(last=False)

    def discard(self, digest: bytes) -> None:
        self._until.pop(digest, None)

    def __len__(self) -> int:
        return len(self._until)


class Authenticator:
    """Resolves keys to tenants from the process's key directory; ``start`` before serving,
    ``stop`` after."""

    def __init__(
        self,
        pool: asyncpg.Pool | None,
        *,
        enabled: bool,
        default_tenant: str,
        listener: ChangeListener | None = None,
        acquire_timeout_s: float = 1.0,
        unknown_lookups_per_s: float = 20.0,
        unknown_cache_size: int = 10_000,
        unknown_cache_s: float = 5.0,
    ) -> None:
        self._pool = pool
        self._enabled = enabled
        self._default_tenant = default_tenant
        self._listener = listener
        self._acquire_timeout_s = acquire_timeout_s
        self._lookup_rate = unknown_lookups_per_s
        self._lookup_bucket = Bucket(max(1.0, unknown_lookups_per_s), time.monotonic())
        self._unknown = UnknownKeys(unknown_cache_size, unknown_cache_s)
        self._failures = AuthFailureLog()
        # digest -> tenant of every active key; complete and current while ``_synced``.
        self._directory: dict[bytes, str] = {}
        self._synced = False
        # Notifications that arrived while the directory was loading, replayed after it.
        self._pending: list[str] | None = None
        # Bumped by every notification: a lookup that raced one does not enter the directory.
        self._generation = 0
        # Answers of single lookups while not synced: digest -> (tenant or None, until).
        self._recent: dict[bytes, tuple[str | None, float]] = {}
        self._used: set[bytes] = set()
        self._load_task: asyncio.Task[None] | None = None
        self._stamp_task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None

    @property
    def enabled(self) -> bool:
        return self._enabled

    @property
    def synced(self) -> bool:
        """The directory is complete and kept current by notifications."""
        return self._synced and self._listening()

    def start(self) -> None:
        """Subscribe to key notifications (the directory loads when the listener connects)
        and start stamping last use. Without a listener every key is looked up each second."""
        if not self._enabled or self._pool is None:
            return
        if self._listener is not None and self._unsubscribe is None:
            self._unsubscribe = self._listener.subscribe_channel(
                api_keys.KEYS_CHANNEL, self._notified, self._reload
            )
            self._listener.start()
            if self._listener.listening.is_set():
                self._reload()
        if self._stamp_task is None:
            self._stamp_task = asyncio.create_task(self._stamp_loop())

    async def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        tasks = [t for t in (self._load_task, self._stamp_task) if t is not None]
        self._load_task = self._stamp_task = None
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await self._stamp()

    async def tenant(self, metadata: Metadata) -> str:
        """The caller's tenant; raises Unauthenticated."""
        if not self._enabled:
            return self._default_tenant
        key = key_from_metadata(metadata)
        if not key:
            self._failures.failed("missing")
            raise Unauthenticated(
                "missing API key: send it in the 'x-api-key' metadata entry "
                "(or 'authorization: Bearer <key>')"
            )
        if not api_keys.well_formed(key):
            self._failures.failed("malformed")
            raise Unauthenticated("invalid API key")
        digest = hash_key(key)
        tenant = await self._resolve(digest)
        if tenant is None:
            self._failures.failed("unknown")
            raise Unauthenticated("invalid API key")
        self._used.add(digest)
        return tenant

    async def _resolve(self, digest: bytes) -> str | None:
        if self.synced:
            tenant = self._directory.get(digest)
            if tenant is not None:
                return tenant
        else:
            cached = self._recent.get(digest)
            if cached is not None and cached[1] > time.monotonic():
                return cached[0]
        if digest in self._unknown:
            return None
        # A key the directory knew (it may be stale while not synced) is looked up freely;
        # one it never knew only within the rate, so made-up keys cannot cost a query each.
        if digest not in self._directory and not self._take_lookup():
            return None
        return await self._lookup(digest)

    def _take_lookup(self) -> bool:
        if self._lookup_rate <= 0:
            return True
        rate = self._lookup_rate
        self._lookup_bucket, wait_s = take_token(
            self._lookup_bucket, time.monotonic(), rate_per_s=rate, burst=max(1.0, rate)
        )
        return wait_s == 0.0

    async def _lookup(self, digest: bytes) -> str | None:
        assert self._pool is not None
        generation = self._generation
        metrics.AUTH_LOOKUPS.inc()
        try:
            conn = await self._pool.acquire(timeout=self._acquire_timeout_s)
        except TimeoutError:
            # The pool is exhausted: say so (retryable), as every other pooled call does.
            # Left to the handler, this TimeoutError would read as the caller's deadline.
            raise ResourceExhausted("every database connection is busy; retry shortly") from None
        try:
            tenant = await api_keys.tenant_for_digest(conn, digest)
        finally:
            await self._pool.release(conn)
        if not self.synced:
            if len(self._recent) > 10_000:
                self._recent.clear()
            self._recent[digest] = (tenant, time.monotonic() + UNSYNCED_CACHE_S)
        if tenant is None:
            self._unknown.add(digest)
        elif generation == self._generation and self.synced:
            # Created a moment ago, its notification not here yet (none came since the
            # lookup began, so it cannot have been revoked in between).
            self._directory[digest] = tenant
        return tenant

    # -- the directory -----------------------------------------------------------------------

    def _listening(self) -> bool:
        return self._listener is not None and self._listener.listening.is_set()

    def _notified(self, payload: str) -> None:
        self._generation += 1
        if self._pending is not None:
            self._pending.append(payload)
        self._apply(payload)

    def _apply(self, payload: str) -> None:
        sign, body = payload[:1], payload[1:]
        hex_digest, _, tenant = body.partition(api_keys.SEPARATOR)
        try:
            digest = bytes.fromhex(hex_digest)
        except ValueError:
            log.warning("ignored a malformed key notification")
            return
        self._recent.pop(digest, None)
        if sign == "+" and tenant:
            self._directory[digest] = tenant
            self._unknown.discard(digest)
        elif sign == "-":
            self._directory.pop(digest, None)

    def _reload(self) -> None:
        """The listener (re)connected: notifications may have been missed, load it all."""
        self._synced = False
        self._generation += 1
        if self._load_task is not None:
            self._load_task.cancel()
        self._pending = []
        self._load_task = asyncio.create_task(self._load())

    async def _load(self) -> None:
        assert self._pool is not None
        while True:
            try:
                async with self._pool.acquire(timeout=self._acquire_timeout_s) as conn:
                    loaded = await api_keys.active_keys(conn)
                break
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
                log.info("key directory not loaded (%s); retrying", type(exc).__name__)
                await asyncio.sleep(1.0)
        pending, self._pending = self._pending or [], None
        self._directory = loaded
        for payload in pending:
            self._apply(payload)
        self._recent.clear()
        self._synced = True
        log.debug("key directory loaded: %d active keys", len(loaded))

    # -- last use ----------------------------------------------------------------------------

    async def _stamp_loop(self) -> None:
        while True:
            await asyncio.sleep(STAMP_INTERVAL_S)
            await self._stamp()

    async def _stamp(self) -> None:
        used, self._used = self._used, set()
        if not used or self._pool is None:
            return
        try:
            async with self._pool.acquire(timeout=self._acquire_timeout_s) as conn:
                await api_keys.stamp_used(conn, used)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
            log.info("last use of keys not recorded (%s)", type(exc).__name__)
