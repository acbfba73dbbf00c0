"""The lifecycle every embedded server shares: port, spawn, readiness, stop, crashed-run cleanup."""

from __future__ import annotations

import signal
import subprocess
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from memsvc.embedded.errors import EmbeddedServerError
from memsvc.embedded.process import (
    Deadline,
    child_env,
    kill_child,
    log_tail,
    pick_free_port,
    pid_alive,
    read_cmdline,
    read_pid_file,
    stop_child,
    stop_foreign,
)

# Attempts at an auto-picked port: between picking it and the server binding it, another
# process may take it.
_AUTO_PORT_ATTEMPTS = 3


class ServerSupervisor(ABC):
    """One server process whose files live under `data_dir`; the caller owns its lifetime.

    A subclass supplies only what is its own: the command line, the readiness probe, the
    setup before a spawn and after readiness, how to recognise its process, and its URL.
    """

    _name: ClassVar[str]  # the server, as error messages name it
    _stop_signal: ClassVar[signal.Signals]  # the server's own clean-shutdown signal
    _start_timeout_s: ClassVar[float]  # start()'s budget when the caller gives none
    _log_file: ClassVar[str]  # relative to data_dir
    _pid_file: ClassVar[str]  # relative to data_dir; written by the server itself

    def __init__(self, data_dir: Path, *, port: int | None, host: str) -> None:
        self._data_dir = Path(data_dir).resolve()
        self._host = host
        self._port = port
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        """The folder holding the server's data, its log and its pid file."""
        return self._data_dir

    @property
    def log_path(self) -> Path:
        """Where the server (and any setup tool run before it) writes its output."""
        return self._data_dir / self._log_file

    @property
    def pid_path(self) -> Path:
        """The server's pid file, used to find a server left over by a crashed run."""
        return self._data_dir / self._pid_file

    @property
    def port(self) -> int:
        """The TCP port; fixed after the first successful start so restarts keep it."""
        if self._port is None:
            raise EmbeddedServerError(f"{self._name} has no port yet; call start() first")
        return self._port

    @property
    def pid(self) -> int | None:
        """The pid (and process group) of the server we started, or None when none runs."""
        return self._proc.pid if self._proc is not None and self.is_running() else None

    @property
    @abstractmethod
    def url(self) -> str:
        """The address clients connect to; start() returns it."""

    def is_running(self) -> bool:
        """Whether the server we started is still alive."""
        # poll() also reaps a server that died on its own, so it never lingers as a zombie.
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float | None = None) -> str:
        """Set up if needed, start, wait until the server serves, and return its URL."""
        if self.is_running():
            return self.url
        self._proc = None
        deadline = Deadline(self._start_timeout_s if timeout_s is None else timeout_s)
        self._data_dir.mkdir(parents=True, exist_ok=True)
        self._clear_leftover_server(deadline)
        self._prepare(deadline)
        auto_port = self._port is None
        attempts = _AUTO_PORT_ATTEMPTS if auto_port else 1
        for attempt in range(attempts):
            port = pick_free_port(self._host) if auto_port else self.port
            proc = self._proc = self._spawn(self._command(port))
            try:
                self._wait_ready(proc, port, deadline)
                self._port = port
                self._on_ready(deadline)
            except EmbeddedServerError:
                # A server that exited on an auto-picked port most likely lost it to another
                # process: try a fresh one.
                if attempt + 1 < attempts and not self.is_running():
                    self._proc = None
                    continue
                self._kill()
                raise
            except BaseException:
                self._kill()
                raise
            else:
                return self.url
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self, timeout_s: float = 20.0) -> None:
        """Send the server's clean-shutdown signal; SIGKILL its group after `timeout_s`."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_child(proc, self._stop_signal, timeout_s)

    @abstractmethod
    def _prepare(self, deadline: Deadline) -> None:
        """Create the server's directories (and its data, the first time) before a spawn."""

    @abstractmethod
    def _command(self, port: int) -> list[str]:
        """The argv that runs the server in the foreground on `port`."""

    @abstractmethod
    def _is_ready(self, port: int, deadline: Deadline) -> bool:
        """One readiness probe: True once the server serves; raise if it never will."""

    @abstractmethod
    def _is_ours(self, argv: list[str]) -> bool:
        """Whether a live process with this argv is our server (and not a reused pid)."""

    @abstractmethod
    def _on_ready(self, deadline: Deadline) -> None:
        """Set up what needs the server serving (a database, extensions) before start() returns."""

    def _failure(self, message: str) -> EmbeddedServerError:
        """An error whose message ends with the log tail, where the server says why."""
        return EmbeddedServerError(f"{message}\n--- {self.log_path} ---\n{log_tail(self.log_path)}")

    def _kill(self) -> None:
        # After a failed start: nothing of a half-started server may outlive start().
        proc, self._proc = self._proc, None
        if proc is not None:
            kill_child(proc)

    def _clear_leftover_server(self, deadline: Deadline) -> None:
        pid = read_pid_file(self.pid_path)
        if pid is not None and pid_alive(pid) and self._is_ours(read_cmdline(pid)):
            # A previous run crashed and left its server up, still writing to our files:
            # stop it the way we would have.
            stop_foreign(pid, self._stop_signal, deadline)
        # Whatever remains is stale (a dead or reused pid); PostgreSQL would refuse to start
        # on a pid file whose pid is alive.
        self.pid_path.unlink(missing_ok=True)

    def _spawn(self, command: list[str]) -> subprocess.Popen[bytes]:
        # Errors printed before the server opens its own log (bad flags) land in the same file.
        with self.log_path.open("ab") as log:
            try:
                return subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self._data_dir,
                    env=child_env(),
                    # Own session: a terminal Ctrl-C reaches only our process, which then stops
                    # the servers in order instead of racing their own SIGINT handling; and the
                    # group id is the pid, so a SIGKILL takes the server's workers down with it.
                    start_new_session=True,
                )
            except OSError as exc:
                raise EmbeddedServerError(f"cannot start {self._name}: {exc}") from exc

    def _wait_ready(self, proc: subprocess.Popen[bytes], port: int, deadline: Deadline) -> None:
        while True:
            if proc.poll() is not None:
                raise self._failure(
                    f"{self._name} exited with status {proc.returncode} during startup"
                )
            if deadline.expired:
                raise self._failure(f"{self._name} was not ready on port {port} in time")
            if self._is_ready(port, deadline):
                return
            deadline.sleep()
