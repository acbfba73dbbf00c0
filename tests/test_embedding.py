"""Tests for memsvc.embedding: the real ONNX model, the HTTP embedder against a local server."""

from __future__ import annotations

import asyncio
import shutil
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from memsvc.embedding import Embedder, EmbeddingError
from memsvc.embedding import assets as assets_module
from memsvc.embedding.assets import AssetError
from memsvc.embedding.base import EmbeddingTimeout
from memsvc.embedding.factory import build_embedder
from memsvc.embedding.onnx_minilm import OnnxMiniLMEmbedder
from memsvc.embedding.openai_http import OpenAIHTTPEmbedder
from memsvc.http import HTTPError, HTTPTimeout
from tests.fake_http import QuietHandler, serving

API_KEY = "sk-test-0123456789-secret"


# --- the real ONNX model -------------------------------------------------------------


@pytest.fixture(scope="module")
async def onnx() -> AsyncIterator[OnnxMiniLMEmbedder]:
    embedder = OnnxMiniLMEmbedder()
    yield embedder
    await embedder.aclose()


async def test_onnx_semantics(onnx: OnnxMiniLMEmbedder) -> None:
    vectors = await onnx.embed(["I am a vegetarian", "I don't eat meat", "The stock market fell"])
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similar = float(vectors[0] @ vectors[1])
    dissimilar = float(vectors[0] @ vectors[2])
    assert similar > 0.5
    assert dissimilar < 0.25
    assert similar - dissimilar > 0.3


async def test_onnx_batch_equals_single(onnx: OnnxMiniLMEmbedder) -> None:
    texts = [
        "My daughter's name is Alice.",
        "hi",
        "Remind me that the dentist appointment moved to Thursday at three in the afternoon.",
        "",
    ]
    batch = await onnx.embed(texts)
    singles = np.vstack([await onnx.embed([text]) for text in texts])
    np.testing.assert_allclose(batch, singles, atol=1e-5)


async def test_onnx_identity_and_protocol(onnx: OnnxMiniLMEmbedder) -> None:
    assert onnx.model_id == "all-MiniLM-L6-v2-onnx-qint8"
    assert onnx.dimension == 384
    assert isinstance(onnx, Embedder)


async def test_onnx_empty_input(onnx: OnnxMiniLMEmbedder) -> None:
    vectors = await onnx.embed([])
    assert vectors.shape == (0, 384)
    assert vectors.dtype == np.float32


async def test_onnx_rejects_bare_string(onnx: OnnxMiniLMEmbedder) -> None:
    with pytest.raises(TypeError):
        await onnx.embed("not a list")


async def test_onnx_truncates_long_text(onnx: OnnxMiniLMEmbedder) -> None:
    # Well past 256 tokens: must be truncated, not rejected by the model.
    vectors = await onnx.embed(["memory " * 2000])
    assert vectors.shape == (1, 384)
    assert np.isfinite(vectors).all()


async def test_onnx_timeout_frees_the_worker(onnx: OnnxMiniLMEmbedder) -> None:
    long_batch = ["the quick brown fox jumps over the lazy dog " * 40] * 64
    with pytest.raises(EmbeddingTimeout):
        await onnx.embed(long_batch, timeout_s=1e-6)
    # The abandoned run (seconds of work) must be stopped, not left holding the
    # single worker thread in front of the next query.
    started = time.perf_counter()
    vectors = await onnx.embed(["what is my dog's name?"], timeout_s=5.0)
    assert vectors.shape == (1, 384)
    assert time.perf_counter() - started < 2.0


async def test_onnx_closed_embedder_raises() -> None:
    embedder = await OnnxMiniLMEmbedder.create(warmup=False)
    await embedder.aclose()
    await embedder.aclose()  # idempotent
    with pytest.raises(EmbeddingError):
        await embedder.embed(["hello"])


def test_missing_tokenizer_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(assets_module, "tokenizer_path", lambda: tmp_path / "tokenizer.json")
    with pytest.raises(AssetError, match="make install"):
        assets_module.default_tokenizer_path()
    with pytest.raises(AssetError, match="tokenizer"):
        OnnxMiniLMEmbedder(tokenizer_path=tmp_path / "absent.json")


def test_installed_tokenizer_matches_pin() -> None:
    assert assets_module.tokenizer_is_installed()


def test_installed_model_computes_in_int8() -> None:
    import onnx as onnx_format

    model = onnx_format.load(str(assets_module.default_quantized_model_path()))
    ops = Counter(node.op_type for node in model.graph.node)
    # Every weight product (six layers: Q, K, V, output, two feed-forward) runs in int8.
    assert ops["MatMulInteger"] >= 36 and ops["DynamicQuantizeLinear"] > 0


async def test_int8_vectors_stay_close_to_the_source_models(onnx: OnnxMiniLMEmbedder) -> None:
    source = OnnxMiniLMEmbedder(model_path=assets_module.default_model_path())
    try:
        texts = [
            "My daughter's name is Alice.",
            "What did Caroline say about the adoption agency?",
            "we went hiking near the lake last weekend and it rained",
            "hi",
        ]
        ours, theirs = await onnx.embed(texts), await source.embed(texts)
    finally:
        await source.aclose()
    assert float(np.min(np.sum(ours * theirs, axis=1))) > 0.97


def test_the_derivation_is_reproducible(tmp_path: Path) -> None:
    installed = assets_module.default_quantized_model_path()
    again = assets_module.install_quantized_model(tmp_path / installed.name)
    recorded = orjson.loads(installed.with_suffix(".json").read_bytes())
    assert assets_module.sha256_file(again) == recorded["sha256"]
    assert orjson.loads(again.with_suffix(".json").read_bytes()) == recorded


def test_a_derived_model_that_changed_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    installed = assets_module.default_quantized_model_path()
    copy = tmp_path / installed.name
    shutil.copy(installed, copy)
    shutil.copy(installed.with_suffix(".json"), copy.with_suffix(".json"))
    monkeypatch.setattr(assets_module, "quantized_model_path", lambda: copy)
    assert assets_module.quantized_model_problem() is None

    record = orjson.loads(copy.with_suffix(".json").read_bytes())
    copy.with_suffix(".json").write_bytes(orjson.dumps(record | {"source_sha256": "0" * 64}))
    with pytest.raises(AssetError, match=r"another source model.*make install"):
        assets_module.default_quantized_model_path()

    copy.with_suffix(".json").write_bytes(orjson.dumps(record))
    with copy.open("r+b") as handle:
        handle.seek(1000)
        byte = handle.read(1)
        handle.seek(1000)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(AssetError, match="does not match the sha256"):
        assets_module.default_quantized_model_path()
    copy.unlink()
    with pytest.raises(AssetError, match="not found"):
        OnnxMiniLMEmbedder()


# --- the OpenAI-compatible HTTP embedder, against a local server ----------------------


Reply = tuple[int, bytes]


@dataclass
class FakeOpenAI:
    """State shared between a test and its local HTTP server thread."""

    reply: Callable[[dict[str, Any]], Reply]
    chunked: bool = False
    delay_s: float = 0.0
    requests: list[tuple[str, dict[str, str], dict[str, Any]]] = field(default_factory=list)
    connections: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    base_url: str = ""


def embeddings_reply(dimension: int, *, reverse: bool = True) -> Callable[[dict[str, Any]], Reply]:
    """A reply with vector i = (i+1) * e_i (unnormalised), listed in reverse index order."""

    def reply(request: dict[str, Any]) -> Reply:
        data = []
        for index, _ in enumerate(request["input"]):
            vector = [0.0] * dimension
            vector[index % dimension] = float(index + 1)
            data.append({"object": "embedding", "index": index, "embedding": vector})
        if reverse:
            data.reverse()
        return 200, orjson.dumps({"object": "list", "data": data, "model": request["model"]})

    return reply


def _handler_for(state: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def setup(self) -> None:
            state.connections += 1
            super().setup()

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = orjson.loads(body)
            state.requests.append((self.path, dict(self.headers.items()), request))
            if state.delay_s:
                state.release.wait(state.delay_s)
            status, payload = state.reply(request)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            if state.chunked:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for start in range(0, len(payload), 1000):
                    piece = payload[start : start + 1000]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

    return Handler


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    state = FakeOpenAI(reply=embeddings_reply(8))
    with serving(_handler_for(state)) as state.base_url:
        try:
            yield state
        finally:
            state.release.set()


@pytest.fixture
async def http_embedder(fake_openai: FakeOpenAI) -> AsyncIterator[OpenAIHTTPEmbedder]:
    embedder = OpenAIHTTPEmbedder(
        base_url=fake_openai.base_url, model="test-embed", dimension=8, api_key=API_KEY
    )
    yield embedder
    await embedder.aclose()


async def test_http_embeds_in_index_order(
    fake_openai: FakeOpenAI, http_embedder: OpenAIHTTPEmbedder
) -> None:
    vectors = await http_embedder.embed(["a", "b", "c"])
    assert vectors.shape == (3, 8)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, np.eye(8, dtype=np.float32)[:3])
    path, headers, request = fake_openai.requests[0]
    assert path == "/v1/embeddings"
    assert request == {"model": "test-embed", "input": ["a", "b", "c"]}
    assert headers["Authorization"] == f"Bearer {API_KEY}"
    assert headers["Content-Type"] == "application/json"


async def test_http_api_key_not_in_repr(http_embedder: OpenAIHTTPEmbedder) -> None:
    assert API_KEY not in repr(http_embedder)
    assert "test-embed" in repr(http_embedder)


async def test_http_reuses_keepalive_connection(
    fake_openai: FakeOpenAI, http_embedder: OpenAIHTTPEmbedder
) -> None:
    for _ in range(3):
        await http_embedder.embed(["x"])
    assert fake_openai.connections == 1


async def test_http_chunked_reply(
    fake_openai: FakeOpenAI, http_embedder: OpenAIHTTPEmbedder
) -> None:
    fake_openai.chunked = True
    vectors = await http_embedder.embed([f"text {i}" for i in range(8)])
    np.testing.assert_allclose(vectors, np.eye(8, dtype=np.float32))
    assert fake_openai.connections == 1


async def test_http_wrong_dimension(
    fake_openai: FakeOpenAI, http_embedder: OpenAIHTTPEmbedder
) -> None:
    fake_openai.reply = embeddings_reply(16)
    with pytest.raises(EmbeddingError, match="16-dimensional") as info:
        await http_embedder.embed(["a"])
    assert "configured for 8" in str(info.value)


async def test_http_server_error(
    fake_openai: FakeOpenAI, http_embedder: OpenAIHTTPEmbedder
) -> None:
    fake_openai.reply = lambda request: (500, b'{"error": {"message": "model crashed"}}')
    with pytest.raises(EmbeddingError, match="HTTP 500: model crashed") as info:
        await http_embedder.embed(["a"])
    assert not isinstance(info.value, EmbeddingTimeout)


async def test_http_error_never_echoes_the_key(
    fake_openai: FakeOpenAI, http_embedder: OpenAIHTTPEmbedder
) -> None:
    body = orjson.dumps({"error": {"message": f"Incorrect API key provided: {API_KEY}"}})
    fake_openai.reply = lambda request: (401, body)
    with pytest.raises(EmbeddingError, match="HTTP 401") as info:
        await http_embedder.embed(["a"])
    assert API_KEY not in str(info.value)


async def test_http_wrong_count_and_bad_json(
    fake_openai: FakeOpenAI, http_embedder: OpenAIHTTPEmbedder
) -> None:
    fake_openai.reply = lambda request: (200, orjson.dumps({"data": []}))
    with pytest.raises(EmbeddingError, match="0 items for 2 inputs"):
        await http_embedder.embed(["a", "b"])
    fake_openai.reply = lambda request: (200, b"<html>not json</html>")
    with pytest.raises(EmbeddingError, match="invalid JSON"):
        await http_embedder.embed(["a"])


async def test_http_timeout(fake_openai: FakeOpenAI) -> None:
    fake_openai.delay_s = 5.0
    embedder = OpenAIHTTPEmbedder(base_url=fake_openai.base_url, model="m", dimension=8)
    try:
        started = time.perf_counter()
        with pytest.raises(EmbeddingTimeout) as info:
            await embedder.embed(["slow"], timeout_s=0.1)
        assert time.perf_counter() - started < 2.0
        assert isinstance(info.value.__cause__, HTTPTimeout)
        assert "did not answer within 0.1 s" in str(info.value)
        # The configured timeout also caps calls that pass none.
        short = OpenAIHTTPEmbedder(
            base_url=fake_openai.base_url, model="m", dimension=8, timeout_s=0.1
        )
        with pytest.raises(EmbeddingTimeout):
            await short.embed(["slow"])
        await short.aclose()
    finally:
        await embedder.aclose()


async def test_http_connection_refused() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    embedder = OpenAIHTTPEmbedder(base_url=f"http://127.0.0.1:{port}", model="m", dimension=8)
    with pytest.raises(EmbeddingError) as info:
        await embedder.embed(["a"])
    assert not isinstance(info.value, EmbeddingTimeout)
    assert isinstance(info.value.__cause__, HTTPError)
    assert isinstance(info.value.__cause__.__cause__, httpx.ConnectError)
    await embedder.aclose()


async def test_http_empty_input_sends_nothing(
    fake_openai: FakeOpenAI, http_embedder: OpenAIHTTPEmbedder
) -> None:
    vectors = await http_embedder.embed([])
    assert vectors.shape == (0, 8)
    assert fake_openai.requests == []


async def read_request(reader: asyncio.StreamReader) -> dict[str, Any]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    request: dict[str, Any] = orjson.loads(await reader.readexactly(length))
    return request


async def test_http_an_idle_connection_the_server_closed_is_not_reused() -> None:
    """A server's keep-alive timeout firing between two calls costs a new connection, not an
    error: httpx checks an idle connection before it reuses it."""
    connections = 0
    closed = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        # One answer, then the connection is closed as an idle timeout would close it.
        _, payload = embeddings_reply(4)(await read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload))
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        closed.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    embedder = OpenAIHTTPEmbedder(base_url=f"http://127.0.0.1:{port}", model="m", dimension=4)
    try:
        first = await embedder.embed(["a"])
        await asyncio.wait_for(closed.wait(), 5)
        second = await embedder.embed(["b"])
        np.testing.assert_allclose(first, second)
        assert connections == 2
    finally:
        await embedder.aclose()
        server.close()
        await server.wait_closed()


async def test_http_a_request_the_server_drops_is_a_prompt_error() -> None:
    """A connection closed with the request unanswered is an EmbeddingError at once, not a
    retry: the server may have done the work, and the embedder's callers decide about that."""
    requests: list[dict[str, Any]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await read_request(reader))
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    embedder = OpenAIHTTPEmbedder(base_url=f"http://127.0.0.1:{port}", model="m", dimension=4)
    try:
        with pytest.raises(EmbeddingError, match="Server disconnected") as info:
            await embedder.embed(["a"], timeout_s=5)
        assert not isinstance(info.value, EmbeddingTimeout)
        assert isinstance(info.value.__cause__, HTTPError)
        assert len(requests) == 1
    finally:
        await embedder.aclose()
        server.close()
        await server.wait_closed()


def test_http_rejects_bad_configuration() -> None:
    with pytest.raises(ValueError):
        OpenAIHTTPEmbedder(base_url="ftp://example.invalid", model="m", dimension=8)
    with pytest.raises(ValueError):
        OpenAIHTTPEmbedder(base_url="http://user:pw@example.invalid", model="m", dimension=8)
    with pytest.raises(ValueError) as info:
        OpenAIHTTPEmbedder(
            base_url="http://example.invalid", model="m", dimension=8, api_key="sk-x\r\nX: y"
        )
    assert "sk-x" not in str(info.value)


def test_http_endpoint_paths() -> None:
    bare = OpenAIHTTPEmbedder(base_url="http://localhost:8080", model="m", dimension=8)
    assert "http://localhost:8080/v1/embeddings" in repr(bare)
    prefixed = OpenAIHTTPEmbedder(
        base_url="https://api.example.invalid/openai/v1/", model="m", dimension=8
    )
    assert "https://api.example.invalid/openai/v1/embeddings" in repr(prefixed)


# --- the factory ---------------------------------------------------------


async def test_factory_builds_each_kind() -> None:
    http = build_embedder(
        "openai", base_url="http://127.0.0.1:1", model="m", dimension=8, api_key=API_KEY
    )
    assert isinstance(http, OpenAIHTTPEmbedder)
    assert http.dimension == 8
    local = build_embedder("onnx", intra_op_threads=1)
    assert isinstance(local, OnnxMiniLMEmbedder)
    await local.aclose()


def test_factory_rejects_unknown_and_incomplete() -> None:
    with pytest.raises(ValueError, match="unknown embedder kind"):
        build_embedder("fake")
    with pytest.raises(ValueError, match="dimension"):
        build_embedder("openai", base_url="http://127.0.0.1:1", model="m")


async def test_background_embedder_runs_at_a_lower_priority() -> None:
    import os
    import threading

    from memsvc.embedding.onnx_minilm import BACKGROUND_NICENESS, OnnxMiniLMEmbedder

    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    loop = asyncio.get_running_loop()
    background = OnnxMiniLMEmbedder(background=True, warmup=False)
    foreground = OnnxMiniLMEmbedder(warmup=False)
    try:
        base = os.getpriority(os.PRIO_PROCESS, 0)
        assert await loop.run_in_executor(background._executor, niceness) == BACKGROUND_NICENESS
        assert await loop.run_in_executor(foreground._executor, niceness) == base
        vectors = await background.embed(["still embeds"])
        assert vectors.shape == (1, 384)
    finally:
        await background.aclose()
        await foreground.aclose()
