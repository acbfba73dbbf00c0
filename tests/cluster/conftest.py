"""Cluster session: memsvc on a Citus coordinator with two workers (make test-cluster).

Overrides the suite's ``backing_urls``: PostgreSQL is the coordinator of a cluster this
session starts from a PostgreSQL with Citus (tools.clusters.citus_build: CITUS_PG_BIN, or a
cached build of CITUS_SOURCE), or MEMSVC_CITUS_DSN, the coordinator of a running Citus; valkey
is an embedded one (or MEMSVC_REDIS_URL). Every other fixture (server, pool, new_caller) is
the suite's own, so these tests run memsvc exactly as the single-server tests do. Without
Citus the session fails and says what to set: it never skips.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from memsvc.embedded.valkey import EmbeddedValkey
from tools.clusters.citus import CitusCluster
from tools.clusters.citus_build import citus_bin_dir


@pytest.fixture(scope="session")
def citus_cluster() -> Iterator[CitusCluster | None]:
    """The cluster this session started (None with MEMSVC_CITUS_DSN: a cluster of its own)."""
    if os.environ.get("MEMSVC_CITUS_DSN"):
        yield None
        return
    bin_dir = citus_bin_dir()
    with tempfile.TemporaryDirectory(prefix="memsvc-citus-") as tmp:
        cluster = CitusCluster(Path(tmp), bin_dir, workers=2)
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture(scope="session")
def backing_urls(citus_cluster: CitusCluster | None) -> Iterator[tuple[str, str]]:
    """(coordinator DSN, redis URL)."""
    dsn = citus_cluster.dsn if citus_cluster is not None else os.environ["MEMSVC_CITUS_DSN"]
    external_redis = os.environ.get("MEMSVC_REDIS_URL")
    if external_redis:
        yield dsn, external_redis
        return
    with tempfile.TemporaryDirectory(prefix="memsvc-citus-valkey-") as tmp:
        valkey = EmbeddedValkey(Path(tmp), persist=False)
        url = valkey.start()
        try:
            yield dsn, url
        finally:
            valkey.stop()
