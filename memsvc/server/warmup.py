"""Run the read path once before the server serves.

A fresh process pays one-time costs on its first reads: every pooled connection prepares the
leg statements (PostgreSQL parses and plans them; a table lock held by a migration blocks
that step too), metrics create their labelled series, lazy caches fill. On a fresh server
they (with asyncpg's timeout then firing at the budget's end, see ``retrieval/sources.py``)
woke the first Recall's leg runner 10-16 ms late, past the default deadline margin: a 500 ms
call whose legs were blocked by a table lock was answered ``DEADLINE_EXCEEDED``.

So before the port serves: a Redis ping opens the cache's connection (outside the cache's
failure breaker: a first GET that also has to connect can outlast the 50 ms Redis timeout on
a busy start, and would then bypass the cache for the next second; it also finds out whether
the server is a cluster node, and then reads the cluster's slot map); every open pooled
connection runs both legs' statements for the default kinds once (which prepares them
there); then one Recall and one Prefetch run end to end. All for a scope no caller can hold
(reads only: nothing is found, nothing is written or cached).
They never call the embedder (the Recalls carry a vector, the Prefetch has no hint; the
local model runs its first inference when it loads): a slow or stalled embedder must not
hold up the start. A failure here is logged and ignored; warming is an optimisation, never
a reason not to start.
"""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg
import numpy as np
import numpy.typing as npt
from asyncpg.pool import PoolConnectionProxy

from memsvc.cache.client import CacheClient
from memsvc.concurrency.deadline import Budget
from memsvc.prefetch.model import PrefetchQuery
from memsvc.prefetch.service import PrefetchService
from memsvc.retrieval.dense import dense_hits
from memsvc.retrieval.lexical import lexical_hits
from memsvc.retrieval.query import DEFAULT_KINDS, Mode, RecallQuery
from memsvc.retrieval.recall import RecallService
from memsvc.storage.connection import Connection
from memsvc.storage.model import Scope
from memsvc.storage.pool import RELEASE_TIMEOUT_S

log = logging.getLogger(__name__)

# A user id that validation refuses to any caller (leading whitespace): no real data matches.
WARMUP_SCOPE = Scope("memsvc-warmup", " warmup")
WARMUP_TEXT = "what did we talk about last time"
# Each warming read's budget: long enough for a cold statement, short enough that a stalled
# dependency delays start-up by little.
WARMUP_BUDGET_S = 0.2
REDIS_CONNECT_TIMEOUT_S = 1.0
ACQUIRE_TIMEOUT_S = 0.05


async def warm_read_path(
    recall: RecallService | None,
    prefetch: PrefetchService | None,
    *,
    pool: asyncpg.Pool,
    redis: CacheClient | None,
    packet_chars: int,
    dimension: int,
) -> float:
    """Warm the read path; returns the seconds it took."""
    started = time.perf_counter()
    if redis is not None:
        try:
            await redis.run(lambda client: client.ping(), timeout_s=REDIS_CONNECT_TIMEOUT_S)
        except Exception as exc:  # the cache's own breaker deals with a Redis that is down
            log.warning("warming the cache connection failed: %s", type(exc).__name__)
    vector = np.zeros(dimension, dtype=np.float32)
    vector[0] = 1.0
    outcomes: list[object] = []
    if recall is not None:
        # Every open connection at once, each runs both statements; one that a background
        # worker holds is left out rather than waited for.
        held: list[PoolConnectionProxy] = []
        for _ in range(pool.get_size()):
            try:
                held.append(await pool.acquire(timeout=ACQUIRE_TIMEOUT_S))
            except TimeoutError:
                break
        try:
            outcomes += await asyncio.gather(
                *(_prepare_legs(conn, vector) for conn in held), return_exceptions=True
            )
        finally:
            for conn in held:
                # Not asyncpg's default budget, the acquire's 50 ms: a statement cancelled
                # by its timeout waits for the server to acknowledge the cancel, which on
                # a loaded machine (or through a Citus coordinator) takes longer, and a
                # release that times out raises here and failed the server's start.
                try:
                    await pool.release(conn, timeout=RELEASE_TIMEOUT_S)
                except Exception as exc:  # asyncpg terminated the connection: warming goes on
                    log.warning("warming: a connection was not released cleanly: %r", exc)
        query = RecallQuery(
            scope=WARMUP_SCOPE,
            text=WARMUP_TEXT,
            vector=vector,
            top_k=10,
            kinds=tuple(DEFAULT_KINDS),
            mode=Mode.HYBRID,
        )
        outcomes += await asyncio.gather(
            recall.recall(query, Budget(WARMUP_BUDGET_S)), return_exceptions=True
        )
    if prefetch is not None:
        packet = PrefetchQuery(WARMUP_SCOPE, "", "", packet_chars)
        outcomes += await asyncio.gather(
            prefetch.prefetch(packet, Budget(WARMUP_BUDGET_S)), return_exceptions=True
        )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            log.warning("warming the read path failed: %s", type(outcome).__name__)
            break
    return time.perf_counter() - started


async def _prepare_legs(conn: Connection, vector: npt.NDArray[np.float32]) -> None:
    """Both legs' statements for the default kinds, run once on ``conn`` (asyncpg keeps them
    prepared there); only the statement text matters, so the values are placeholders."""
    budget = Budget(WARMUP_BUDGET_S)
    await dense_hits(
        conn, WARMUP_SCOPE, vector, DEFAULT_KINDS, model_id="", limit=1, exact_max_rows=0,
        as_of=None, budget=budget,
    )  # fmt: skip
    await lexical_hits(
        conn, WARMUP_SCOPE, WARMUP_TEXT, DEFAULT_KINDS, limit=1, exact_max_rows=0,
        as_of=None, budget=budget,
    )  # fmt: skip
