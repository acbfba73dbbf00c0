"""Collector pauses are timed into the histogram; a frozen heap makes full collections short."""

from __future__ import annotations

import gc
import subprocess
import sys

from prometheus_client import REGISTRY

from memsvc.observability import gc_pauses


def _count(generation: str) -> float:
    value = REGISTRY.get_sample_value("memsvc_gc_pause_seconds_count", {"generation": generation})
    return value or 0.0


def test_every_collection_is_timed_into_the_histogram() -> None:
    gc_pauses.observe()
    gc_pauses.observe()  # idempotent: one callback, one observation per collection
    try:
        gc_pauses.flush()
        before = _count("2")
        gc.collect()
        gc.collect()
        assert gc_pauses.flush() >= 2  # the two, and any automatic ones meanwhile
        assert _count("2") == before + 2
    finally:
        gc.callbacks.remove(gc_pauses._callback)


def test_freezing_start_up_objects_empties_the_collected_generations() -> None:
    # In a child process: freezing the test runner's own heap would outlive this test.
    script = (
        "import gc, time\n"
        "import memsvc.server.app\n"
        "from memsvc.observability import gc_pauses\n"
        "tracked = len(gc.get_objects())\n"
        "frozen = gc_pauses.freeze_startup_objects()\n"
        "print(tracked, frozen, len(gc.get_objects()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    tracked, frozen, left = (int(v) for v in out)
    assert tracked > 10_000
    assert frozen >= tracked * 0.9
    assert left < 100
