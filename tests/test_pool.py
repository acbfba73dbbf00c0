"""The service's pool releases connections without a reset round trip, and safely."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from memsvc.config import Settings
from memsvc.storage import pool as pools
from memsvc.storage.pool import SERVER_SETTINGS, connect_and_migrate


async def _backend_and_state(conn: asyncpg.Connection) -> tuple[int, str, str]:
    row = await conn.fetchrow(
        "SELECT pg_backend_pid() AS pid, current_setting('hnsw.iterative_scan') AS scan,"
        " (SELECT coalesce(max(query), '') FROM pg_stat_activity"
        "  WHERE pid = pg_backend_pid()) AS q"
    )
    assert row is not None
    return row["pid"], row["scan"], row["q"]


async def test_release_rolls_back_an_open_transaction_and_keeps_session_defaults(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as conn:
        await conn.execute("CREATE TEMP TABLE IF NOT EXISTS pool_probe (n int)")
        # What a call cancelled mid-transaction leaves behind.
        await conn.execute("BEGIN")
        await conn.execute("INSERT INTO pool_probe VALUES (1)")
        await conn.execute("SET LOCAL statement_timeout = 1234")
        pid = (await _backend_and_state(conn))[0]
    # The pool hands out its most recently released idle connection: check that very one.
    for _ in range(pool.get_size()):
        async with pool.acquire() as conn:
            backend, scan, _query = await _backend_and_state(conn)
            if backend != pid:
                continue
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SELECT count(*) FROM pool_probe") == 0
            assert await conn.fetchval("SHOW statement_timeout") != "1234ms"
            assert scan == SERVER_SETTINGS["hnsw.iterative_scan"]
            await conn.execute("DROP TABLE pool_probe")
            return
    raise AssertionError("the released connection was not handed out again")


async def test_release_sends_no_reset_query(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as other:
        async with pool.acquire() as conn:
            pid = (await _backend_and_state(conn))[0]
        # Released. The last statement that backend ran is still its own, not a reset.
        last = await other.fetchval("SELECT query FROM pg_stat_activity WHERE pid = $1", pid)
    assert last is not None and "pg_backend_pid()" in last
    assert "RESET ALL" not in last and "UNLISTEN" not in last


async def test_closing_ends_even_with_a_connection_never_released(
    settings: Settings, pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    own = await connect_and_migrate(settings.with_overrides(pg_pool_min=1, pg_pool_max=2))
    held = await own.acquire()  # a task that never gives its connection back
    backend = held.get_server_pid()
    started = time.monotonic()
    await pools.close(own, timeout_s=0.5)
    assert time.monotonic() - started < 5.0  # asyncpg alone waits for the release forever
    assert "still in use 0.5 s after the pool began to close: terminated" in caplog.text
    for _ in range(50):  # terminated with the pool: its backend goes away
        gone = not await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", backend
        )
        if gone:
            break
        await asyncio.sleep(0.05)
    assert gone
