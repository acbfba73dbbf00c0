"""Per-tenant governance policy: the server defaults merged with the tenant's own row.

A tenant's settings are read from PostgreSQL at most once per ``cache_s`` per process, so a
change made with ``memsvc tenants set`` takes effect everywhere within that time without a
restart, and the hot path costs a dictionary lookup.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import asyncpg

from memsvc.storage import tenant_settings
from memsvc.storage.connection import Connection

# Kinds of personal data the screen detects (memsvc.governance.pii).
PII_KINDS = (
    "card_number",
    "government_id",
    "bank_account",
    "password",
    "secret",
    "one_time_code",
    "email",
    "phone",
)
STORE = "store"
REDACT = "redact"
REJECT = "reject"
PII_ACTIONS = (STORE, REDACT, REJECT)


class PolicyError(ValueError):
    """A PII policy specification memsvc cannot use."""


def parse_pii_policy(spec: str) -> dict[str, str]:
    """``"redact"`` or ``"redact,email=store,card_number=reject"``: a default action for every
    kind (optional, first) then per-kind actions. Returns an action for every kind."""
    policy = dict.fromkeys(PII_KINDS, REDACT)
    for position, part in enumerate(p.strip().lower() for p in spec.split(",")):
        if not part:
            continue
        kind, sep, action = part.partition("=")
        if not sep:
            if position != 0:
                raise PolicyError(f"a bare action must come first, got {part!r}")
            kind, action = "", kind
        if action not in PII_ACTIONS:
            expected = ", ".join(PII_ACTIONS)
            raise PolicyError(f"unknown action {action!r}: expected one of {expected}")
        if not kind:
            policy = dict.fromkeys(PII_KINDS, action)
        elif kind in PII_KINDS:
            policy[kind] = action
        else:
            raise PolicyError(f"unknown kind {kind!r}: expected one of {', '.join(PII_KINDS)}")
    return policy


def parse_pii_overrides(spec: str) -> dict[str, str]:
    """Only the kinds a spec names (``"email=store"``); a bare action names every kind."""
    named: dict[str, str] = {}
    full = parse_pii_policy(spec)
    for part in (p.strip().lower() for p in spec.split(",")):
        kind, sep, _ = part.partition("=")
        if not part:
            continue
        if not sep:
            return full
        named[kind] = full[kind]
    return named


@dataclass(frozen=True)
class TenantPolicy:
    """What applies to one tenant now."""

    # An action for every PII kind.
    pii: Mapping[str, str]
    # Seconds a stored message is kept; 0: never expires.
    message_ttl_s: int

    def action(self, kind: str) -> str:
        return self.pii.get(kind, REDACT)


class TenantPolicies:
    """Resolves and caches each tenant's policy (one PostgreSQL read per tenant per cache_s)."""

    def __init__(
        self,
        pool: asyncpg.Pool | None,
        *,
        default_pii: Mapping[str, str],
        default_message_ttl_s: int,
        cache_s: float = 5.0,
    ) -> None:
        self._pool = pool
        self._default_pii = dict(default_pii)
        self._default_ttl = default_message_ttl_s
        self._cache_s = cache_s
        self._cache: dict[str, tuple[float, TenantPolicy]] = {}

    @property
    def default(self) -> TenantPolicy:
        return self.resolve(tenant_settings.TenantOverrides())

    def resolve(self, overrides: tenant_settings.TenantOverrides) -> TenantPolicy:
        pii = dict(self._default_pii)
        pii.update({k: v for k, v in overrides.pii_policy.items() if k in PII_KINDS})
        ttl = self._default_ttl if overrides.message_ttl_s is None else overrides.message_ttl_s
        return TenantPolicy(MappingProxyType(pii), ttl)

    def forget(self, tenant_id: str | None = None) -> None:
        """Drop the cached policy of one tenant (or all): the next call reads it again."""
        if tenant_id is None:
            self._cache.clear()
        else:
            self._cache.pop(tenant_id, None)

    def peek(self, tenant_id: str) -> TenantPolicy | None:
        """The tenant's policy when cached and fresh (no I/O); None: ``get`` must read it."""
        cached = self._cache.get(tenant_id)
        if cached is not None and time.monotonic() - cached[0] < self._cache_s:
            return cached[1]
        return None

    async def get(self, tenant_id: str, conn: Connection | None = None) -> TenantPolicy:
        """The tenant's policy; read through ``conn`` (or the pool) when not cached."""
        cached = self._cache.get(tenant_id)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self._cache_s:
            return cached[1]
        source = conn if conn is not None else self._pool
        if source is None:
            return self.default
        policy = self.resolve(await tenant_settings.load(source, tenant_id))
        self._cache[tenant_id] = (now, policy)
        return policy
