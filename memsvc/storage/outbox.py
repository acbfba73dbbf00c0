"""The ingest outbox: enqueue with an idempotency key, claim with SKIP LOCKED and a lease.

The worker's calls take ``timeout_s`` for their statement (None: the connection's
command_timeout); a job's end is one of complete, retry_later or mark_dead.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import orjson

from memsvc.storage.connection import Connection
from memsvc.storage.model import Scope


@dataclass(frozen=True)
class Job:
    """One claimed ingest job."""

    scope: Scope
    ingest_id: uuid.UUID
    session_id: str
    # The stored JSON as decoded: the pipeline checks its shape (ingest.payload).
    payload: object
    attempts: int
    leased_by: str


@dataclass(frozen=True)
class JobStatus:
    scope: Scope
    ingest_id: uuid.UUID
    session_id: str
    state: str
    attempts: int
    last_error: str
    result: dict[str, int]
    created_at: datetime
    finished_at: datetime | None


async def enqueue(
    conn: Connection,
    scope: Scope,
    *,
    ingest_id: uuid.UUID,
    idempotency_key: str,
    session_id: str,
    payload: dict[str, object],
    request_digest: str,
) -> bool:
    """Insert the job; False when the user already used this idempotency key."""
    inserted = await conn.fetchval(
        "INSERT INTO ingest_outbox (tenant_id, user_id, persona_id, agent_id, ingest_id,"
        " idempotency_key, session_id, payload, request_digest)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        # No conflict target: a fresh ingest_id never conflicts, so only the key's unique
        # constraint (per user: migration 0016) can.
        " ON CONFLICT DO NOTHING RETURNING true",
        scope.tenant_id,
        scope.user_id,
        scope.persona_id,
        scope.agent_id,
        ingest_id,
        idempotency_key,
        session_id,
        orjson.dumps(payload).decode(),
        request_digest,
    )
    return bool(inserted)


@dataclass(frozen=True)
class KeyUse:
    """The job that used an idempotency key first, and what it was a job of."""

    ingest_id: uuid.UUID
    persona_id: str
    agent_id: str
    # None for a job written before digests were kept (migration 0016).
    request_digest: str | None


async def wake(conn: Connection, scope: Scope) -> None:
    """Wake the outbox workers for the scope's user, from the coordinator (Citus): there the
    row's NOTIFY trigger is gone from the shards (storage.citus_triggers), so the writer
    notifies in its own transaction, delivered at its commit, as the trigger would."""
    await conn.execute(
        "SELECT pg_notify('memsvc_outbox', $1)", f"{scope.tenant_id}:{scope.user_id}"
    )


async def first_use(conn: Connection, scope: Scope, idempotency_key: str) -> KeyUse | None:
    """The scope's user's job that used the key (keys are unique per user: one shard on
    Citus); None when there is none (it was deleted since, by erasure or retention)."""
    row = await conn.fetchrow(
        "SELECT ingest_id, persona_id, agent_id, request_digest FROM ingest_outbox"
        " WHERE tenant_id = $1 AND user_id = $2 AND idempotency_key = $3",
        scope.tenant_id,
        scope.user_id,
        idempotency_key,
    )
    if row is None:
        return None
    return KeyUse(row["ingest_id"], row["persona_id"], row["agent_id"], row["request_digest"])


# A job is claimable when it is due and pending, or when its holder's lease ran out (a crashed
# worker). One user's jobs run one at a time and oldest first, so a later turn is never
# decided before an earlier one.
_CLAIMABLE = """
    ((o.state = 'pending' AND o.available_at <= now())
     OR (o.state = 'processing' AND o.lease_until < now()))
    {user_filter}
    AND NOT EXISTS (
        SELECT 1 FROM ingest_outbox p
        WHERE p.tenant_id = o.tenant_id AND p.user_id = o.user_id
          AND p.ingest_id <> o.ingest_id
          AND ((p.state = 'processing' AND p.lease_until >= now())
               OR (p.state IN ('pending', 'processing') AND p.created_at < o.created_at)))
"""

_CLAIM = """
WITH candidates AS (
    SELECT o.tenant_id, o.user_id, o.ingest_id
    FROM ingest_outbox o
    WHERE {claimable}
    ORDER BY o.available_at
    LIMIT $3
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE ingest_outbox t
SET state = 'processing', attempts = t.attempts + 1,
    lease_until = now() + make_interval(secs => $1), leased_by = $2
FROM candidates c
WHERE {target} AND t.ingest_id = c.ingest_id
RETURNING t.tenant_id, t.user_id, t.persona_id, t.agent_id, t.ingest_id, t.session_id,
          t.payload, t.attempts, t.leased_by
"""
_ANY_USER = _CLAIM.format(
    claimable=_CLAIMABLE.format(user_filter=""),
    target="t.tenant_id = c.tenant_id AND t.user_id = c.user_id",
)
# One user's: the updated row is named by the user's parameters too, which makes the whole
# statement (lock, check and update) a single-shard router query on Citus.
_ONE_USER = _CLAIM.format(
    claimable=_CLAIMABLE.format(user_filter="AND o.tenant_id = $4 AND o.user_id = $5"),
    target="t.tenant_id = $4 AND t.user_id = $5",
)
# The users with a claimable job, oldest due first; reads only (no lock), so on Citus it
# may run over every shard. See claim_by_user.
_DUE_USERS = f"""
SELECT o.tenant_id, o.user_id, min(o.available_at) AS due
FROM ingest_outbox o
WHERE {_CLAIMABLE.format(user_filter="")}
GROUP BY o.tenant_id, o.user_id
ORDER BY due
LIMIT $1
"""
# How many more users than free slots claim_by_user looks at: other workers may take some.
_DUE_USERS_SPARE = 4
# The same users, in a fair order (issue 31): a tenant's users ranked by when the claiming
# worker last served them (never or longest ago first: $3, $4, $5 are the tenant, user and
# stamp of those it served lately, a larger stamp later), then by their oldest due job; and
# tenants taken turn by turn, those with fewer jobs running first (over every worker), so one
# tenant's flood of due jobs never goes before another tenant's first one, and one user's
# backlog never before the tenant's other users. A tenant at its cap ($2 jobs running; 0:
# none) is left out. Reads only, like _DUE_USERS; the CTEs over the table are materialized
# so that on Citus the rest runs on the coordinator, over their results.
_FAIR_DUE_USERS = f"""
WITH due AS MATERIALIZED (
    SELECT o.tenant_id, o.user_id, min(o.available_at) AS due
    FROM ingest_outbox o
    WHERE {_CLAIMABLE.format(user_filter="")}
    GROUP BY o.tenant_id, o.user_id
), running AS MATERIALIZED (
    SELECT tenant_id, count(*) AS jobs
    FROM ingest_outbox
    WHERE state = 'processing' AND lease_until >= now()
    GROUP BY tenant_id
), served AS (
    SELECT * FROM unnest($3::text[], $4::text[], $5::bigint[]) AS s(tenant_id, user_id, stamp)
), ranked AS (
    SELECT d.tenant_id, d.user_id, d.due, coalesce(r.jobs, 0) AS running,
           row_number() OVER (
               PARTITION BY d.tenant_id ORDER BY coalesce(s.stamp, -1), d.due, d.user_id
           ) AS rank
    FROM due d
    LEFT JOIN running r ON r.tenant_id = d.tenant_id
    LEFT JOIN served s ON s.tenant_id = d.tenant_id AND s.user_id = d.user_id
)
SELECT tenant_id, user_id FROM ranked
WHERE $2 = 0 OR running + rank <= $2
ORDER BY running + rank, due
LIMIT $1
"""


async def claim(
    conn: Connection,
    *,
    worker_id: str,
    lease_s: float,
    limit: int,
    tenant_id: str | None = None,
    user_id: str | None = None,
    timeout_s: float | None = None,
) -> list[Job]:
    """Claim up to `limit` due jobs (optionally one user's), leasing them to this worker."""
    args: list[Any] = [lease_s, worker_id, limit]
    statement = _ANY_USER
    if tenant_id is not None and user_id is not None:
        statement = _ONE_USER
        args += [tenant_id, user_id]
    rows = await conn.fetch(statement, *args, timeout=timeout_s)
    return [
        Job(
            scope=Scope(r["tenant_id"], r["user_id"], r["persona_id"], r["agent_id"]),
            ingest_id=r["ingest_id"],
            session_id=r["session_id"],
            payload=orjson.loads(r["payload"]),
            attempts=r["attempts"],
            leased_by=r["leased_by"],
        )
        for r in rows
    ]


async def claim_by_user(
    conn: Connection,
    *,
    worker_id: str,
    lease_s: float,
    limit: int,
    timeout_s: float | None = None,
) -> list[Job]:
    """Claim up to `limit` due jobs of any users, one user at a time: the claim for Citus.

    There ``FOR UPDATE SKIP LOCKED`` works only in a single-shard statement, so claim()
    over all users fails. Here a read without locks finds the users with claimable work
    (oldest due first), then each user's jobs are claimed with claim()'s per-user statement,
    a router query that locks, checks and leases on that user's shard. The guarantees are
    claim()'s: a job is claimed once (row lock, then state), held under a lease, taken over
    when its lease ran out, and one user's jobs run one at a time, oldest first. A user
    another worker claimed meanwhile simply yields nothing here.
    """
    users = await conn.fetch(_DUE_USERS, limit * _DUE_USERS_SPARE, timeout=timeout_s)
    return await _claim_each(
        conn, users, worker_id=worker_id, lease_s=lease_s, limit=limit, timeout_s=timeout_s
    )


async def claim_fairly(
    conn: Connection,
    *,
    worker_id: str,
    lease_s: float,
    limit: int,
    max_per_tenant: int = 0,
    served: Mapping[tuple[str, str], int] | None = None,
    timeout_s: float | None = None,
) -> list[Job]:
    """Claim up to `limit` due jobs across tenants fairly (_FAIR_DUE_USERS's order), at most
    ``max_per_tenant`` running per tenant over every worker (0: no cap), one user at a time
    as in claim_by_user (so it runs on Citus too). ``served``: (tenant, user) -> when this
    worker last claimed for them (a larger number later), so a tenant's users take turns.
    Workers claiming at the same moment each read the running counts before the others'
    claims: a tenant may then run up to one job per such worker over its cap, until those
    end."""
    last = served or {}
    users = await conn.fetch(
        _FAIR_DUE_USERS,
        limit * _DUE_USERS_SPARE,
        max_per_tenant,
        [tenant for tenant, _ in last],
        [user for _, user in last],
        list(last.values()),
        timeout=timeout_s,
    )
    return await _claim_each(
        conn,
        users,
        worker_id=worker_id,
        lease_s=lease_s,
        limit=limit,
        per_user=1,
        timeout_s=timeout_s,
    )


async def _claim_each(
    conn: Connection,
    users: list[asyncpg.Record],
    *,
    worker_id: str,
    lease_s: float,
    limit: int,
    per_user: int | None = None,
    timeout_s: float | None,
) -> list[Job]:
    """Claim the due jobs of ``users`` in their order, one user at a time with claim()'s
    per-user statement, until ``limit`` (``per_user``: at most that many of each)."""
    jobs: list[Job] = []
    for user in users:
        if len(jobs) >= limit:
            break
        left = limit - len(jobs)
        jobs += await claim(
            conn,
            worker_id=worker_id,
            lease_s=lease_s,
            limit=left if per_user is None else min(per_user, left),
            tenant_id=user["tenant_id"],
            user_id=user["user_id"],
            timeout_s=timeout_s,
        )
    return jobs


async def running_jobs(conn: Connection, tenant_id: str, *, timeout_s: float | None = None) -> int:
    """The tenant's jobs running now (leased, lease not run out), over every worker."""
    value: int = await conn.fetchval(
        "SELECT count(*) FROM ingest_outbox WHERE tenant_id = $1 AND state = 'processing'"
        " AND lease_until >= now()",
        tenant_id,
        timeout=timeout_s,
    )
    return value


async def still_leased(conn: Connection, job: Job, *, timeout_s: float | None = None) -> bool:
    """Whether the job is still this attempt's to run: its row is there, processing, leased
    by the same worker. False once it was deleted (ForgetSession, erasure) or taken over."""
    found = await conn.fetchval(
        "SELECT true FROM ingest_outbox WHERE tenant_id = $1 AND user_id = $2"
        " AND ingest_id = $3 AND leased_by = $4 AND state = 'processing'",
        *_job_key(job),
        timeout=timeout_s,
    )
    return bool(found)


def _job_key(job: Job) -> tuple[str, str, uuid.UUID, str]:
    return (job.scope.tenant_id, job.scope.user_id, job.ingest_id, job.leased_by)


async def complete(
    conn: Connection,
    job: Job,
    outcome: dict[str, int],
    *,
    timeout_s: float | None = None,
) -> bool:
    """Mark the job done; False when the lease was lost to another worker meanwhile."""
    status: str = await conn.execute(
        "UPDATE ingest_outbox SET state = 'done', result = $5, finished_at = now(),"
        " lease_until = NULL, last_error = ''"
        " WHERE tenant_id = $1 AND user_id = $2 AND ingest_id = $3 AND leased_by = $4"
        " AND state = 'processing'",
        *_job_key(job),
        orjson.dumps(outcome).decode(),
        timeout=timeout_s,
    )
    return status.endswith(" 1")


async def retry_later(
    conn: Connection,
    job: Job,
    error_kind: str,
    delay_s: float,
    *,
    timeout_s: float | None = None,
) -> None:
    """Give the job back, due again after `delay_s` (a transient failure, or shutdown)."""
    await conn.execute(
        "UPDATE ingest_outbox SET state = 'pending', last_error = $5, lease_until = NULL,"
        " available_at = now() + make_interval(secs => $6)"
        " WHERE tenant_id = $1 AND user_id = $2 AND ingest_id = $3 AND leased_by = $4"
        " AND state = 'processing'",
        *_job_key(job),
        error_kind,
        delay_s,
        timeout=timeout_s,
    )


async def mark_dead(
    conn: Connection, job: Job, error_kind: str, *, timeout_s: float | None = None
) -> None:
    """Give up on the job (a permanent failure, or its last attempt): it stays visible in
    status, and is never claimed again."""
    await conn.execute(
        "UPDATE ingest_outbox SET state = 'dead', last_error = $5, lease_until = NULL,"
        " finished_at = now()"
        " WHERE tenant_id = $1 AND user_id = $2 AND ingest_id = $3 AND leased_by = $4"
        " AND state = 'processing'",
        *_job_key(job),
        error_kind,
        timeout=timeout_s,
    )


async def status(
    conn: Connection, tenant_id: str, ingest_id: uuid.UUID, *, user_id: str | None = None
) -> JobStatus | None:
    """The job's state within the tenant, or only the user's (callers re-check the scope).
    With the user it is a single-shard read on Citus; without, it looks on every shard (an
    ingest id alone does not say whose it is)."""
    r = await conn.fetchrow(
        "SELECT tenant_id, user_id, persona_id, agent_id, ingest_id, session_id, state, attempts,"
        " last_error, result, created_at, finished_at"
        " FROM ingest_outbox WHERE tenant_id = $1 AND ingest_id = $2"
        + ("" if user_id is None else " AND user_id = $3"),
        tenant_id,
        ingest_id,
        *(() if user_id is None else (user_id,)),
    )
    if r is None:
        return None
    return JobStatus(
        scope=Scope(r["tenant_id"], r["user_id"], r["persona_id"], r["agent_id"]),
        ingest_id=r["ingest_id"],
        session_id=r["session_id"],
        state=r["state"],
        attempts=r["attempts"],
        last_error=r["last_error"],
        result=orjson.loads(r["result"]),
        created_at=r["created_at"],
        finished_at=r["finished_at"],
    )


async def depth(conn: Connection, *, timeout_s: float | None = None) -> tuple[int, float]:
    """(jobs waiting, age in seconds of the oldest) across all tenants, for metrics."""
    row = await conn.fetchrow(
        "SELECT count(*) AS n, coalesce(extract(epoch FROM now() - min(created_at)), 0) AS age"
        " FROM ingest_outbox WHERE state IN ('pending', 'processing')",
        timeout=timeout_s,
    )
    assert row is not None
    return int(row["n"]), float(row["age"])
