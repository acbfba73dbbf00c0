"""The tenant_settings table: per-tenant overrides of the governance defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import asyncpg
import orjson

from memsvc.storage.connection import Connection


@dataclass(frozen=True)
class TenantOverrides:
    """What one tenant set; empty or None means "the server default"."""

    pii_policy: Mapping[str, str] = field(default_factory=dict)
    message_ttl_s: int | None = None


async def load(conn: Connection | asyncpg.Pool, tenant_id: str) -> TenantOverrides:
    """The tenant's overrides; a tenant without a row has none."""
    row = await conn.fetchrow(
        "SELECT pii_policy::text AS pii, message_ttl_s FROM tenant_settings WHERE tenant_id = $1",
        tenant_id,
    )
    if row is None:
        return TenantOverrides()
    return TenantOverrides(dict(orjson.loads(row["pii"])), row["message_ttl_s"])


async def save(
    conn: Connection | asyncpg.Pool,
    tenant_id: str,
    *,
    pii_policy: Mapping[str, str] | None = None,
    message_ttl_s: int | None = None,
    clear_message_ttl: bool = False,
) -> TenantOverrides:
    """Merge the given overrides into the tenant's row (PII kinds are merged one by one)."""
    row = await conn.fetchrow(
        """
        INSERT INTO tenant_settings AS t (tenant_id, pii_policy, message_ttl_s)
        VALUES ($1, $2::jsonb, $3)
        ON CONFLICT (tenant_id) DO UPDATE SET
            pii_policy = t.pii_policy || EXCLUDED.pii_policy,
            message_ttl_s = CASE WHEN $4 THEN NULL
                                 ELSE coalesce(EXCLUDED.message_ttl_s, t.message_ttl_s) END,
            updated_at = now()
        RETURNING pii_policy::text AS pii, message_ttl_s
        """,
        tenant_id,
        orjson.dumps(dict(pii_policy or {})).decode(),
        message_ttl_s,
        clear_message_ttl,
    )
    assert row is not None
    return TenantOverrides(dict(orjson.loads(row["pii"])), row["message_ttl_s"])
