"""Embeddings from any OpenAI-compatible ``/v1/embeddings`` endpoint, over memsvc's HTTP client."""

from __future__ import annotations

import ssl
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import orjson

from memsvc.embedding.base import EmbeddingError, EmbeddingTimeout, as_text_list, l2_normalise
from memsvc.http import HTTPClient, HTTPError, HTTPTimeout

_PATH = "/embeddings"


class OpenAIHTTPEmbedder:
    """Calls ``POST <base_url>/embeddings`` with ``{"model": ..., "input": [...]}``.

    ``base_url`` follows the OpenAI SDKs (``https://api.openai.com/v1``); a bare
    ``http://host:port`` means ``/v1/embeddings``. ``api_key``, when given, is
    sent as ``Authorization: Bearer`` and never appears in ``repr`` or errors.
    ``timeout_s`` caps every call; a caller's smaller ``timeout_s`` wins.

    Keep-alive connections (at most ``max_connections``, which also caps
    concurrent requests) are reused; one that saw a failure, a timeout or a
    cancellation is dropped, never reused (see :class:`memsvc.http.HTTPClient`).
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
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if not model:
            raise ValueError("model must not be empty")
        if api_key is not None and (not api_key or not api_key.isprintable()):
            # Checked here so a stray newline cannot inject headers later; the
            # message deliberately does not echo the key.
            raise ValueError("api_key must be a non-empty string of printable characters")
        self._http = HTTPClient(
            base_url,
            timeout_s=timeout_s,
            max_connections=max_connections,
            ssl_context=ssl_context,
            bearer_token=api_key,
            default_path="/v1",
        )
        self._url = self._http.url_for(_PATH)
        self._model = model
        self._dimension = dimension
        self._closed = False

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
        if self._closed:
            raise EmbeddingError("the HTTP embedder is closed")
        if not items:
            # The OpenAI API rejects an empty input list; there is nothing to ask anyway.
            return np.zeros((0, self._dimension), dtype=np.float32)
        body = orjson.dumps({"model": self._model, "input": items})
        try:
            status, payload = await self._http.post_json(_PATH, body, timeout_s=timeout_s)
        # Chained to the root cause (TimeoutError, OSError, ...) rather than to the
        # client's wrapper, whose message is already carried over in full.
        except HTTPTimeout as exc:
            raise EmbeddingTimeout(f"embedding endpoint {exc}") from exc.__cause__
        except HTTPError as exc:
            raise EmbeddingError(f"embedding endpoint {exc}") from (exc.__cause__ or exc)
        if not 200 <= status < 300:
            excerpt = self._http.excerpt(payload)
            raise EmbeddingError(
                f"embedding endpoint {self._url} answered HTTP {status}: {excerpt}"
            )
        return self._parse(payload, len(items))

    async def aclose(self) -> None:
        """Close idle connections; in-flight requests close theirs when they end."""
        self._closed = True
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
