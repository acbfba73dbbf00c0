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
    # Core-block limits in characters (0: no limit; None: the server default).
    human_block_max_chars: int | None = None
    persona_block_max_chars: int | None = None


_RETURNED = "pii_policy::text AS pii, message_ttl_s, human_block_max_chars, persona_block_max_chars"


def _overrides(row: asyncpg.Record) -> TenantOverrides:
    return TenantOverrides(
        dict(orjson.loads(row["pii"])),
        row["message_ttl_s"],
        row["human_block_max_chars"],
        row["persona_block_max_chars"],
    )


async def load(conn: Connection | asyncpg.Pool, tenant_id: str) -> TenantOverrides:
    """The tenant's overrides; a tenant without a row has none."""
    row = await conn.fetchrow(
        f"SELECT {_RETURNED} FROM tenant_settings WHERE tenant_id = $1", tenant_id
    )
    if row is None:
        return TenantOverrides()
    return _overrides(row)


async def save(
    conn: Connection | asyncpg.Pool,
    tenant_id: str,
    *,
    pii_policy: Mapping[str, str] | None = None,
    message_ttl_s: int | None = None,
    clear_message_ttl: bool = False,
    human_block_max_chars: int | None = None,
    persona_block_max_chars: int | None = None,
    clear_block_limits: bool = False,
) -> TenantOverrides:
    """Merge the given overrides into the tenant's row (PII kinds are merged one by one).
    ``clear_block_limits`` returns both core-block limits to the server defaults."""
    row = await conn.fetchrow(
        f"""
        INSERT INTO tenant_settings AS t
            (tenant_id, pii_policy, message_ttl_s, human_block_max_chars, persona_block_max_chars)
        VALUES ($1, $2::jsonb, $3, $5, $6)
        ON CONFLICT (tenant_id) DO UPDATE SET
            pii_policy = t.pii_policy || EXCLUDED.pii_policy,
            message_ttl_s = CASE WHEN $4 THEN NULL
                                 ELSE coalesce(EXCLUDED.message_ttl_s, t.message_ttl_s) END,
            human_block_max_chars = CASE WHEN $7 THEN NULL
                ELSE coalesce(EXCLUDED.human_block_max_chars, t.human_block_max_chars) END,
            persona_block_max_chars = CASE WHEN $7 THEN NULL
                ELSE coalesce(EXCLUDED.persona_block_max_chars, t.persona_block_max_chars) END,
            -- The column default (now()), not now() itself: Citus accepts only immutable
            -- functions in DO UPDATE.
            updated_at = EXCLUDED.updated_at
        RETURNING {_RETURNED}
        """,
        tenant_id,
        orjson.dumps(dict(pii_policy or {})).decode(),
        message_ttl_s,
        clear_message_ttl,
        human_block_max_chars,
        persona_block_max_chars,
        clear_block_limits,
    )
    assert row is not None
    return _overrides(row)
