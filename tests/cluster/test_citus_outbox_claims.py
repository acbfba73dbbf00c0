"""The outbox on Citus: claims go one user at a time (outbox.claim_by_user), and keep the
guarantees of the single-server claim: each job claimed once, oldest first per user, held
under a lease, taken over when the lease runs out."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from memsvc.config import Settings
from memsvc.storage import outbox
from memsvc.storage.model import Scope
from memsvc.storage.outbox import Job
from tests.cluster.plans import Recorder, distributed_plans
from tests.conftest import Caller
from tests.ingest_helpers import ingest, msg


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


async def _enqueue(pool: asyncpg.Pool, scope: Scope, n: int) -> list[uuid.UUID]:
    """n jobs for the scope, one transaction each (so each is created after the previous)."""
    ids = []
    for _ in range(n):
        ingest_id = uuid.uuid4()
        async with pool.acquire() as conn:
            assert await outbox.enqueue(
                conn,
                scope,
                ingest_id=ingest_id,
                idempotency_key=f"k-{ingest_id}",
                session_id="s",
                payload={},
                request_digest=f"d-{ingest_id}",
            )
        ids.append(ingest_id)
    return ids


async def _claim(pool: asyncpg.Pool, worker: str, *, lease_s: float = 60.0) -> list[Job]:
    async with pool.acquire() as conn:
        return await outbox.claim_by_user(conn, worker_id=worker, lease_s=lease_s, limit=20)


def _mine(jobs: list[Job], tenant: str) -> list[Job]:
    return [j for j in jobs if j.scope.tenant_id == tenant]


async def _finish(pool: asyncpg.Pool, jobs: list[Job]) -> None:
    async with pool.acquire() as conn:
        for job in jobs:
            assert await outbox.complete(conn, job, {})


async def test_each_users_oldest_job_is_claimed_once(pool: asyncpg.Pool) -> None:
    tenant = _tenant()
    users = [Scope(tenant, f"u{i}") for i in range(4)]
    queued = {s.user_id: await _enqueue(pool, s, 2) for s in users}
    first, second = await asyncio.gather(_claim(pool, "w1"), _claim(pool, "w2"))
    claimed = _mine(first, tenant) + _mine(second, tenant)
    # Two workers at once: every user's oldest job, each exactly once, never a second one
    # of a user while the first runs.
    assert sorted(j.ingest_id for j in claimed) == sorted(ids[0] for ids in queued.values())
    assert _mine(await _claim(pool, "w3"), tenant) == []
    done = next(j for j in claimed if j.scope.user_id == "u0")
    await _finish(pool, [done])
    again = _mine(await _claim(pool, "w3"), tenant)
    assert [(j.scope.user_id, j.ingest_id) for j in again] == [("u0", queued["u0"][1])]
    await _finish(pool, [j for j in claimed if j is not done] + again)


async def test_an_expired_lease_is_taken_over(pool: asyncpg.Pool) -> None:
    tenant = _tenant()
    (ingest_id,) = await _enqueue(pool, Scope(tenant, "u"), 1)
    (held,) = _mine(await _claim(pool, "crashed", lease_s=0.3), tenant)
    assert held.ingest_id == ingest_id and held.attempts == 1
    assert _mine(await _claim(pool, "w2"), tenant) == []  # the lease still holds
    await asyncio.sleep(0.5)
    (taken,) = _mine(await _claim(pool, "w2"), tenant)
    assert (taken.ingest_id, taken.attempts, taken.leased_by) == (ingest_id, 2, "w2")
    async with pool.acquire() as conn:
        assert not await outbox.complete(conn, held, {})  # the crashed holder lost it
    await _finish(pool, [taken])


async def test_a_users_claim_is_single_shard_and_a_global_one_is_refused(
    pool: asyncpg.Pool,
) -> None:
    """Why claim_by_user exists: Citus refuses FOR UPDATE SKIP LOCKED over many shards,
    and runs the per-user claim on the user's shard alone."""
    scope = Scope(_tenant(), "u")
    async with pool.acquire() as conn:
        with pytest.raises(asyncpg.FeatureNotSupportedError, match="FOR UPDATE"):
            await outbox.claim(conn, worker_id="w", lease_s=60.0, limit=1)
        async with conn.transaction():
            recorder = Recorder(conn)
            await outbox.claim(
                recorder,  # type: ignore[arg-type]
                worker_id="w",
                lease_s=60.0,
                limit=1,
                tenant_id=scope.tenant_id,
                user_id=scope.user_id,
            )
            plans = await distributed_plans(conn, recorder)
    assert len(plans) == 1 and plans[0].single_shard, [p.describe() for p in plans]


async def test_an_ingest_wakes_the_workers_listening_on_the_coordinator(
    settings: Settings, caller: Caller
) -> None:
    """The outbox row's NOTIFY trigger cannot run on a shard: Ingest notifies from the
    coordinator in its own transaction, where the workers listen."""
    woken: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(settings.pg_dsn)
    try:
        await listener.add_listener("memsvc_outbox", lambda *args: woken.put_nowait(args[3]))
        await ingest(caller, [msg("alice", "I moved to Oslo.")], user="alice")
        payload = await asyncio.wait_for(woken.get(), 5.0)
    finally:
        await listener.close()
    assert payload == f"{caller.tenant_id}:alice"
