"""A Redis Cluster client whose topology refresh survives the caller that started it.

redis-py's ``RedisCluster`` refreshes its map of slots to nodes (CLUSTER SLOTS, then COMMAND
for the key positions: about 25 ms on this machine, more under load) inside the first command
that finds it stale, after a node failed or the client was reset by CLUSTERDOWN. The cache
bounds every command by ``MEMSVC_REDIS_TIMEOUT_MS`` (50 ms) and abandons it then; a refresh
cut short that way is thrown away and restarted by the next command, so on a loaded machine
the client could stay stale forever and the cache bypassed after the cluster recovered. Here
the refresh runs as its own task, bounded by ``TOPOLOGY_TIMEOUT_S``, that callers wait on
(shielded) and may give up on without cancelling it: the next caller finds it done.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio.cluster import RedisCluster

log = logging.getLogger(__name__)

# Bound on one topology refresh: several round trips to live nodes; a dead seed node is
# refused at once, and the client tries it last.
TOPOLOGY_TIMEOUT_S = 2.0


def observe(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned task's outcome so a failure is logged once, never reported by
    asyncio as 'exception was never retrieved'."""
    if task.cancelled():
        return
    if (exc := task.exception()) is not None:
        log.info("abandoned cache operation ended with %s", type(exc).__name__)


class RefreshingCluster(RedisCluster):
    """RedisCluster whose (re)initialization is one shared task per refresh."""

    _refresh: asyncio.Task[None] | None = None

    async def initialize(
        self,
        additional_startup_nodes_info: list[tuple[str, int]] | None = None,
        last_failed_node_name: str | None = None,
    ) -> RefreshingCluster:
        refresh = self._refresh
        if refresh is None or refresh.done():
            refresh = self._refresh = asyncio.ensure_future(
                self._bounded_refresh(additional_startup_nodes_info, last_failed_node_name)
            )
            refresh.add_done_callback(observe)
        await asyncio.shield(refresh)
        return self

    async def _bounded_refresh(
        self,
        additional_startup_nodes_info: list[tuple[str, int]] | None,
        last_failed_node_name: str | None,
    ) -> None:
        async with asyncio.timeout(TOPOLOGY_TIMEOUT_S):
            await super().initialize(additional_startup_nodes_info, last_failed_node_name)

    async def close_for_good(self) -> None:
        """Close for good: stop a running refresh, then close the connections. (Not aclose:
        redis-py calls that itself to reset the client after CLUSTERDOWN, while callers may
        be waiting on the refresh.)"""
        refresh, self._refresh = self._refresh, None
        if refresh is not None and not refresh.done():
            refresh.cancel()
            await asyncio.gather(refresh, return_exceptions=True)
        await super().aclose()
