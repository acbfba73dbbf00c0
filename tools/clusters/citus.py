"""A Citus cluster on one machine: a coordinator and workers, each a supervised PostgreSQL.

Each node is an EmbeddedPostgres run from a PostgreSQL install with Citus (citus_build),
with `shared_preload_libraries=citus`, and citus, vector and pg_trgm created in memsvc's
database. The coordinator registers itself and adds the workers, so memsvc (pointed at the
coordinator's DSN) sees one database whose distributed tables live on the workers. Nothing
is registered globally: whoever calls start() (or enters the context) must call stop().
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from memsvc.embedded.postgres import EmbeddedPostgres
from memsvc.embedded.process import Deadline

# citus first: its objects must exist before the extensions it propagates to the workers.
CITUS_EXTENSIONS = ("citus", "vector", "pg_trgm")


def _node_settings() -> dict[str, str]:
    return {
        "shared_preload_libraries": "citus",
        # The embedded PostgreSQL is built without OpenSSL: plain connections between nodes
        # (all on localhost here).
        "citus.node_conninfo": "sslmode=disable",
        # Each node runs Citus' maintenance daemon and its own pools to the other nodes.
        "max_worker_processes": "16",
    }


class CitusCluster:
    """A coordinator and `workers` workers under `data_dir` (one folder each), stopped in
    reverse order; a context manager yielding the coordinator's DSN."""

    def __init__(
        self,
        data_dir: Path,
        bin_dir: Path,
        *,
        workers: int = 2,
        host: str = "127.0.0.1",
        durable: bool = False,
    ) -> None:
        data_dir = Path(data_dir)

        def node(name: str) -> EmbeddedPostgres:
            return EmbeddedPostgres(
                data_dir / name,
                host=host,
                durable=durable,
                bin_dir=bin_dir,
                settings=_node_settings(),
                extensions=CITUS_EXTENSIONS,
            )

        self._coordinator = node("coordinator")
        self._workers = [node(f"worker{i + 1}") for i in range(workers)]

    @property
    def coordinator(self) -> EmbeddedPostgres:
        """The node memsvc connects to."""
        return self._coordinator

    @property
    def workers(self) -> list[EmbeddedPostgres]:
        """The nodes holding the shards."""
        return list(self._workers)

    @property
    def dsn(self) -> str:
        """The coordinator's DSN."""
        return self._coordinator.dsn

    def start(self, timeout_s: float = 120.0) -> str:
        """Start every node, join the workers to the coordinator, and return its DSN."""
        deadline = Deadline(timeout_s)
        started: list[EmbeddedPostgres] = []
        try:
            for node in (*self._workers, self._coordinator):
                node.start(deadline.remaining())
                started.append(node)
            self._join(deadline)
        except BaseException:
            for node in reversed(started):
                node.stop()
            raise
        return self.dsn

    def _join(self, deadline: Deadline) -> None:
        """Register the coordinator and add the workers; both are no-ops once done (restart)."""
        coordinator = self._coordinator
        statements = [
            f"SELECT citus_set_coordinator_host('{coordinator.host}', {coordinator.port});",
            *(
                f"SELECT citus_add_node('{worker.host}', {worker.port});"
                for worker in self._workers
            ),
        ]
        coordinator.psql(" ".join(statements), deadline)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the coordinator first (no new distributed work), then the workers, even if one
        of them fails to stop."""
        errors: list[BaseException] = []
        for node in (self._coordinator, *reversed(self._workers)):
            try:
                node.stop(timeout_s)
            except Exception as exc:  # every node must get its stop
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
