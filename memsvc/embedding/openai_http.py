"""Embeddings from any OpenAI-compatible ``/v1/embeddings`` endpoint, over memsvc's HTTP client."""

from __future__ import annotations

import ssl
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import orjson

from memsvc.embedding.base import EmbeddingError, EmbeddingTimeout, as_text_list, l2_normalise
from memsvc.http import HTTPError, HTTPTimeout, JSONClient

_PATH = "/embeddings"


class OpenAIHTTPEmbedder:
    """Calls ``POST <base_url>/embeddings`` with ``{"model": ..., "input": [...]}``.

    ``base_url`` follows the OpenAI SDKs (``https://api.openai.com/v1``); a bare
    ``http://host:port`` means ``/v1/embeddings``. ``api_key``, when given, is
    sent as ``Authorization: Bearer`` and never appears in ``repr`` or errors.
    ``timeout_s`` caps every call; a caller's smaller ``timeout_s`` wins.
    Connections, limits and redaction are :class:`memsvc.http.JSONClient`'s.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        dimension: int,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        max_connections: int = 8,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if dimension < 1:
            raise ValueError(f"dimension must be >= 1, got {dimension}")
        if not model:
            raise ValueError("model must not be empty")
        self._http = JSONClient(
            base_url,
            api_key=api_key,
            timeout_s=timeout_s,
            max_connections=max_connections,
            ssl_context=ssl_context,
        )
        self._url = self._http.url_for(_PATH)
        self._model = model
        self._dimension = dimension

    @property
    def model_id(self) -> str:
        """The remote model's name, which names its vector space."""
        return self._model

    @property
    def dimension(self) -> int:
        """The configured vector length; replies of any other length are errors."""
        return self._dimension

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(url={self._url!r}, model={self._model!r}, "
            f"dimension={self._dimension})"
        )

    async def embed(
        self, texts: Sequence[str], *, timeout_s: float | None = None
    ) -> npt.NDArray[np.float32]:
        """Embed ``texts`` in one request within ``min(timeout_s, the configured timeout)``."""
        items = as_text_list(texts)
        if self._http.closed:
            raise EmbeddingError("the HTTP embedder is closed")
        if not items:
            # The OpenAI API rejects an empty input list; there is nothing to ask anyway.
            return np.zeros((0, self._dimension), dtype=np.float32)
        body = orjson.dumps({"model": self._model, "input": items})
        try:
            payload = await self._http.post_json(_PATH, body, timeout_s=timeout_s)
        except HTTPTimeout as exc:
            raise EmbeddingTimeout(f"embedding endpoint {exc}") from exc
        except HTTPError as exc:  # non-2xx answers included
            raise EmbeddingError(f"embedding endpoint {exc}") from exc
        return self._parse(payload, len(items))

    async def aclose(self) -> None:
        """Close the HTTP connections; idempotent."""
        await self._http.aclose()

    def _parse(self, payload: bytes, count: int) -> npt.NDArray[np.float32]:
        where = f"embedding endpoint {self._url}"
        try:
            document = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise EmbeddingError(f"{where} returned invalid JSON: {exc}") from exc
        data = document.get("data") if isinstance(document, dict) else None
        if not isinstance(data, list) or len(data) != count:
            got = f"{len(data)} items" if isinstance(data, list) else "no 'data' list"
            raise EmbeddingError(f"{where} returned {got} for {count} inputs")
        out = np.empty((count, self._dimension), dtype=np.float32)
        seen = [False] * count
        for position, item in enumerate(data):
            if not isinstance(item, dict):
                raise EmbeddingError(f"{where} returned a non-object in 'data'")
            index = item.get("index", position)
            vector = item.get("embedding")
            if type(index) is not int or not 0 <= index < count or seen[index]:
                raise EmbeddingError(f"{where} returned a bad or repeated index {index!r}")
            if not isinstance(vector, list):
                raise EmbeddingError(f"{where} returned no float list for input {index}")
            if len(vector) != self._dimension:
                raise EmbeddingError(
                    f"{where} model {self._model!r} returned {len(vector)}-dimensional "
                    f"vectors, but the embedder is configured for {self._dimension}; "
                    "fix the configured dimension (stored vectors must all share one)"
                )
            try:
                out[index] = vector
            except (TypeError, ValueError) as exc:
                raise EmbeddingError(f"{where} returned non-numeric values: {exc}") from exc
            seen[index] = True
        if not np.isfinite(out).all():
            raise EmbeddingError(f"{where} returned non-finite values")
        return l2_normalise(out)
