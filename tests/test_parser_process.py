"""The parser process (memsvc.extraction.parser_process): an exiting process ends it at once,
whatever it is parsing, and the next parse starts a new one; a parser parses with numpy's BLAS
on one thread."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memsvc.config import Settings
from memsvc.extraction import parser_process
from memsvc.extraction.base import ExtractionError, ExtractionInput, Turn


def _busy(started: Path) -> None:
    """Runs in the parser process: says it started, then holds the process for ten minutes,
    as a long parse would."""
    started.touch()
    end = time.monotonic() + 600
    while time.monotonic() < end:
        pass


def _pid(_: object) -> int:
    return os.getpid()


def _parse_then_count_blas_threads(data: ExtractionInput) -> tuple[int, list[int]]:
    """Runs in a parser process: a parse as a job's (loading the model there, the first
    time), then the thread count of each BLAS library numpy loaded."""
    from threadpoolctl import threadpool_info

    from memsvc.extraction.rules import _parse_in_parser_process

    parsed = _parse_in_parser_process(data)
    blas = [int(lib["num_threads"]) for lib in threadpool_info() if lib["user_api"] == "blas"]
    return len(parsed.facts), blas


async def test_stop_ends_a_parse_in_hand_and_the_next_parse_starts_afresh(
    tmp_path: Path,
) -> None:
    first_pid = await parser_process.parse_elsewhere(_pid, None)
    started = tmp_path / "started"
    parse = asyncio.ensure_future(parser_process.parse_elsewhere(_busy, started))
    while not started.exists():  # noqa: ASYNC110 (another process writes it)
        await asyncio.sleep(0.01)
    processes = parser_process._parser_pool().running()
    assert processes

    parser_process.stop()

    # Without stop() the process would parse for ten minutes (and an interpreter's exit would
    # wait for it); terminated, every parser is gone long before that.
    for process in processes:
        await asyncio.to_thread(process.join, 60)
        assert not process.is_alive()
    with pytest.raises(ExtractionError, match="parser process died"):
        await parse
    assert await parser_process.parse_elsewhere(_pid, None) != first_pid


def test_stop_without_a_parser_process_does_nothing() -> None:
    parser_process.stop()
    parser_process.stop()


async def test_the_parser_process_parses_with_one_blas_thread() -> None:
    """OpenBLAS wakes a spinning thread per core for every small product of a parse: several
    times the CPU of one thread on a busy machine (memsvc/extraction/language.py)."""
    settings = Settings.from_env({})
    said = Turn("m1", "I moved to Porto last month and I work at Stripe now.", datetime.now(UTC))
    data = ExtractionInput(
        "u1", "s1", (said,), settings.categories, settings.roles, settings.max_facts_per_episode
    )
    facts, threads = await parser_process.parse_elsewhere(_parse_then_count_blas_threads, data)
    assert facts  # parsed there, with the model loaded
    assert threads and set(threads) == {1}
