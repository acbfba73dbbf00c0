"""Tests for memsvc.http.JSONClient against local HTTP servers: budgets, reuse, caps, secrets."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from memsvc.http import HTTPError, HTTPStatusError, HTTPTimeout, JSONClient
from tests.test_embedding import FakeOpenAI, fake_openai, read_request  # noqa: F401

API_KEY = "sk-test-http-7c1e0b9a2d-secret"
QUERY_SECRET = "q-secret-4b8f21d0"


def echo_waiting_for(state: FakeOpenAI, arrived: threading.Event) -> None:
    """Answer each request with its own JSON; a request for "slow" waits for state.release."""

    def reply(request: dict[str, Any]) -> tuple[int, bytes]:
        if request.get("input") == "slow":
            arrived.set()
            state.release.wait(5)
        return 200, orjson.dumps(request)

    state.reply = reply


async def test_a_cancelled_call_never_leaves_its_connection_to_the_next(
    fake_openai: FakeOpenAI,  # noqa: F811
) -> None:
    arrived = threading.Event()
    echo_waiting_for(fake_openai, arrived)
    client = JSONClient(fake_openai.base_url, timeout_s=5)
    try:
        slow = asyncio.create_task(client.post_json("/echo", orjson.dumps({"input": "slow"})))
        assert await asyncio.to_thread(arrived.wait, 5)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        # The slow answer now goes to the abandoned connection: on a reused one, the next
        # call would read it as its own.
        fake_openai.release.set()
        reply = await client.post_json("/echo", orjson.dumps({"input": "fast"}))
        assert orjson.loads(reply) == {"input": "fast"}
        assert fake_openai.connections == 2
    finally:
        await client.aclose()


async def test_a_timed_out_call_never_leaves_its_connection_to_the_next(
    fake_openai: FakeOpenAI,  # noqa: F811
) -> None:
    arrived = threading.Event()
    echo_waiting_for(fake_openai, arrived)
    client = JSONClient(fake_openai.base_url, timeout_s=5)
    try:
        started = time.perf_counter()
        with pytest.raises(HTTPTimeout) as info:
            await client.post_json("/echo", orjson.dumps({"input": "slow"}), timeout_s=0.2)
        assert time.perf_counter() - started < 2.0
        assert info.value.timeout_s == 0.2
        assert info.value.__cause__ is not None
        fake_openai.release.set()
        reply = await client.post_json("/echo", orjson.dumps({"input": "fast"}))
        assert orjson.loads(reply) == {"input": "fast"}
        assert fake_openai.connections == 2
    finally:
        await client.aclose()


async def test_the_budget_bounds_the_whole_call_not_each_read() -> None:
    """A server trickling its reply, a byte at a time, is cut off when the budget runs out."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            while not writer.is_closing():
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.05)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = JSONClient(f"http://127.0.0.1:{port}", timeout_s=5)
    try:
        started = time.perf_counter()
        with pytest.raises(HTTPTimeout):
            await client.post_json("/embeddings", b"{}", timeout_s=0.3)
        assert time.perf_counter() - started < 2.0
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()


async def test_a_spent_budget_sends_nothing(
    fake_openai: FakeOpenAI,  # noqa: F811
) -> None:
    client = JSONClient(fake_openai.base_url)
    try:
        with pytest.raises(HTTPTimeout):
            await client.post_json("/embeddings", b"{}", timeout_s=0.0)
        assert fake_openai.requests == []
    finally:
        await client.aclose()


async def test_max_connections_caps_concurrent_requests(
    fake_openai: FakeOpenAI,  # noqa: F811
) -> None:
    fake_openai.delay_s = 0.2
    fake_openai.reply = lambda request: (200, orjson.dumps(request))
    client = JSONClient(fake_openai.base_url, max_connections=2)
    try:
        replies = await asyncio.gather(
            *(client.post_json("/echo", orjson.dumps({"n": n})) for n in range(4))
        )
        assert [orjson.loads(reply) for reply in replies] == [{"n": n} for n in range(4)]
        assert fake_openai.connections == 2
    finally:
        await client.aclose()


async def test_a_reply_over_the_cap_is_an_error_and_its_connection_is_dropped(
    fake_openai: FakeOpenAI,  # noqa: F811
) -> None:
    client = JSONClient(fake_openai.base_url, max_body_bytes=1000)
    try:
        fake_openai.reply = lambda request: (200, b"[" + b"0," * 1000 + b"0]")
        for chunked in (False, True):  # refused from Content-Length, and while reading
            fake_openai.chunked = chunked
            with pytest.raises(HTTPError, match="over 1000 bytes") as info:
                await client.post_json("/embeddings", b"{}")
            assert type(info.value) is HTTPError
        fake_openai.reply = lambda request: (200, b"[0]")
        assert await client.post_json("/embeddings", b"{}") == b"[0]"
        assert fake_openai.connections == 3
    finally:
        await client.aclose()


async def test_a_non_2xx_answer_carries_its_status_and_a_bounded_excerpt(
    fake_openai: FakeOpenAI,  # noqa: F811
) -> None:
    client = JSONClient(fake_openai.base_url)
    try:
        fake_openai.reply = lambda request: (429, orjson.dumps({"error": {"message": "slow down"}}))
        with pytest.raises(HTTPStatusError, match=r"/v1/embeddings answered HTTP 429: slow down$"):
            await client.post_json("/embeddings", b"{}")
        fake_openai.reply = lambda request: (500, b"<html>\n" + b"x" * 5000 + b"\n</html>")
        with pytest.raises(HTTPStatusError) as info:
            await client.post_json("/embeddings", b"{}")
        assert info.value.status == 500
        assert "\n" not in str(info.value) and str(info.value).endswith("...")
        assert len(str(info.value)) < 400
    finally:
        await client.aclose()


async def test_the_query_and_the_key_reach_the_server_but_no_message_or_log(
    fake_openai: FakeOpenAI,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    query = f"api-version=2024-06-01&key={QUERY_SECRET}"
    client = JSONClient(f"{fake_openai.base_url}?{query}", api_key=API_KEY, timeout_s=5)
    texts: list[str] = [repr(client), client.base_url]
    try:
        fake_openai.reply = lambda request: (200, b"{}")
        assert await client.post_json("/embeddings", b"{}") == b"{}"
        path, headers, _ = fake_openai.requests[0]
        assert path == f"/v1/embeddings?{query}"
        assert headers["Authorization"] == f"Bearer {API_KEY}"
        assert headers["Content-Type"] == "application/json"

        echoed = orjson.dumps({"error": {"message": f"Incorrect API key provided: {API_KEY}"}})
        fake_openai.reply = lambda request: (401, echoed)
        with pytest.raises(HTTPStatusError) as rejected:
            await client.post_json("/embeddings", b"{}")
        assert "Incorrect API key provided: ***" in str(rejected.value)
        fake_openai.delay_s = 5.0
        with pytest.raises(HTTPTimeout) as late:
            await client.post_json("/embeddings", b"{}", timeout_s=0.1)
        for error in (rejected.value, late.value):
            current: BaseException | None = error
            while current is not None:
                texts += [str(current), repr(current)]
                current = current.__cause__ or current.__context__
    finally:
        await client.aclose()
    # httpcore's DEBUG records were there to leak; httpx's per-request INFO line is not.
    assert any(record.name.startswith("httpcore") for record in caplog.records)
    assert not [r for r in caplog.records if r.name == "httpx" and r.levelno == logging.INFO]
    texts += [record.getMessage() for record in caplog.records]
    for secret in (API_KEY, QUERY_SECRET):
        assert all(secret not in text for text in texts)


async def test_a_closed_client_raises_and_closing_is_idempotent(
    fake_openai: FakeOpenAI,  # noqa: F811
) -> None:
    client = JSONClient(fake_openai.base_url)
    await client.aclose()
    await client.aclose()
    assert client.closed
    with pytest.raises(HTTPError, match="closed"):
        await client.post_json("/embeddings", b"{}")
    assert fake_openai.requests == []


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1 and its key."""
    key, cert = tmp_path / "server.key", tmp_path / "server.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


async def test_https_trusts_the_given_context_and_by_default_the_systems_cas(
    self_signed: tuple[Path, Path],
) -> None:
    cert, key = self_signed
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        payload = orjson.dumps(await read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_context)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    trusting = JSONClient(url, ssl_context=ssl.create_default_context(cafile=cert))
    default = JSONClient(url)  # the system's CAs, which never signed a throwaway certificate
    try:
        assert orjson.loads(await trusting.post_json("/echo", b'{"a": 1}')) == {"a": 1}
        with pytest.raises(HTTPError, match="CERTIFICATE_VERIFY_FAILED"):
            await default.post_json("/echo", b"{}")
    finally:
        await trusting.aclose()
        await default.aclose()
        server.close()
        await server.wait_closed()


def test_base_urls_and_paths() -> None:
    assert JSONClient("http://localhost:8080").url_for("/embeddings") == (
        "http://localhost:8080/v1/embeddings"
    )
    prefixed = JSONClient(f"https://api.example.invalid/openai/v1/?key={QUERY_SECRET}")
    assert prefixed.base_url == "https://api.example.invalid/openai/v1"
    assert QUERY_SECRET not in repr(prefixed)
    with pytest.raises(ValueError):
        prefixed.url_for("embeddings")


@pytest.mark.parametrize(
    ("base_url", "options"),
    [
        (f"ftp://example.invalid/?key={QUERY_SECRET}", {}),
        (f"http://user:{QUERY_SECRET}@example.invalid", {}),
        (f"http:///v1?key={QUERY_SECRET}", {}),
        (f"http://example.invalid/v1?key={QUERY_SECRET}#top", {}),
        ("http://example.invalid", {"api_key": f"{QUERY_SECRET}\r\nX-Injected: 1"}),
        ("http://example.invalid", {"api_key": ""}),
        ("http://example.invalid", {"timeout_s": 0}),
        ("http://example.invalid", {"max_connections": 0}),
        ("http://example.invalid", {"max_body_bytes": 0}),
    ],
)
def test_bad_configuration_is_refused_without_echoing_secrets(
    base_url: str, options: dict[str, Any]
) -> None:
    with pytest.raises(ValueError) as info:
        JSONClient(base_url, **options)
    assert QUERY_SECRET not in str(info.value)
