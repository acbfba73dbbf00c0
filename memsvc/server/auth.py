"""Caller authentication: API key in metadata -> tenant; never from a request field."""

from __future__ import annotations

import time
from collections.abc import Sequence

import asyncpg

from memsvc.errors import ResourceExhausted, Unauthenticated
from memsvc.storage.api_keys import hash_key, tenant_for_key

# (key, value) pairs as grpc hands them over.
Metadata = Sequence[tuple[str, str | bytes]]


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


class Authenticator:
    """Resolves keys to tenants, caching answers briefly so auth costs no query per call."""

    def __init__(
        self,
        pool: asyncpg.Pool | None,
        *,
        enabled: bool,
        default_tenant: str,
        cache_ttl_s: float = 30.0,
        acquire_timeout_s: float = 1.0,
    ) -> None:
        self._pool = pool
        self._enabled = enabled
        self._default_tenant = default_tenant
        self._ttl_s = cache_ttl_s
        self._acquire_timeout_s = acquire_timeout_s
        # Keyed by the digest, never by the clear key.
        self._cache: dict[bytes, tuple[str | None, float]] = {}

    @property
    def enabled(self) -> bool:
        return self._enabled

    async def tenant(self, metadata: Metadata) -> str:
        """The caller's tenant; raises Unauthenticated."""
        if not self._enabled:
            return self._default_tenant
        key = key_from_metadata(metadata)
        if not key:
            raise Unauthenticated(
                "missing API key: send it in the 'x-api-key' metadata entry "
                "(or 'authorization: Bearer <key>')"
            )
        digest = hash_key(key)
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and cached[1] > now:
            tenant = cached[0]
        else:
            assert self._pool is not None
            try:
                conn = await self._pool.acquire(timeout=self._acquire_timeout_s)
            except TimeoutError:
                # The pool is exhausted: say so (retryable), as every other pooled call does.
                # Left to the handler, this TimeoutError would read as the caller's deadline.
                raise ResourceExhausted(
                    "every database connection is busy; retry shortly"
                ) from None
            try:
                tenant = await tenant_for_key(conn, key)
            finally:
                await self._pool.release(conn)
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[digest] = (tenant, now + self._ttl_s)
        if tenant is None:
            raise Unauthenticated("invalid API key")
        return tenant
