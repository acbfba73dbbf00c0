"""The per-user transaction lock: every write that must see a user's other writes (extraction's
dedup, Remember, import, erasure, retention, sessions, core compaction) takes it first."""

from __future__ import annotations

from memsvc.storage.connection import Connection


async def lock_user(conn: Connection, tenant_id: str, user_id: str) -> None:
    """Serialise one user's extraction transactions (dedup must see the other's facts)."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 7))", f"{tenant_id}\x1f{user_id}"
    )
