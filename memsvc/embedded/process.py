"""Process plumbing for supervised servers: budgets, ports, liveness, signals and log tails."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections import deque
from pathlib import Path

from memsvc.embedded.errors import EmbeddedServerError

# How often to re-check a process or port that is not ready yet: short enough that startup
# latency is dominated by the server, long enough not to burn a core on 2-CPU machines.
POLL_INTERVAL_S = 0.05


class Deadline:
    """One shrinking time budget handed down through every step of a start or stop."""

    def __init__(self, timeout_s: float) -> None:
        self._expires_at = time.monotonic() + timeout_s

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self._expires_at - time.monotonic())

    @property
    def expired(self) -> bool:
        """True once the budget is spent."""
        return self.remaining() <= 0.0

    def sleep(self, seconds: float = POLL_INTERVAL_S) -> None:
        """Sleep for `seconds`, or less if the budget runs out first."""
        time.sleep(min(seconds, self.remaining()))


def pick_free_port(host: str) -> int:
    """A port the OS considers free on `host` right now (another process may still take it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def url_host(host: str) -> str:
    """`host` as it must appear in a URL authority (IPv6 literals are bracketed)."""
    return f"[{host}]" if ":" in host else host


def pid_alive(pid: int) -> bool:
    """Whether `pid` names a live process; zombies count as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, but owned by another user
    # A zombie still answers kill(0); where PID 1 does not reap (bare containers) an
    # orphaned server would otherwise look alive forever.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    state = stat.rpartition(")")[2].split()
    return not state or state[0] not in ("Z", "X")


def read_cmdline(pid: int) -> list[str]:
    """The argv of `pid` from /proc, or [] if it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def read_pid_file(path: Path) -> int | None:
    """The pid on the first line of a pid file, or None if absent or malformed."""
    try:
        first = path.read_text().partition("\n")[0].strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(first) if first.isdigit() and int(first) > 0 else None


# How long a kill waits for the server's children to be gone (SIGKILL cannot be ignored:
# this only waits for the kernel to tear them down).
CHILDREN_SETTLE_S = 5.0


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is `pid` now (from /proc; [] where it cannot be read)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # gone meanwhile
            fields = stat.rpartition(")")[2].split()
            if len(fields) > 1 and fields[1] == str(pid):
                found.append(int(entry.name))
    return found


def _kill_group(pid: int) -> None:
    """SIGKILL a server, its process group and its children, and wait until they are gone.

    Servers are started as session leaders, so their group id is their pid. PostgreSQL's
    backends and background workers each call setsid(), so they are not in that group: they
    would run on until they notice the postmaster died, and one that does not notice (stuck,
    stopped) keeps the shared memory, so a new postmaster refuses to start ("pre-existing
    shared memory block is still in use"). So the children, found before the server dies
    (then they are orphans, no longer its children), are killed one by one too."""
    children = child_pids(pid)
    grouped = False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
            grouped = True
    if not grouped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for child in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)
    settle = Deadline(CHILDREN_SETTLE_S)
    while any(pid_alive(child) for child in children) and not settle.expired:
        settle.sleep()


def stop_child(proc: subprocess.Popen[bytes], sig: signal.Signals, timeout_s: float) -> None:
    """Send `sig` to a child we started, SIGKILL its group after `timeout_s`, and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout_s)
            return
        except subprocess.TimeoutExpired:
            pass
    kill_child(proc)


def kill_child(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a child we started and its whole process group, then reap it."""
    _kill_group(proc.pid)
    proc.wait()


def stop_foreign(pid: int, sig: signal.Signals, deadline: Deadline) -> None:
    """Stop a process we did not start (a leftover from a crashed run) and wait until it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    while pid_alive(pid) and not deadline.expired:
        deadline.sleep()
    if pid_alive(pid):
        _kill_group(pid)
        # SIGKILL cannot be ignored; this only waits for the kernel to tear the process down.
        settle = Deadline(5.0)
        while pid_alive(pid) and not settle.expired:
            settle.sleep()
    if pid_alive(pid):
        raise EmbeddedServerError(f"leftover server process {pid} would not exit")


def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file, for error messages."""
    try:
        with path.open(errors="replace") as log:
            return "".join(deque(log, maxlen=lines))
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"


def child_env() -> dict[str, str]:
    """The environment for server and client tools: ours, minus anything that retargets them."""
    # PG* variables (PGHOST, PGDATA, PGOPTIONS, ...) would silently redirect psql/pg_isready or
    # alter the server; a fixed C locale keeps initdb and messages independent of the host.
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PG", "LC_")) and key != "LANG"
    }
    env["LC_ALL"] = "C"
    env["LANG"] = "C"
    return env
