"""Query embeddings through a bounded in-process LRU (a repeated query skips the model)."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

import numpy as np
import numpy.typing as npt

from memsvc.embedding import Embedder
from memsvc.embedding.base import EmbeddingTimeout

Vector = npt.NDArray[np.float32]


class EmbeddingLRU:
    """At most ``capacity`` vectors, least recently used evicted first. Not thread-safe: it
    lives on the event loop, like its callers."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        self._items: OrderedDict[tuple[str, str], Vector] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, model_id: str, text: str) -> Vector | None:
        key = (model_id, text)
        vector = self._items.get(key)
        if vector is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return vector

    def put(self, model_id: str, text: str, vector: Vector) -> None:
        if self._capacity == 0:
            return
        frozen = np.array(vector, dtype=np.float32, copy=True)
        # Shared between calls: nobody may change a cached vector in place.
        frozen.setflags(write=False)
        key = (model_id, text)
        self._items[key] = frozen
        self._items.move_to_end(key)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)


class QueryEmbedder:
    """Embeds one query text, consulting the LRU first (keyed by model id and exact text).

    It also refuses work that cannot finish in time: it tracks the embeddings in flight and
    a moving average of the time each one costs, and when the queue ahead would outlast the
    caller's timeout it fails at once with EmbeddingTimeout. Under overload that turns a
    call that would have waited out its whole deadline for a vector into a quick answer
    from the lexical leg, and keeps the model's time for queries that can still use it.
    """

    # Weight of the newest observation in the moving average.
    EWMA_ALPHA = 0.1

    def __init__(self, embedder: Embedder, cache: EmbeddingLRU) -> None:
        self._embedder = embedder
        self._cache = cache
        self._in_flight = 0
        self._per_embed_s: float | None = None
        self.refused = 0

    @property
    def model_id(self) -> str:
        return self._embedder.model_id

    @property
    def dimension(self) -> int:
        return self._embedder.dimension

    def cached(self, text: str) -> Vector | None:
        return self._cache.get(self._embedder.model_id, text)

    def expected_wait_s(self) -> float:
        """Time a new embedding is expected to take, queue included (0 before any sample)."""
        if self._per_embed_s is None:
            return 0.0
        return (self._in_flight + 1) * self._per_embed_s

    async def embed(self, text: str, *, timeout_s: float) -> Vector:
        """The query's vector; EmbeddingTimeout past ``timeout_s`` (or when the queue says it
        would be), EmbeddingError on failure."""
        vector = self.cached(text)
        if vector is not None:
            return vector
        if self.expected_wait_s() > timeout_s:
            self.refused += 1
            raise EmbeddingTimeout("the embedder's queue would not clear within the budget")
        ahead = self._in_flight
        self._in_flight += 1
        started = time.monotonic()
        try:
            # Backends take the timeout too; this bound holds even for one that ignores it.
            async with asyncio.timeout(timeout_s):
                vectors = await self._embedder.embed([text], timeout_s=timeout_s)
        except TimeoutError as exc:
            raise EmbeddingTimeout(f"query embedding took longer than {timeout_s:.3f} s") from exc
        finally:
            self._in_flight -= 1
        # The wall time covered the embeddings ahead of this one too.
        sample = (time.monotonic() - started) / (ahead + 1)
        previous = self._per_embed_s
        self._per_embed_s = (
            sample if previous is None else previous + self.EWMA_ALPHA * (sample - previous)
        )
        fresh: Vector = vectors[0]
        self._cache.put(self._embedder.model_id, text, fresh)
        return fresh
