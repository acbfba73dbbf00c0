"""Query embeddings through a bounded in-process LRU (a repeated query skips the model).

Keyed by tenant as well as model and text: a hit answers in microseconds where the model
takes milliseconds (Recall reports ``timings.embed_ms``), so a cache shared by tenants would
tell tenant A that tenant B asked the same text. Within a tenant the hit is the point.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from memsvc.embedding import Embedder
from memsvc.embedding.base import EmbeddingTimeout
from memsvc.observability import tracing

Vector = npt.NDArray[np.float32]


class EmbeddingLRU:
    """At most ``capacity`` vectors, least recently used evicted first. Not thread-safe: it
    lives on the event loop, like its callers."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        self._items: OrderedDict[tuple[str, str, str], Vector] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: tuple[str, str, str]) -> bool:
        """Whether (tenant_id, model_id, text) is held; counts neither a hit nor a miss."""
        return key in self._items

    def get(self, tenant_id: str, model_id: str, text: str) -> Vector | None:
        key = (tenant_id, model_id, text)
        vector = self._items.get(key)
        if vector is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return vector

    def put(self, tenant_id: str, model_id: str, text: str, vector: Vector) -> None:
        if self._capacity == 0:
            return
        frozen = np.array(vector, dtype=np.float32, copy=True)
        # Shared between calls: nobody may change a cached vector in place.
        frozen.setflags(write=False)
        key = (tenant_id, model_id, text)
        self._items[key] = frozen
        self._items.move_to_end(key)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)


@dataclass
class _Request:
    tenant_id: str
    text: str
    future: asyncio.Future[Vector]
    deadline: float


class QueryEmbedder:
    """Embeds query texts: the LRU first, then the model, in micro-batches, with admission.

    Micro-batches: while a batch runs, new queries queue and go together in the next one
    (up to ``max_batch``). An idle embedder starts a query at once, so this adds no latency;
    under load one padded batch costs less than as many single runs. A batch cannot be
    interrupted and every query in it waits for the whole, so ``max_batch`` stays small:
    measured for the int8 MiniLM on one core of an Intel Xeon (2 cores), 501 texts/s one by
    one, 606 in batches of 8 (13 ms each), 583 in batches of 32 (55 ms each, and over 100 ms
    with the core shared under overload, where the first queries of a burst then answered
    near their 200 ms deadline).

    Admission: from a moving average of the cost per text and the number queued or running,
    it knows when a new query could not be embedded within the caller's timeout and refuses
    it at once (EmbeddingTimeout). Under overload a Recall then answers quickly from the
    lexical leg instead of waiting out its deadline for a vector, and the model's time goes to
    queries that can still use it. A caller that gives up leaves the queue (its text is not
    embedded); one already in a running batch just ignores the result.
    """

    # Weight of the newest observation in the moving average.
    EWMA_ALPHA = 0.1

    # Past 8 texts a batch is no faster per text, only longer (the figures above).
    MAX_BATCH = 8

    def __init__(
        self, embedder: Embedder, cache: EmbeddingLRU, *, max_batch: int = MAX_BATCH
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._embedder = embedder
        self._cache = cache
        self._max_batch = max_batch
        self._queue: list[_Request] = []
        self._running = 0
        self._drainer: asyncio.Task[None] | None = None
        self._per_text_s: float | None = None
        self.refused = 0
        self.batches = 0

    @property
    def model_id(self) -> str:
        return self._embedder.model_id

    @property
    def dimension(self) -> int:
        return self._embedder.dimension

    def cached(self, tenant_id: str, text: str) -> Vector | None:
        """The tenant's cached vector of ``text`` (another tenant's never counts)."""
        return self._cache.get(tenant_id, self._embedder.model_id, text)

    def expected_wait_s(self) -> float:
        """Time a new query is expected to take, queue included (0 before any sample)."""
        if self._per_text_s is None:
            return 0.0
        return (len(self._queue) + self._running + 1) * self._per_text_s

    def admits(self, tenant_id: str, text: str, within_s: float) -> bool:
        """Whether ``text``'s vector can be had within ``within_s``: it is cached, or the
        queue ahead of it is expected to clear in time. Decided on a call's arrival: a query
        that would only wait for the model is better answered from the lexical leg at once
        than embedded too late (and the model's time goes to queries that can use it)."""
        if (tenant_id, self._embedder.model_id, text) in self._cache:
            return True
        return self.expected_wait_s() <= within_s

    async def embed(self, tenant_id: str, text: str, *, timeout_s: float) -> Vector:
        """The query's vector for the tenant; EmbeddingTimeout past ``timeout_s`` (or at once
        when the queue says it would be), EmbeddingError when the model fails."""
        vector = self.cached(tenant_id, text)
        if vector is not None:
            return vector
        with tracing.span("memsvc.embed", queued=len(self._queue)):
            return await self._embed(tenant_id, text, timeout_s)

    async def _embed(self, tenant_id: str, text: str, timeout_s: float) -> Vector:
        if self.expected_wait_s() > timeout_s:
            self.refused += 1
            raise EmbeddingTimeout("the embedder's queue would not clear within the budget")
        loop = asyncio.get_running_loop()
        request = _Request(tenant_id, text, loop.create_future(), time.monotonic() + timeout_s)
        self._queue.append(request)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name="query-embedder")
        try:
            async with asyncio.timeout(timeout_s):
                return await request.future
        except TimeoutError as exc:
            raise EmbeddingTimeout(f"query embedding took longer than {timeout_s:.3f} s") from exc
        finally:
            if not request.future.done():
                request.future.cancel()
            elif not request.future.cancelled():
                # Failed just as this caller was cancelled: retrieve the error, or asyncio
                # logs "Future exception was never retrieved".
                request.future.exception()
            if request in self._queue:
                self._queue.remove(request)

    async def _drain(self) -> None:
        while self._queue:
            batch = [r for r in self._queue[: self._max_batch] if not r.future.done()]
            del self._queue[: self._max_batch]
            if not batch:
                continue
            self._running = len(batch)
            started = time.monotonic()
            try:
                vectors = await self._embedder.embed(
                    [r.text for r in batch],
                    timeout_s=max(max(r.deadline for r in batch) - started, 0.001),
                )
            except Exception as exc:
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(exc)
                continue
            finally:
                self._running = 0
            sample = (time.monotonic() - started) / len(batch)
            previous = self._per_text_s
            self._per_text_s = (
                sample if previous is None else previous + self.EWMA_ALPHA * (sample - previous)
            )
            self.batches += 1
            for r, vector in zip(batch, vectors, strict=True):
                self._cache.put(r.tenant_id, self._embedder.model_id, r.text, vector)
                if not r.future.done():
                    r.future.set_result(vector)
