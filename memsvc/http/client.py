"""JSON POSTs to an OpenAI-compatible API over httpx, with call budgets, a reply cap, no secrets."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from urllib.parse import urlsplit

import httpx
import orjson

# The OpenAI SDKs' convention: a base URL without a path means the /v1 API.
DEFAULT_PATH = "/v1"
# A 2,048-input batch of 3,072-dim embeddings is ~130 MB of JSON; anything bigger is a fault.
MAX_BODY_BYTES = 256 * 1024 * 1024
# Below the 5 s keep-alive timeout of uvicorn (vLLM and many OpenAI-compatible servers run on
# it): the client drops an idle connection before the server does, so it never sends a request
# into one the server is closing. httpx also drops an idle connection the server has closed.
KEEPALIVE_EXPIRY_S = 4.0
_EXCERPT_CHARS = 300


class HTTPError(Exception):
    """A request failed: unreachable server, broken connection, bad HTTP, or a closed client."""


class HTTPTimeout(HTTPError):
    """A request did not complete within its time budget."""

    def __init__(self, message: str, timeout_s: float) -> None:
        super().__init__(message)
        self.timeout_s = timeout_s


class HTTPStatusError(HTTPError):
    """The server answered with a status outside 2xx (the message holds a redacted excerpt)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _NoRequestLines(logging.Filter):
    """Drops httpx's INFO record, the one line it logs per request (nothing else is INFO)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno != logging.INFO


_NO_REQUEST_LINES = _NoRequestLines()


class JSONClient:
    """POSTs JSON documents to paths under ``base_url``: one ``httpx.AsyncClient`` per endpoint.

    ``base_url`` is ``http://`` or ``https://`` with an optional path prefix (``/v1``
    when it has none) and query (sent with every request, left out of ``repr``, errors
    and logs: it may hold a key). ``api_key``, when given, is sent as a bearer token
    and never appears in ``repr``, errors, reply excerpts or logs. ``timeout_s`` caps
    every call; a caller's smaller ``timeout_s`` wins. At most ``max_connections``
    requests run at once, each on its own keep-alive connection; httpx closes a
    connection that saw an error, a timeout or a cancellation instead of reusing it.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        max_connections: int = 8,
        ssl_context: ssl.SSLContext | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        if api_key is not None and (not api_key or not api_key.isprintable()):
            # Checked here so a stray newline cannot inject a header; the message
            # deliberately does not echo the key.
            raise ValueError("api_key must be a non-empty string of printable characters")
        self._base_url, self._query, tls = _split_base_url(base_url)
        self._api_key = api_key
        self._timeout_s = timeout_s
        self._max_body_bytes = max_body_bytes
        headers = {
            "User-Agent": "memsvc",
            "Accept": "application/json",
            "Content-Type": "application/json",
        }
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key}"
        if ssl_context is None:
            # An http:// endpoint never does TLS (redirects are not followed), and loading
            # the system's CAs costs ~50 ms: it gets an unused context that trusts nothing.
            ssl_context = (
                ssl.create_default_context() if tls else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            )
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
            ),
            # The system's CAs (as the ssl module loads them), not certifi's bundle.
            verify=ssl_context,
            # No proxy, .netrc or CA settings picked up from the environment: what the
            # client does is what the settings say.
            trust_env=False,
        )
        # The per-request INFO line would be one log line per embedding on the read path, and
        # it prints the full URL, query included.
        logging.getLogger("httpx").addFilter(_NO_REQUEST_LINES)

    @property
    def base_url(self) -> str:
        """The normalised base URL (origin and path prefix, without the query)."""
        return self._base_url

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._client.is_closed

    def url_for(self, path: str) -> str:
        """The URL a request to ``path`` goes to, for messages (the query is left out)."""
        return self._base_url + _checked_path(path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self._base_url!r})"

    async def post_json(
        self, path: str, payload: bytes, *, timeout_s: float | None = None
    ) -> bytes:
        """POST the JSON document ``payload`` to ``path``; the body of a 2xx answer.

        The whole call, including the wait for a free connection, is bounded by
        ``min(timeout_s, the configured timeout)``. Raises :class:`HTTPTimeout`
        when that runs out, :class:`HTTPStatusError` for any other final status and
        :class:`HTTPError` for any other failure, chained to httpx's exception.
        """
        url = self.url_for(path)
        if self.closed:
            raise HTTPError(f"{url} failed: the HTTP client is closed")
        budget_s = self._timeout_s if timeout_s is None else min(timeout_s, self._timeout_s)
        if budget_s <= 0:
            raise HTTPTimeout(f"{url} did not answer within {budget_s} s", budget_s)
        try:
            # httpx's timeout bounds each step (pool wait, connect, every read and write);
            # asyncio.timeout bounds the whole exchange, a server trickling its reply included.
            async with asyncio.timeout(budget_s):
                status, body = await self._exchange(url, payload, budget_s)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise HTTPTimeout(f"{url} did not answer within {budget_s} s", budget_s) from exc
        except httpx.HTTPError as exc:
            detail = self._redact(f"{type(exc).__name__}: {exc}")
            raise HTTPError(f"{url} failed: {detail}") from exc
        if not 200 <= status < 300:
            raise HTTPStatusError(f"{url} answered HTTP {status}: {self._excerpt(body)}", status)
        return body

    def _redact(self, text: str) -> str:
        """``text`` with the API key replaced by ``***``."""
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return text

    def _excerpt(self, body: bytes) -> str:
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
        text = " ".join(self._redact(text).split())
        if len(text) > _EXCERPT_CHARS:
            text = text[:_EXCERPT_CHARS] + "..."
        return text or "(empty body)"

    async def aclose(self) -> None:
        """Close every connection, in-flight requests' included. Idempotent."""
        await self._client.aclose()

    async def _exchange(self, url: str, payload: bytes, timeout_s: float) -> tuple[int, bytes]:
        target = f"{url}?{self._query}" if self._query else url
        async with self._client.stream(
            "POST", target, content=payload, timeout=timeout_s
        ) as response:
            # Leaving the block early leaves the reply unread, so httpx closes the connection.
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self._max_body_bytes:
                raise self._too_large(url)
            body = bytearray()
            async for chunk in response.aiter_bytes():  # decompressed: the cap is on what is kept
                body += chunk
                if len(body) > self._max_body_bytes:
                    raise self._too_large(url)
            return response.status_code, bytes(body)

    def _too_large(self, url: str) -> HTTPError:
        return HTTPError(f"{url} failed: the reply is over {self._max_body_bytes} bytes")


def _split_base_url(base_url: str) -> tuple[str, str, bool]:
    """(origin and path prefix, query, whether it is https) of a checked base URL."""
    # The messages never echo base_url: its user info or query may hold a credential.
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"base_url must be http:// or https://, not {parts.scheme!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("base_url must not carry credentials")
    if not parts.hostname:
        raise ValueError("base_url has no host")
    if parts.fragment:
        raise ValueError("base_url must not have a fragment")
    prefix = parts.path.rstrip("/") or DEFAULT_PATH
    _checked_path(prefix)
    return f"{parts.scheme}://{parts.netloc}{prefix}", parts.query, parts.scheme == "https"


def _checked_path(path: str) -> str:
    if not path.startswith("/") or not path.isprintable() or " " in path:
        raise ValueError(f"a request path must start with '/' and hold no spaces: {path!r}")
    return path
