"""The Embedder protocol every embedding backend implements: its errors and output contract."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt


class EmbeddingError(Exception):
    """The embedding backend failed or is unreachable (the server answers UNAVAILABLE)."""


class EmbeddingTimeout(EmbeddingError):
    """The embedding call did not finish within its time budget."""


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of a fixed dimension.

    ``model_id`` names the vector space: vectors from different model ids must
    never be compared, so stores record it next to every vector.
    """

    @property
    def model_id(self) -> str:
        """Identifier of the vector space these embeddings live in."""
        ...

    @property
    def dimension(self) -> int:
        """Length of every vector."""
        ...

    async def embed(
        self, texts: Sequence[str], *, timeout_s: float | None = None
    ) -> npt.NDArray[np.float32]:
        """Embed ``texts`` into a ``(len(texts), dimension)`` float32 array, rows L2-normalised.

        ``timeout_s`` is the caller's remaining budget (``None``: the backend's
        own default, if any). Raises :class:`EmbeddingTimeout` when it runs out
        and :class:`EmbeddingError` for any other backend failure.
        """
        ...

    async def aclose(self) -> None:
        """Release threads, sessions and connections; idempotent."""
        ...


class WrappedEmbedder:
    """An embedder around another one (measured, fair): the model and dimension are the
    wrapped one's, and the wrapped embedder belongs to whoever built it, so :meth:`aclose`
    leaves it open. Subclasses give ``embed``."""

    def __init__(self, inner: Embedder) -> None:
        self._inner = inner

    @property
    def model_id(self) -> str:
        return self._inner.model_id

    @property
    def dimension(self) -> int:
        return self._inner.dimension

    async def aclose(self) -> None:
        """The wrapped embedder is closed by its owner (the runtime's exit stack)."""


def as_text_list(texts: Sequence[str]) -> list[str]:
    """Copy ``texts`` to a list, rejecting a bare ``str`` (a Sequence[str] of characters)."""
    # A lone string type-checks as Sequence[str] and would embed one vector per
    # character; that is always a caller bug, so fail loudly instead.
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of texts, not a single str")
    items = list(texts)
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"embed() texts must be str, got {type(item).__name__}")
    return items


def l2_normalise(matrix: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
    """Scale each row to unit L2 norm as float32 (all-zero rows stay zero)."""
    rows = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    # Same epsilon as torch.nn.functional.normalize, which sentence-transformers uses.
    return np.asarray(rows / np.maximum(norms, np.float32(1e-12)), dtype=np.float32)
