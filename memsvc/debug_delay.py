"""Test-only slowing of a read stage: a real server-side pg_sleep, off in every real setup."""

from __future__ import annotations

from collections.abc import Mapping

import asyncpg

MARKER = "memsvc:debug-delay"


def delays_from_settings(pairs: tuple[tuple[str, int], ...]) -> Mapping[str, float]:
    """Stage name -> seconds, from Settings.debug_stage_delays_ms."""
    return {stage: ms / 1000 for stage, ms in pairs if ms > 0}


async def maybe_sleep(conn: asyncpg.Connection, delays: Mapping[str, float], stage: str) -> None:
    """Run pg_sleep on the stage's own connection when a test configured a delay for it.

    The sleep is a query like any other: a cancelled leg must stop it on the server, which
    is what the cancellation tests look for in pg_stat_activity (by MARKER and stage).
    """
    seconds = delays.get(stage)
    if seconds:
        await conn.execute(f"SELECT pg_sleep($1) /* {MARKER}:{stage} */", seconds)
