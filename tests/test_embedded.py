"""Integration tests for the embedded PostgreSQL and Valkey supervisors against the real servers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from memsvc.embedded import EmbeddedPostgres, EmbeddedServerError, EmbeddedStack, EmbeddedValkey
from memsvc.embedded.binaries import _package_dir
from memsvc.embedded.process import pid_alive, read_pid_file
from tests.embedded_faults import crash, restart

CONNECT_TIMEOUT_S = 10.0


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[EmbeddedStack]:
    embedded = EmbeddedStack(tmp_path / "data", durable=False)
    with embedded:
        yield embedded


async def _fetchval(dsn: str, sql: str, *args: object) -> object:
    conn = await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT_S)
    try:
        return await conn.fetchval(sql, *args, timeout=CONNECT_TIMEOUT_S)
    finally:
        await conn.close(timeout=CONNECT_TIMEOUT_S)


async def _execute(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT_S)
    try:
        await conn.execute(sql, timeout=CONNECT_TIMEOUT_S)
    finally:
        await conn.close(timeout=CONNECT_TIMEOUT_S)


async def test_postgres_has_pgvector_and_pg_trgm(stack: EmbeddedStack) -> None:
    dsn = stack.postgres.dsn
    assert dsn == f"postgresql://postgres@127.0.0.1:{stack.postgres.port}/memsvc?sslmode=disable"
    conn = await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT_S)
    try:
        version = await conn.fetchval(
            "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
        )
        assert version is not None
        assert await conn.fetchval("SELECT extname FROM pg_extension WHERE extname = 'pg_trgm'")
        await conn.execute(
            "CREATE TABLE items (id int PRIMARY KEY, embedding vector(3));"
            "INSERT INTO items VALUES (1, '[1,0,0]'), (2, '[0,1,0]'), (3, '[0.9,0.1,0]');"
        )
        nearest = await conn.fetch(
            "SELECT id, embedding <=> $1::vector AS distance FROM items ORDER BY distance LIMIT 2",
            "[1,0,0]",
        )
        assert [row["id"] for row in nearest] == [1, 3]
        assert nearest[0]["distance"] == pytest.approx(0.0)
        assert await conn.fetchval("SELECT similarity('memory', 'memories')") > 0.3
        # Non-ASCII letters must produce trigrams, or fuzzy search ignores non-English text.
        assert await conn.fetchval("SELECT similarity('привет', 'приветик')") > 0.3
    finally:
        await conn.close(timeout=CONNECT_TIMEOUT_S)


async def test_valkey_ping_set_get(stack: EmbeddedStack) -> None:
    url = stack.valkey.url
    assert url == f"redis://127.0.0.1:{stack.valkey.port}/0"
    client = aioredis.from_url(url, socket_timeout=CONNECT_TIMEOUT_S)
    try:
        assert await client.ping()
        await client.set("greeting", "hello")
        assert await client.get("greeting") == b"hello"
    finally:
        await client.aclose()


async def test_postgres_rows_survive_a_new_stack_on_the_same_dir(tmp_path: Path) -> None:
    with EmbeddedStack(tmp_path / "data", durable=False) as (dsn, _url):
        await _execute(dsn, "CREATE TABLE notes (body text); INSERT INTO notes VALUES ('a'), ('b')")
    with EmbeddedStack(tmp_path / "data", durable=False) as (dsn, _url):
        assert await _fetchval(dsn, "SELECT count(*) FROM notes") == 2


async def test_kill_and_restart_postgres_keeps_committed_rows(tmp_path: Path) -> None:
    stack = EmbeddedStack(tmp_path / "data", durable=True)
    with stack as (dsn, _url):
        await _execute(dsn, "CREATE TABLE notes (body text); INSERT INTO notes VALUES ('a')")
        # The pid is the postmaster's own (no wrapper process between), so a kill reaches it.
        assert stack.postgres.pid == read_pid_file(stack.postgres.pid_path)
        crash(stack.postgres)
        assert not stack.postgres.is_running()
        assert stack.postgres.pid is None
        assert stack.postgres.start() == dsn
        assert await _fetchval(dsn, "SELECT count(*) FROM notes") == 1
        assert restart(stack.postgres) == dsn
        assert await _fetchval(dsn, "SELECT count(*) FROM notes") == 1
    assert not stack.postgres.is_running()
    assert not stack.valkey.is_running()


async def test_valkey_restart_keeps_port_and_data(tmp_path: Path) -> None:
    valkey = EmbeddedValkey(tmp_path / "data", persist=True)
    url = valkey.start()
    try:
        client = aioredis.from_url(url, socket_timeout=CONNECT_TIMEOUT_S)
        try:
            await client.set("kept", "1")
        finally:
            await client.aclose()
        valkey.stop()
        assert valkey.start() == url
        assert valkey.pid == read_pid_file(valkey.pid_path)
        crash(valkey)
        assert not valkey.is_running()
        assert valkey.start() == url
        client = aioredis.from_url(url, socket_timeout=CONNECT_TIMEOUT_S)
        try:
            assert await client.get("kept") == b"1"
        finally:
            await client.aclose()
    finally:
        valkey.stop()


async def test_a_stop_that_kills_postgres_kills_its_backends_too(tmp_path: Path) -> None:
    """A backend runs in a session of its own (not in the postmaster's process group): when
    a stop has to SIGKILL the server, one that would not exit by itself (here stopped, so
    the fast shutdown waits for it) must not outlive the stop, holding the shared memory a
    new postmaster refuses to start beside."""
    postgres = EmbeddedPostgres(tmp_path / "data", durable=False)
    dsn = postgres.start()
    conn = await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT_S)
    backend = await conn.fetchval("SELECT pg_backend_pid()")
    os.kill(backend, signal.SIGSTOP)
    try:
        # The fast shutdown never ends (the stopped backend ignores its SIGTERM meanwhile):
        # the stop SIGKILLs the server after its bound.
        await asyncio.to_thread(postgres.stop, 1.0)
        assert not pid_alive(backend)
        assert await asyncio.to_thread(postgres.start) == dsn
        assert await _fetchval(dsn, "SELECT 1") == 1
    finally:
        conn.terminate()
        with contextlib.suppress(ProcessLookupError):
            os.kill(backend, signal.SIGKILL)
        postgres.stop()


def test_leftover_postgres_from_a_crashed_run_is_replaced(tmp_path: Path) -> None:
    crashed = EmbeddedPostgres(tmp_path / "data", durable=False)
    crashed.start()
    # A second supervisor on the same directory stands in for the next run after a crash.
    fresh = EmbeddedPostgres(tmp_path / "data", durable=False)
    try:
        fresh.start()
        assert not crashed.is_running()
        assert fresh.is_running()
    finally:
        fresh.stop()
        crashed.stop()


def test_stale_pid_files_are_removed(tmp_path: Path) -> None:
    postgres = EmbeddedPostgres(tmp_path / "data", durable=False)
    postgres.start()
    postgres.stop()
    pid_file = postgres.pgdata / "postmaster.pid"
    dead = subprocess.Popen(["true"])
    dead.wait()
    # A dead pid, then a live pid that is not a postgres (pid reuse): both must be ignored.
    for pid in (dead.pid, os.getpid()):
        pid_file.write_text(f"{pid}\n{postgres.pgdata}\n")
        try:
            postgres.start()
            assert postgres.is_running()
        finally:
            postgres.stop()


def test_leftover_valkey_from_a_crashed_run_is_replaced(tmp_path: Path) -> None:
    crashed = EmbeddedValkey(tmp_path / "data", persist=False)
    crashed.start()
    fresh = EmbeddedValkey(tmp_path / "data", persist=False)
    try:
        fresh.start()
        assert not crashed.is_running()
        assert fresh.is_running()
    finally:
        fresh.stop()
        crashed.stop()


async def test_two_stacks_run_side_by_side(tmp_path: Path) -> None:
    with (
        EmbeddedStack(tmp_path / "one", durable=False) as (dsn_one, url_one),
        EmbeddedStack(tmp_path / "two", durable=False) as (dsn_two, url_two),
    ):
        assert dsn_one != dsn_two
        assert url_one != url_two
        assert await _fetchval(dsn_one, "SELECT 1") == 1
        assert await _fetchval(dsn_two, "SELECT 1") == 1


def test_busy_fixed_port_fails_with_the_log_tail(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        valkey = EmbeddedValkey(tmp_path / "data", port=port, persist=False)
        with pytest.raises(EmbeddedServerError, match="Address already in use"):
            valkey.start(timeout_s=10)
        assert not valkey.is_running()


def test_port_is_unknown_before_start(tmp_path: Path) -> None:
    with pytest.raises(EmbeddedServerError):
        _ = EmbeddedPostgres(tmp_path).dsn
    with pytest.raises(EmbeddedServerError):
        _ = EmbeddedValkey(tmp_path).url
    assert EmbeddedValkey(tmp_path).pid is None
    assert EmbeddedPostgres(tmp_path, port=5999).dsn.endswith(":5999/memsvc?sslmode=disable")


def test_missing_wheel_names_the_extra() -> None:
    with pytest.raises(EmbeddedServerError, match=r"memsvc\[embedded\]"):
        _package_dir("memsvc_no_such_wheel")
