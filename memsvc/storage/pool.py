"""The asyncpg pool: pgvector codec on every connection, bounded timeouts everywhere."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgvector.asyncpg import register_vector

from memsvc.concurrency.deadline import Budget
from memsvc.config import Settings
from memsvc.errors import ResourceExhausted
from memsvc.observability import tracing
from memsvc.storage.connection import Connection
from memsvc.storage.migrate import migrate

# Session defaults sent at connect (every connection keeps them: see _keep_session).
# pgvector 0.8: when filters drop rows an HNSW scan returned, keep scanning instead of
# answering short; relaxed order, so callers re-sort by distance (Recall's large-scope path).
SERVER_SETTINGS = {"hnsw.iterative_scan": "relaxed_order"}
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


async def close(pool: asyncpg.Pool, *, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
    """Close the pool once its connections are back; those still in use after ``timeout_s``
    are terminated (asyncpg's documented pattern: ``Pool.close`` waits for every release,
    however long, and terminates the pool when cancelled), so a stop always ends."""
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
    """
    try:
        conn = await pool.acquire(timeout=max(budget.cap(timeout_s), 0.001))
    except TimeoutError:
        if busy_is_late or budget.expired:
            raise
        raise ResourceExhausted("every database connection is busy; retry shortly") from None
    try:
        yield conn
    finally:
        await pool.release(conn, timeout=RELEASE_TIMEOUT_S)
