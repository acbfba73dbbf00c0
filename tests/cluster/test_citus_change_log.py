"""The change log on Citus: its row triggers run on the workers, number each user's changes
in commit order without the coordinator's sequence, see the delete kind the coordinator set,
and let a transaction over two workers commit (no NOTIFY on a shard to block its 2PC)."""

from __future__ import annotations

import hashlib
import uuid

import asyncpg

from memsvc.storage import changes, memories
from memsvc.storage.model import NewMemory, Scope


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


async def _remember(conn: asyncpg.Connection, scope: Scope, text: str) -> uuid.UUID:
    record, _ = await memories.insert_or_reinforce(
        conn,
        scope,
        NewMemory(content=text, category="preference", role="fact", confidence=0.9),
        content_hash=hashlib.sha256(text.encode()).digest(),
        embedding=None,
        embedding_model="",
    )
    return record.memory_id


async def _log(conn: asyncpg.Connection, scope: Scope) -> list[changes.Change]:
    return (await changes.after(conn, scope.tenant_id, scope.user_id, 0, 100)).changes


async def test_a_users_changes_are_numbered_in_commit_order(pool: asyncpg.Pool) -> None:
    scope = Scope(_tenant(), "alice")
    async with pool.acquire() as conn:
        ids = [await _remember(conn, scope, f"Fact number {i}") for i in range(3)]
        log = await _log(conn, scope)
    assert [(c.kind, c.memory_id) for c in log] == [("created", i) for i in ids]
    positions = [c.position for c in log]
    assert positions == sorted(positions) and len(set(positions)) == 3


async def test_the_delete_kind_reaches_the_workers(pool: asyncpg.Pool) -> None:
    scope = Scope(_tenant(), "alice")
    async with pool.acquire() as conn:
        memory_id = await _remember(conn, scope, "Parked on level three")
        async with conn.transaction(), changes.deletes_recorded_as(conn, "expired"):
            await conn.execute(
                "DELETE FROM memories WHERE tenant_id = $1 AND user_id = $2 AND memory_id = $3",
                scope.tenant_id,
                scope.user_id,
                memory_id,
            )
        log = await _log(conn, scope)
    assert [c.kind for c in log] == ["created", "expired"]


async def _users_on_two_workers(conn: asyncpg.Connection) -> tuple[str, str]:
    """Two user ids whose shards are on different workers."""
    rows = await conn.fetch(
        "SELECT u, (SELECT nodeport FROM citus_shards WHERE table_name = 'memories'::regclass"
        "   AND shardid = get_shard_id_for_distribution_column('memories', u)) AS port"
        " FROM unnest($1::text[]) AS u",
        [f"user-{i}" for i in range(16)],
    )
    by_port = {r["port"]: r["u"] for r in rows}
    assert len(by_port) >= 2, rows
    first, second = list(by_port.values())[:2]
    return first, second


async def test_one_transaction_over_two_workers_commits(pool: asyncpg.Pool) -> None:
    """A meeting's job writes each speaker's shard in one transaction: Citus commits it with
    two-phase commit, which a shard that had sent a NOTIFY would refuse to prepare."""
    tenant = _tenant()
    async with pool.acquire() as conn:
        a, b = await _users_on_two_workers(conn)
        async with conn.transaction():
            await _remember(conn, Scope(tenant, a), "Met at the harbour")
            await _remember(conn, Scope(tenant, b), "Met at the harbour")
        logs = [await _log(conn, Scope(tenant, u)) for u in (a, b)]
    assert [[c.kind for c in log] for log in logs] == [["created"], ["created"]]
    assert all(log[0].position > 0 for log in logs)
