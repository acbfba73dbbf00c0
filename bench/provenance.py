"""Where a figure came from: the command, the git commit, the CPU and the date of a run."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def git_commit() -> str:
    """The short sha of HEAD, with "+dirty" when tracked or untracked files differ from it."""

    def git(*args: str) -> str:
        # GIT_OPTIONAL_LOCKS=0: `git status` must not rewrite the index of a tree others use.
        return subprocess.run(
            ["git", *args],
            cwd=REPO,
            env=os.environ | {"GIT_OPTIONAL_LOCKS": "0"},
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()

    try:
        sha = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain"))
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}+dirty" if dirty else sha


def cpu_model() -> str:
    """The first "model name" of /proc/cpuinfo and the number of cores this process may use."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {len(os.sched_getaffinity(0))} cores"


def provenance() -> dict[str, Any]:
    """The run's command line as typed (``python -m bench.X args``), commit, CPU, date, and
    the machine's load when it was written (others' work on a shared machine shows there)."""
    module = Path(sys.argv[0]).stem
    return {
        "command": shlex.join(["python", "-m", f"bench.{module}", *sys.argv[1:]]),
        "commit": git_commit(),
        "cpu": cpu_model(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "load_1m": round(os.getloadavg()[0], 2),
    }
