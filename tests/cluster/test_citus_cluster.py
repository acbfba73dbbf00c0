"""The cluster itself: a coordinator and two workers, each with citus and pgvector."""

from __future__ import annotations

import asyncpg

from memsvc.config import Settings
from tests.cluster.node_faults import kill_worker_node_and_start_it_again
from tools.clusters.citus import CitusCluster


async def test_coordinator_knows_two_active_workers(settings: Settings) -> None:
    conn = await asyncpg.connect(settings.pg_dsn)
    try:
        workers = await conn.fetch(
            "SELECT nodename, nodeport FROM pg_dist_node"
            " WHERE groupid <> 0 AND isactive AND noderole = 'primary'"
        )
        assert len(workers) == 2
        assert await conn.fetchval("SELECT citus_is_coordinator()")
    finally:
        await conn.close()


async def test_every_node_has_citus_and_pgvector(settings: Settings) -> None:
    conn = await asyncpg.connect(settings.pg_dsn)
    try:
        rows = await conn.fetch(
            "SELECT nodeid, success, result FROM run_command_on_all_nodes("
            "$$SELECT string_agg(extname, ',' ORDER BY extname) FROM pg_extension"
            " WHERE extname IN ('citus', 'vector', 'pg_trgm')$$)"
        )
    finally:
        await conn.close()
    assert len(rows) == 3
    assert all(r["success"] and r["result"] == "citus,pg_trgm,vector" for r in rows), rows


async def test_vectors_are_compared_on_the_workers(settings: Settings) -> None:
    """pgvector's operators run inside the shards (the dense leg's distance is computed there)."""
    conn = await asyncpg.connect(settings.pg_dsn)
    try:
        rows = await conn.fetch(
            "SELECT success, result FROM run_command_on_workers("
            "$$SELECT '[1,0]'::vector <=> '[0,1]'::vector$$)"
        )
    finally:
        await conn.close()
    assert [(r["success"], float(r["result"])) for r in rows] == [(True, 1.0), (True, 1.0)]


def test_nodes_are_supervised_children(citus_cluster: CitusCluster | None) -> None:
    if citus_cluster is None:  # MEMSVC_CITUS_DSN: not ours to inspect
        return
    nodes = [citus_cluster.coordinator, *citus_cluster.workers]
    assert all(node.is_running() and node.pid is not None for node in nodes)
    assert len({node.port for node in nodes}) == 3


def test_a_killed_worker_node_starts_again(citus_cluster: CitusCluster | None) -> None:
    """A worker node SIGKILLed (its postmaster's group, as in a crash) starts again on its
    port and serves the coordinator's shards (bench/chaos.py --citus kills one): its start
    found citus, vector and pg_trgm already there and refused to go on ("CREATE EXTENSION
    IF NOT EXISTS pg_trgm": operation is not allowed on this node)."""
    if citus_cluster is None:  # MEMSVC_CITUS_DSN: not ours to kill
        return
    worker = citus_cluster.workers[0]
    port, pid = worker.port, worker.pid
    kill_worker_node_and_start_it_again(citus_cluster)
    assert worker.port == port and worker.pid not in (None, pid)
