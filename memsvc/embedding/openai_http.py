"""Embeddings from any OpenAI-compatible ``/v1/embeddings`` endpoint, over asyncio HTTP/1.1."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt
import orjson

from memsvc.embedding.base import EmbeddingError, EmbeddingTimeout, as_text_list, l2_normalise

# A 2,048-input batch of 3,072-dim vectors is ~130 MB of JSON; anything bigger is a fault.
_MAX_BODY_BYTES = 256 * 1024 * 1024
_MAX_HEADERS = 100
_ERROR_EXCERPT_CHARS = 300


class _ProtocolError(Exception):
    """The server's reply is not well-formed HTTP/1.1."""


class _StaleConnection(Exception):
    """A reused keep-alive connection was closed by the server before it answered."""


@dataclass(frozen=True)
class _Endpoint:
    url: str
    host: str
    port: int
    host_header: str
    target: str
    tls: bool


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    reused: bool = False

    def usable(self) -> bool:
        return not (self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        self.writer.close()


class OpenAIHTTPEmbedder:
    """Calls ``POST <base_url>/embeddings`` with ``{"model": ..., "input": [...]}``.

    ``base_url`` follows the OpenAI SDKs (``https://api.openai.com/v1``); a bare
    ``http://host:port`` means ``/v1/embeddings``. ``api_key``, when given, is
    sent as ``Authorization: Bearer`` and never appears in ``repr`` or errors.
    ``timeout_s`` caps every call; a caller's smaller ``timeout_s`` wins.

    Keep-alive connections (at most ``max_connections``, which also caps
    concurrent requests) are reused; one that saw a failure, a timeout or a
    cancellation is dropped, never reused.
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
        self._endpoint = _parse_base_url(base_url)
        self._model = model
        self._dimension = dimension
        self._api_key = api_key
        self._timeout_s = timeout_s
        self._ssl: ssl.SSLContext | None = None
        if self._endpoint.tls:
            self._ssl = ssl_context if ssl_context is not None else ssl.create_default_context()
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
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
            f"{type(self).__name__}(url={self._endpoint.url!r}, model={self._model!r}, "
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
        budget_s = self._timeout_s if timeout_s is None else min(timeout_s, self._timeout_s)
        body = orjson.dumps({"model": self._model, "input": items})
        where = f"embedding endpoint {self._endpoint.url}"
        try:
            async with asyncio.timeout(budget_s):
                status, payload = await self._post(body)
        # TimeoutError is an OSError subclass, so it must be caught first.
        except TimeoutError as exc:
            raise EmbeddingTimeout(f"{where} did not answer within {budget_s} s") from exc
        except (OSError, EOFError, _ProtocolError) as exc:
            raise EmbeddingError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        if not 200 <= status < 300:
            raise EmbeddingError(f"{where} answered HTTP {status}: {self._excerpt(payload)}")
        return self._parse(payload, len(items))

    async def aclose(self) -> None:
        """Close idle connections; in-flight requests close theirs when they end."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def _post(self, body: bytes) -> tuple[int, bytes]:
        async with self._slots:
            while self._idle:
                conn = self._idle.pop()
                if not conn.usable():
                    conn.close()
                    continue
                try:
                    return await self._exchange(conn, body)
                except _StaleConnection:
                    # The server timed out an idle keep-alive connection just as we
                    # reused it. Nothing was processed, and embedding is idempotent,
                    # so retrying on a fresh connection is safe.
                    break
            conn = await self._connect()
            try:
                return await self._exchange(conn, body)
            except _StaleConnection as exc:
                raise _ProtocolError("server closed the connection without answering") from exc

    async def _connect(self) -> _Connection:
        endpoint = self._endpoint
        reader, writer = await asyncio.open_connection(
            endpoint.host,
            endpoint.port,
            ssl=self._ssl,
            server_hostname=endpoint.host if endpoint.tls else None,
        )
        return _Connection(reader, writer)

    async def _exchange(self, conn: _Connection, body: bytes) -> tuple[int, bytes]:
        reusable = False
        try:
            conn.writer.write(self._request_head(len(body)) + body)
            try:
                await conn.writer.drain()
                status, payload, reusable = await _read_response(conn.reader)
            except (ConnectionError, _StaleConnection) as exc:
                if conn.reused:
                    raise _StaleConnection from exc
                raise
            return status, payload
        finally:
            # Any exit other than a complete, keep-alive reply (errors, timeouts,
            # cancellation) leaves the stream in an unknown state: drop it.
            if reusable and not self._closed:
                conn.reused = True
                self._idle.append(conn)
            else:
                conn.close()

    def _request_head(self, content_length: int) -> bytes:
        lines = [
            f"POST {self._endpoint.target} HTTP/1.1",
            f"Host: {self._endpoint.host_header}",
            "User-Agent: memsvc",
            "Accept: application/json",
            "Content-Type: application/json",
            f"Content-Length: {content_length}",
        ]
        if self._api_key is not None:
            lines.append(f"Authorization: Bearer {self._api_key}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _parse(self, payload: bytes, count: int) -> npt.NDArray[np.float32]:
        where = f"embedding endpoint {self._endpoint.url}"
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

    def _excerpt(self, payload: bytes) -> str:
        text = payload.decode("utf-8", errors="replace")
        with contextlib.suppress(orjson.JSONDecodeError):
            document = orjson.loads(payload)
            if isinstance(document, dict) and isinstance(document.get("error"), dict):
                text = str(document["error"].get("message", text))
        if self._api_key is not None:
            # Some servers echo the credential they rejected.
            text = text.replace(self._api_key, "***")
        text = " ".join(text.split())
        if len(text) > _ERROR_EXCERPT_CHARS:
            text = text[:_ERROR_EXCERPT_CHARS] + "..."
        return text or "(empty body)"


def _parse_base_url(base_url: str) -> _Endpoint:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"base_url must be http:// or https://, got {base_url!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("base_url must not carry credentials; pass api_key instead")
    if not parts.hostname:
        raise ValueError(f"base_url has no host: {base_url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = parts.path.rstrip("/") or "/v1"
    target = f"{path}/embeddings" + (f"?{parts.query}" if parts.query else "")
    return _Endpoint(
        url=f"{parts.scheme}://{parts.netloc}{path}/embeddings",
        host=parts.hostname,
        port=port,
        host_header=parts.netloc,
        target=target,
        tls=parts.scheme == "https",
    )


async def _readline(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readline()
    except ValueError as exc:  # the stream's line-length limit (64 KiB) was exceeded
        raise _ProtocolError("header line too long") from exc


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """Read one reply: (status, body, whether the connection may be reused)."""
    while True:
        status_line = await _readline(reader)
        if not status_line:
            raise _StaleConnection
        fields = status_line.split(None, 2)
        if len(fields) < 2 or not fields[0].startswith(b"HTTP/1.") or not fields[1].isdigit():
            raise _ProtocolError(f"bad status line {status_line[:80]!r}")
        status = int(fields[1])
        headers = await _read_headers(reader)
        if not 100 <= status < 200:  # skip interim replies such as 100 Continue
            break
    keep_alive = fields[0] == b"HTTP/1.1" and "close" not in headers.get("connection", "").lower()
    if status in (204, 304):
        return status, b"", keep_alive
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return status, await _read_chunked(reader), keep_alive
    if "content-length" in headers:
        length_text = headers["content-length"].strip()
        if not length_text.isdigit() or int(length_text) > _MAX_BODY_BYTES:
            raise _ProtocolError(f"bad or oversized Content-Length {length_text[:40]!r}")
        return status, await reader.readexactly(int(length_text)), keep_alive
    # No framing: the body runs to the end of the connection, which then cannot be reused.
    body = await reader.read(_MAX_BODY_BYTES + 1)
    while chunk := await reader.read(_MAX_BODY_BYTES + 1 - len(body)):
        body += chunk
    if len(body) > _MAX_BODY_BYTES:
        raise _ProtocolError("response body too large")
    return status, body, False


async def _read_headers(reader: asyncio.StreamReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADERS + 1):
        line = await _readline(reader)
        if line in (b"\r\n", b"\n"):
            return headers
        if not line.endswith(b"\n"):
            raise _ProtocolError("connection closed inside the headers")
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise _ProtocolError(f"bad header line {line[:80]!r}")
        key = name.strip().lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    raise _ProtocolError(f"more than {_MAX_HEADERS} header lines")


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size_text = (await _readline(reader)).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError as exc:
            raise _ProtocolError(f"bad chunk size {size_text[:40]!r}") from exc
        if size == 0:
            break
        if size < 0 or len(body) + size > _MAX_BODY_BYTES:
            raise _ProtocolError("response body too large")
        body += await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise _ProtocolError("chunk not followed by CRLF")
    while (line := await _readline(reader)) not in (b"\r\n", b"\n"):  # trailers
        if not line:
            raise _ProtocolError("connection closed inside the trailers")
    return bytes(body)
