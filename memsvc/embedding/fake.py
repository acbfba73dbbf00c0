"""A deterministic, model-free embedder for unit tests of pure logic; never a default."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from memsvc.embedding.base import EmbeddingError, as_text_list, l2_normalise

_WORD = re.compile(r"\w+")


class DeterministicFakeEmbedder:
    """Hashes each lower-cased word into one of ``dimension`` buckets (bag of words).

    Texts that share words get a positive cosine, texts that share none get
    (almost always) zero, and the same text always gets the same vector in every
    process. It knows nothing about meaning: use it only where a test is about
    the logic around embeddings. It is never a default and the factory cannot
    build it, so a misconfigured server fails instead of silently serving noise.
    """

    def __init__(self, dimension: int = 64, *, model_id: str = "fake-bag-of-words") -> None:
        if dimension < 1:
            raise ValueError(f"dimension must be >= 1, got {dimension}")
        self._dimension = dimension
        self._model_id = model_id
        self._closed = False
        #: Every batch passed to :meth:`embed`, for tests that count calls.
        self.calls: list[list[str]] = []

    @property
    def model_id(self) -> str:
        """The configured fake vector-space id."""
        return self._model_id

    @property
    def dimension(self) -> int:
        """The configured vector length."""
        return self._dimension

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dimension={self._dimension}, model_id={self._model_id!r})"

    async def embed(
        self, texts: Sequence[str], *, timeout_s: float | None = None
    ) -> npt.NDArray[np.float32]:
        """Embed ``texts`` instantly; ``timeout_s`` is accepted and ignored."""
        items = as_text_list(texts)
        if self._closed:
            raise EmbeddingError("the fake embedder is closed")
        self.calls.append(items)
        counts = np.zeros((len(items), self._dimension), dtype=np.float32)
        for row, text in enumerate(items):
            for word in _WORD.findall(text.lower()):
                # blake2b, not hash(): str hashes are salted per process.
                digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
                counts[row, int.from_bytes(digest, "little") % self._dimension] += 1.0
        return l2_normalise(counts)

    async def aclose(self) -> None:
        """Mark closed; later calls raise EmbeddingError."""
        self._closed = True
