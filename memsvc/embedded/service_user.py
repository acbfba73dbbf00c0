"""Run PostgreSQL as an unprivileged system user, because it refuses to run as root."""

from __future__ import annotations

import grp
import os
import pwd
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from memsvc.embedded.errors import EmbeddedServerError

SERVICE_USER = "memsvc-pg"

# useradd's exit status when the user already exists: another process won a creation race.
_USERADD_EXISTS = 9

# Run by a fresh interpreter: drop to the service user, then exec the real command (same pid).
_DROP_AND_EXEC = (
    "import os, sys; os.setgroups([]); os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[1]));"
    " os.execv(sys.argv[3], sys.argv[3:])"
)


@dataclass(frozen=True, slots=True)
class ServiceIdentity:
    """The uid/gid a child process is switched to before exec."""

    uid: int
    gid: int


def service_identity(name: str = SERVICE_USER) -> ServiceIdentity | None:
    """The identity PostgreSQL must run as, or None when we are not root (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        _create_user(name)
        entry = pwd.getpwnam(name)
    return ServiceIdentity(uid=entry.pw_uid, gid=entry.pw_gid)


def as_identity(identity: ServiceIdentity | None, command: list[str]) -> list[str]:
    """``command`` wrapped to run as ``identity`` (unchanged when None).

    Not Popen(user=...): changing ids makes Popen fork() rather than vfork(), and a fork of a
    process whose other threads are inside gRPC runs gRPC's atfork handlers in the child, which
    then dies of SIGSEGV about one time in five (restarting PostgreSQL under a running memsvc,
    as the fault tests do). The ids change after exec instead, in a single-threaded process.
    """
    if identity is None:
        return command
    uid, gid = str(identity.uid), str(identity.gid)
    return [sys.executable, "-I", "-S", "-c", _DROP_AND_EXEC, uid, gid, *command]


def _create_user(name: str) -> None:
    try:
        grp.getgrnam(name)
        group_args = ["--gid", name]
    except KeyError:
        group_args = ["--user-group"]
    command = [
        "useradd",
        "--system",
        "--no-create-home",
        "--shell",
        "/usr/sbin/nologin",
        *group_args,
        name,
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EmbeddedServerError(f"cannot create system user {name!r}: {exc}") from exc
    if result.returncode not in (0, _USERADD_EXISTS):
        raise EmbeddedServerError(
            f"cannot create system user {name!r} (useradd exit {result.returncode}): "
            f"{result.stderr.strip()}"
        )


def grant_traversal(path: Path) -> None:
    """Make `path` and every ancestor searchable (o+x) so another user can reach below it."""
    for directory in (path, *path.parents):
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def grant_read_tree(root: Path) -> None:
    """Make a whole install tree readable, and its directories and executables runnable, by all."""
    grant_traversal(root)
    for dirpath, _dirnames, filenames in os.walk(root):
        _add_other_bits(Path(dirpath), stat.S_IROTH | stat.S_IXOTH)
        for filename in filenames:
            path = Path(dirpath) / filename
            mode = path.lstat().st_mode
            if stat.S_ISREG(mode):
                wanted = stat.S_IROTH | (stat.S_IXOTH if mode & stat.S_IXUSR else 0)
                _add_other_bits(path, wanted)


def _add_other_bits(path: Path, bits: int) -> None:
    mode = path.lstat().st_mode
    if mode & bits != bits:
        path.chmod(stat.S_IMODE(mode) | bits)


def own_tree(root: Path, identity: ServiceIdentity) -> None:
    """Give `root` and everything below it to `identity`, unless it already owns the top."""
    # Only the top is checked: a tree the server created is all its own, and walking a large
    # data directory on every start would cost seconds.
    info = root.stat()
    if (info.st_uid, info.st_gid) == (identity.uid, identity.gid):
        return
    os.chown(root, identity.uid, identity.gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            os.chown(Path(dirpath) / name, identity.uid, identity.gid, follow_symlinks=False)
