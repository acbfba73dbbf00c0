"""The asyncpg pool: pgvector codec on every connection, bounded timeouts everywhere."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import asyncpg
from pgvector.asyncpg import register_vector

from memsvc.concurrency.deadline import Budget
from memsvc.concurrency.shares import TenantWaits
from memsvc.config import Settings
from memsvc.errors import ResourceExhausted
from memsvc.observability import call_context, tracing
from memsvc.storage.connection import Connection
from memsvc.storage.migrate import migrate

# Session defaults sent at connect (every connection keeps them: see _keep_session).
SERVER_SETTINGS = {
    # pgvector 0.8: when filters drop rows an HNSW scan returned, keep scanning instead of
    # answering short; relaxed order, so callers re-sort by distance (Recall's large-scope
    # path).
    "hnsw.iterative_scan": "relaxed_order",
    # Citus: no shard-hiding filter in memsvc's queries of pg_class. Citus hides shards from
    # applications by adding `relation_is_a_known_shard(oid) IS NOT TRUE` to every query that
    # reads pg_class, and asyncpg's type introspection (run on a connection's first statement
    # with an array type it has no codec for: uuid[], timestamptz[], ...) reads pg_class once
    # per row of pg_type: about 350,000 calls of that function, 0.7-1.7 s of the coordinator's
    # CPU per connection and type (16-50 ms without the filter, as on one PostgreSQL). It
    # runs inside the call, so its deadline cancelled it, nothing was cached and the next
    # attempt paid it again: under load after a worker node was killed Ingest was never served
    # again (issue 31, bench/chaos.py --citus). memsvc never lists tables for a user, and its
    # one pg_class query (storage.citus.unclassified) leaves shards out itself. A placeholder
    # setting without Citus (like hnsw.* without pgvector loaded).
    "citus.show_shards_for_app_name_prefixes": "*",
}
# How long a release may wait for a cancelled statement's cancel request to be acknowledged.
# Not the acquire wait: a read leg takes its connection with whatever budget is left (a
# sliver after a slow embed), and asyncpg bounds the release by that same timeout unless
# told otherwise. On timeout asyncpg drops the connection, which cancels its own cancel
# request mid-connect: the query may run on, and a connect cancelled at the wrong moment
# leaves "Future exception was never retrieved ... unexpected connection_lost() call" on
# the loop (issue 15). A read leg releases in the background (fanout.LegRunner), so the
# answer never waits for this; the acknowledgement normally takes a few milliseconds.
RELEASE_TIMEOUT_S = 5.0
# How long closing the pool waits for the connections still in use to come back (every
# call and worker is stopped before: this is a bound on a defect, not a grace period).
CLOSE_TIMEOUT_S = 10.0

log = logging.getLogger(__name__)

# Each serving pool's per-tenant connection shares, by id(pool): asyncpg's Pool has slots and
# no __weakref__, so they cannot hang on it; close() removes the entry.
_SHARES: dict[int, TenantWaits] = {}


def share_per_tenant(pool: asyncpg.Pool, per_tenant: int) -> None:
    """From now on a call (its tenant in call_context) holds at most ``per_tenant`` of the
    pool's connections at once; 0 (or a share as large as the pool) lifts the cap."""
    if 0 < per_tenant < pool.get_max_size():
        _SHARES[id(pool)] = TenantWaits(per_tenant)
    else:
        _SHARES.pop(id(pool), None)


async def close(pool: asyncpg.Pool, *, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
    """Close the pool once its connections are back; those still in use after ``timeout_s``
    are terminated (asyncpg's documented pattern: ``Pool.close`` waits for every release,
    however long, and terminates the pool when cancelled), so a stop always ends."""
    _SHARES.pop(id(pool), None)
    try:
        await asyncio.wait_for(pool.close(), timeout_s)
    except TimeoutError:
        log.warning(
            "database connections still in use %g s after the pool began to close: terminated",
            timeout_s,
        )


async def _init_connection(conn: asyncpg.Connection) -> None:
    await register_vector(conn)
    if tracing.enabled():
        # A span per statement; with tracing off asyncpg keeps its path without loggers.
        conn.add_query_logger(tracing.sql_logger)


async def _keep_session(conn: Connection) -> None:
    """Release without asyncpg's reset query (``pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL``): one more round trip per release, on the path of every read
    before it can answer. memsvc changes no session state: settings are ``SET LOCAL``,
    advisory locks are transaction-scoped, cursors live in transactions and nothing
    LISTENs. asyncpg still rolls back a transaction left open (a cancelled call) before
    calling this."""


async def apply_migrations(settings: Settings) -> list[str]:
    """Apply the missing migrations over one connection of its own; the names applied."""
    assert settings.pg_dsn is not None, "pg_dsn must be resolved before connecting"
    conn = await asyncpg.connect(settings.pg_dsn, timeout=10)
    try:
        return await migrate(conn, embedding_dim=settings.embedding_dim)
    finally:
        await conn.close()


async def connect_and_migrate(settings: Settings) -> asyncpg.Pool:
    """Apply migrations over one connection, then open the pool the service uses."""
    await apply_migrations(settings)
    pool: asyncpg.Pool = await asyncpg.create_pool(
        settings.pg_dsn,
        min_size=settings.pg_pool_min,
        max_size=settings.pg_pool_max,
        command_timeout=settings.pg_command_timeout_ms / 1000,
        init=_init_connection,
        reset=_keep_session,
        timeout=10,
        server_settings=SERVER_SETTINGS,
    )
    share_per_tenant(pool, settings.pg_pool_max_per_tenant)
    return pool


@asynccontextmanager
async def acquire(
    pool: asyncpg.Pool, budget: Budget, *, timeout_s: float, busy_is_late: bool = False
) -> AsyncIterator[Connection]:
    """A pooled connection within the budget.

    Waiting is bounded by the smaller of the budget and `timeout_s`. When no connection frees
    up in that time, a call answers a fast RESOURCE_EXHAUSTED (the client may retry), while a
    read leg (`busy_is_late`) raises TimeoutError: it is late, like a slow leg, and the answer
    goes on without it. Release is asyncpg's own (shielded from cancellation), bounded by
    RELEASE_TIMEOUT_S rather than by the acquire wait.

    Inside a call (its tenant in call_context) on a pool with shares (share_per_tenant), the
    connection is also one of the tenant's share: past it the call waits, within the same
    bound, for one of its own tenant's to come back, never for another tenant's.
    """
    wait_s = max(budget.cap(timeout_s), 0.001)
    tenant = call_context.tenant.get()
    shares = _SHARES.get(id(pool)) if tenant is not None else None
    async with AsyncExitStack() as stack:
        if shares is not None and tenant is not None:
            deadline = time.monotonic() + wait_s
            try:
                await stack.enter_async_context(shares.hold(tenant, wait_s))
            except TimeoutError:
                if busy_is_late or budget.expired:
                    raise
                raise ResourceExhausted(
                    f"this tenant's calls hold {shares.per_tenant} database connections on this"
                    " server, its share; retry shortly"
                ) from None
            wait_s = max(deadline - time.monotonic(), 0.001)
        try:
            conn = await pool.acquire(timeout=wait_s)
        except TimeoutError:
            if busy_is_late or budget.expired:
                raise
            raise ResourceExhausted("every database connection is busy; retry shortly") from None
        try:
            yield conn
        finally:
            await pool.release(conn, timeout=RELEASE_TIMEOUT_S)


# How long after the budget's end asyncpg's own timeout would stop a leg's statement.
STATEMENT_TIMEOUT_SLACK_S = 0.1


def statement_timeout(budget: Budget) -> float:
    """asyncpg's per-statement timeout: a backstop a little after the budget's end.

    The leg runner cancels a late leg at the budget's end (asyncpg then cancels its query on
    the server), and the answer is built right after. asyncpg's own timeout must not fire at
    the same moment: handling it (the timeout error, a cancel request on a new connection)
    takes milliseconds of event-loop time, and ahead of the runner's timer it delayed the
    answer past a 500 ms deadline (measured: 10-16 ms, a fresh server whose legs were
    blocked by a table lock while preparing their statements)."""
    return budget.remaining() + STATEMENT_TIMEOUT_SLACK_S
