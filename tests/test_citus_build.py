"""Finding a PostgreSQL with Citus never skips silently: without one it fails, naming the
two ways to provide it (CITUS_SOURCE=, CITUS_PG_BIN=). The build itself runs in
`make test-cluster`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memsvc.embedded.binaries import postgres_bin_dir
from tools.clusters.citus_build import CitusUnavailable, build, check_installed


def _run_without_citus(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITUS_")}
    env["CITUS_BUILD_CACHE"] = str(tmp_path)
    return subprocess.run(
        [sys.executable, "-m", "tools.clusters.citus_build"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_without_a_source_it_fails_and_says_what_to_set(tmp_path: Path) -> None:
    result = _run_without_citus(tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert "CITUS_SOURCE=" in result.stderr and "CITUS_PG_BIN=" in result.stderr


def test_a_missing_tarball_is_named(tmp_path: Path) -> None:
    with pytest.raises(CitusUnavailable, match=r"CITUS_SOURCE=.*does not exist"):
        build(tmp_path / "citus-14.0.1.tar.gz", tmp_path / "cache")


def test_a_postgresql_without_citus_is_refused() -> None:
    """The wheel's own PostgreSQL has pgvector but no Citus: named as lacking citus.so."""
    with pytest.raises(CitusUnavailable, match=r"lacks .*citus\.so"):
        check_installed(postgres_bin_dir())
