"""An asyncio HTTP/1.1 client for JSON POSTs: a keep-alive pool, chunked replies, TLS, redaction."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson

# A 2,048-input batch of 3,072-dim embeddings is ~130 MB of JSON; anything bigger is a fault.
_MAX_BODY_BYTES = 256 * 1024 * 1024
_MAX_HEADERS = 100
_EXCERPT_CHARS = 300
_TOKEN_CHARS = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)
# The client frames every request itself; letting a caller set these would corrupt the stream.
_FRAMING_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


class HTTPError(Exception):
    """A request failed: unreachable server, broken connection, bad HTTP, or a closed client."""


class HTTPTimeout(HTTPError):
    """A request did not complete within its time budget."""

    def __init__(self, message: str, timeout_s: float) -> None:
        super().__init__(message)
        self.timeout_s = timeout_s


class _ProtocolError(Exception):
    """The server's reply is not well-formed HTTP/1.1."""


class _StaleConnection(Exception):
    """A reused keep-alive connection was closed by the server before it answered."""


@dataclass(frozen=True)
class _Endpoint:
    origin: str  # "https://host:port", as written in the base URL
    host: str
    port: int
    host_header: str
    prefix: str  # the base URL's path without a trailing slash: "" or "/v1"
    query: str
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


class HTTPClient:
    """POSTs JSON to paths under ``base_url`` and returns ``(status, body)``.

    ``base_url`` is ``http://`` or ``https://`` with an optional path prefix and
    query (the query is appended to every request); ``default_path`` is the
    prefix used when the URL has none (OpenAI-compatible clients pass ``"/v1"``).
    ``bearer_token``, when given, is sent as ``Authorization: Bearer`` and never
    appears in ``repr``, in errors or in :meth:`excerpt`; ``headers`` are sent
    with every request and are not treated as secret.

    Keep-alive connections (at most ``max_connections``, which also caps
    concurrent requests) are reused; one that saw a failure, a timeout or a
    cancellation is dropped, never reused. A reused idle connection that the
    server had already closed costs one retry on a fresh connection: nothing
    was answered, and both users of this client (embeddings, chat completions)
    make requests that are safe to repeat.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        max_connections: int = 8,
        ssl_context: ssl.SSLContext | None = None,
        headers: Mapping[str, str] | None = None,
        bearer_token: str | None = None,
        default_path: str = "",
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if default_path and not default_path.startswith("/"):
            raise ValueError(f"default_path must start with '/', got {default_path!r}")
        self._endpoint = _parse_base_url(base_url, default_path.rstrip("/"))
        self._timeout_s = timeout_s
        self._bearer_token = bearer_token
        self._head_lines = _static_head_lines(self._endpoint, headers, bearer_token)
        self._ssl: ssl.SSLContext | None = None
        if self._endpoint.tls:
            self._ssl = ssl_context if ssl_context is not None else ssl.create_default_context()
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._closed = False

    @property
    def base_url(self) -> str:
        """The normalised base URL (origin and path prefix, without the query)."""
        return self._endpoint.origin + self._endpoint.prefix

    @property
    def timeout_s(self) -> float:
        """The configured cap on every request; a caller's smaller ``timeout_s`` wins."""
        return self._timeout_s

    def url_for(self, path: str) -> str:
        """The URL a request to ``path`` goes to, for messages (the query is left out)."""
        return self.base_url + _checked_path(path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    async def post_json(
        self, path: str, payload: bytes, *, timeout_s: float | None = None
    ) -> tuple[int, bytes]:
        """POST the JSON document ``payload`` to ``path`` under the base URL.

        Returns ``(status, body)`` for any final status: what a 4xx or 5xx means
        is the caller's decision. The whole call, including the wait for a free
        connection, is bounded by ``min(timeout_s, the configured timeout)``.
        Raises :class:`HTTPTimeout` when that runs out and :class:`HTTPError` for
        any other failure (chained to the underlying exception).
        """
        url = self.url_for(path)
        target = self._endpoint.prefix + path
        if self._endpoint.query:
            target += f"?{self._endpoint.query}"
        if self._closed:
            raise HTTPError(f"{url} failed: the HTTP client is closed")
        budget_s = self._timeout_s if timeout_s is None else min(timeout_s, self._timeout_s)
        try:
            async with asyncio.timeout(budget_s):
                return await self._post(target, payload)
        # TimeoutError is an OSError subclass, so it must be caught first.
        except TimeoutError as exc:
            raise HTTPTimeout(f"{url} did not answer within {budget_s} s", budget_s) from exc
        except (OSError, EOFError, _ProtocolError) as exc:
            detail = self.redact(f"{type(exc).__name__}: {exc}")
            raise HTTPError(f"{url} failed: {detail}") from exc

    def redact(self, text: str) -> str:
        """``text`` with the bearer token replaced by ``***``."""
        if self._bearer_token:
            text = text.replace(self._bearer_token, "***")
        return text

    def excerpt(self, body: bytes) -> str:
        """A short, single-line, redacted excerpt of a reply body for an error message.

        A JSON ``{"error": {"message": ...}}`` or ``{"error": "..."}`` yields just
        the message; some servers echo the credential they rejected, hence the redaction.
        """
        text = body.decode("utf-8", errors="replace")
        with contextlib.suppress(orjson.JSONDecodeError):
            document = orjson.loads(body)
            error = document.get("error") if isinstance(document, dict) else None
            if isinstance(error, dict):
                text = str(error.get("message", text))
            elif isinstance(error, str):
                text = error
        text = " ".join(self.redact(text).split())
        if len(text) > _EXCERPT_CHARS:
            text = text[:_EXCERPT_CHARS] + "..."
        return text or "(empty body)"

    async def aclose(self) -> None:
        """Close idle connections; in-flight requests close theirs when they end. Idempotent."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def _post(self, target: str, body: bytes) -> tuple[int, bytes]:
        async with self._slots:
            while self._idle:
                conn = self._idle.pop()
                if not conn.usable():
                    conn.close()
                    continue
                try:
                    return await self._exchange(conn, target, body)
                except _StaleConnection:
                    # The server timed out an idle keep-alive connection just as we
                    # reused it; nothing was answered, so retry on a fresh connection.
                    break
            conn = await self._connect()
            try:
                return await self._exchange(conn, target, body)
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

    async def _exchange(self, conn: _Connection, target: str, body: bytes) -> tuple[int, bytes]:
        reusable = False
        try:
            head = [f"POST {target} HTTP/1.1", *self._head_lines, f"Content-Length: {len(body)}"]
            conn.writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
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


def _parse_base_url(base_url: str, default_path: str) -> _Endpoint:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"base_url must be http:// or https://, got {base_url!r}")
    if parts.username is not None or parts.password is not None:
        # Deliberately not echoing base_url: it holds a credential.
        raise ValueError("base_url must not carry credentials")
    if not parts.hostname:
        raise ValueError(f"base_url has no host: {base_url!r}")
    if parts.fragment:
        raise ValueError(f"base_url must not have a fragment: {base_url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    prefix = parts.path.rstrip("/") or default_path
    _checked_path(prefix or "/")
    return _Endpoint(
        origin=f"{parts.scheme}://{parts.netloc}",
        host=parts.hostname,
        port=port,
        host_header=parts.netloc,
        prefix=prefix,
        query=parts.query,
        tls=parts.scheme == "https",
    )


def _checked_path(path: str) -> str:
    if not path.startswith("/") or not path.isprintable() or " " in path:
        raise ValueError(f"a request path must start with '/' and hold no spaces: {path!r}")
    return path


def _static_head_lines(
    endpoint: _Endpoint, headers: Mapping[str, str] | None, bearer_token: str | None
) -> tuple[str, ...]:
    """The header lines every request carries, validated once so none can inject another."""
    fields = {
        "host": ("Host", endpoint.host_header),
        "user-agent": ("User-Agent", "memsvc"),
        "accept": ("Accept", "application/json"),
        "content-type": ("Content-Type", "application/json"),
    }
    for name, value in (headers or {}).items():
        key = name.lower()
        if not name or not set(name) <= _TOKEN_CHARS:
            raise ValueError(f"bad header name {name!r}")
        if key in _FRAMING_HEADERS or (key == "authorization" and bearer_token is not None):
            raise ValueError(f"header {name!r} is set by the client itself")
        if not _is_header_value(value):
            raise ValueError(f"header {name!r} must be printable latin-1 text")
        fields[key] = (name, value)
    if bearer_token is not None:
        if not bearer_token or not _is_header_value(bearer_token):
            # The message deliberately does not echo the token.
            raise ValueError("bearer_token must be a non-empty string of printable characters")
        fields["authorization"] = ("Authorization", f"Bearer {bearer_token}")
    return tuple(f"{name}: {value}" for name, value in fields.values())


def _is_header_value(value: str) -> bool:
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return value.isprintable()


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
