"""Run the read path once before the server serves.

A fresh process pays one-time costs on its first reads: every pooled connection prepares the
leg statements (PostgreSQL parses and plans them; a table lock held by a migration blocks
that step too), metrics create their labelled series, lazy caches fill. On a fresh server
they (with asyncpg's timeout then firing at the budget's end, see ``retrieval/sources.py``)
woke the first Recall's leg runner 10-16 ms late, past the default deadline margin: a 500 ms
call whose legs were blocked by a table lock was answered ``DEADLINE_EXCEEDED``.

So before the port serves: a Redis ping opens the cache's connection (outside the cache's
failure breaker: a first GET that also has to connect can outlast the 50 ms Redis timeout on
a busy start, and would then bypass the cache for the next second), Recalls run over the
pool's open connections, then one Prefetch, for a scope no caller can hold (reads only:
nothing is found, nothing is written or cached).
They never call the embedder (the Recalls carry a vector, the Prefetch has no hint; the
local model runs its first inference when it loads): a slow or stalled embedder must not
hold up the start. A failure here is logged and ignored; warming is an optimisation, never
a reason not to start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

import numpy as np
from redis.asyncio import Redis

from memsvc.deadline import Budget
from memsvc.memories.model import Scope
from memsvc.prefetch.model import PrefetchQuery
from memsvc.prefetch.service import PrefetchService
from memsvc.retrieval.query import DEFAULT_KINDS, Mode, RecallQuery
from memsvc.retrieval.recall import RecallService

log = logging.getLogger(__name__)

# A user id that validation refuses to any caller (leading whitespace): no real data matches.
WARMUP_SCOPE = Scope("memsvc-warmup", " warmup")
WARMUP_TEXT = "what did we talk about last time"
# Each warming read's budget: long enough for a cold statement, short enough that a stalled
# dependency delays start-up by little.
WARMUP_BUDGET_S = 0.2
REDIS_CONNECT_TIMEOUT_S = 1.0


async def warm_read_path(
    recall: RecallService | None,
    prefetch: PrefetchService | None,
    *,
    redis: Redis | None,
    connections: int,
    packet_chars: int,
    dimension: int,
) -> float:
    """Warm the read path; returns the seconds it took."""
    started = time.perf_counter()
    if redis is not None:
        try:
            async with asyncio.timeout(REDIS_CONNECT_TIMEOUT_S):
                await redis.ping()
        except Exception as exc:  # the cache's own breaker deals with a Redis that is down
            log.warning("warming the cache connection failed: %s", type(exc).__name__)
    reads: list[Coroutine[Any, Any, object]] = []
    if recall is not None:
        vector = np.zeros(dimension, dtype=np.float32)
        vector[0] = 1.0
        query = RecallQuery(
            scope=WARMUP_SCOPE,
            text=WARMUP_TEXT,
            vector=vector,
            top_k=10,
            kinds=tuple(DEFAULT_KINDS),
            mode=Mode.HYBRID,
        )
        # A hybrid Recall holds two connections at once: together these touch each open one.
        reads += [
            recall.recall(query, Budget(WARMUP_BUDGET_S)) for _ in range(max(1, connections // 2))
        ]
    outcomes = await asyncio.gather(*reads, return_exceptions=True)
    if prefetch is not None:
        # After the Recalls, on a quiet loop: its cache read must not look like an outage.
        packet = PrefetchQuery(WARMUP_SCOPE, "", "", packet_chars)
        outcomes += await asyncio.gather(
            prefetch.prefetch(packet, Budget(WARMUP_BUDGET_S)), return_exceptions=True
        )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            log.warning("warming the read path failed: %s", type(outcome).__name__)
            break
    return time.perf_counter() - started
