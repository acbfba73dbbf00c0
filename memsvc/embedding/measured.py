"""An Embedder that records the latency, texts and failures of each call, by model and caller."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from memsvc.embedding.base import Embedder, EmbeddingError, EmbeddingTimeout, WrappedEmbedder
from memsvc.observability import metrics


class MeasuredEmbedder(WrappedEmbedder):
    """Wraps one embedder for one caller (``where``: query, write, extraction, reconcile).

    The runtime wraps the same backend once per caller, so one histogram shows whether query
    embeddings are slow because extraction batches share the model. The wrapped embedder
    belongs to whoever built it: :meth:`aclose` leaves it open.
    """

    def __init__(self, inner: Embedder, where: str) -> None:
        super().__init__(inner)
        self._where = where

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inner!r}, where={self._where!r})"

    async def embed(
        self, texts: Sequence[str], *, timeout_s: float | None = None
    ) -> npt.NDArray[np.float32]:
        model = self._inner.model_id
        started = time.perf_counter()
        try:
            vectors = await self._inner.embed(texts, timeout_s=timeout_s)
        except EmbeddingTimeout:
            metrics.EMBED_FAILURES.labels(model, self._where, "timeout").inc()
            raise
        except EmbeddingError:
            metrics.EMBED_FAILURES.labels(model, self._where, "failed").inc()
            raise
        metrics.EMBED_SECONDS.labels(model, self._where).observe(time.perf_counter() - started)
        metrics.EMBED_TEXTS.labels(model, self._where).inc(len(vectors))
        return vectors
