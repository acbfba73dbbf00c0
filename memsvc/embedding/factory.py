"""Builds the configured Embedder from explicit settings."""

from __future__ import annotations

from memsvc.embedding.base import Embedder


def build_embedder(
    kind: str,
    *,
    intra_op_threads: int = 1,
    max_workers: int = 1,
    base_url: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    dimension: int | None = None,
    timeout_s: float = 10.0,
    background: bool = False,
) -> Embedder:
    """Build an ``"onnx"`` (local, the default model) or ``"openai"`` (HTTP) embedder.

    ``"onnx"`` uses ``intra_op_threads`` and ``max_workers`` and loads the model
    before returning (blocking). ``"openai"`` requires ``base_url``, ``model``
    and ``dimension``; ``api_key`` is optional for servers that need none.
    Settings that do not apply to ``kind`` are ignored. Any other ``kind`` is a
    ValueError: there is deliberately no fake here.
    """
    # Imported per branch so choosing one backend never loads the other's libraries.
    if kind == "onnx":
        from memsvc.embedding.onnx_minilm import OnnxMiniLMEmbedder

        return OnnxMiniLMEmbedder(
            intra_op_threads=intra_op_threads, max_workers=max_workers, background=background
        )
    if kind == "openai":
        from memsvc.embedding.openai_http import OpenAIHTTPEmbedder

        if base_url is None or model is None or dimension is None:
            missing = [
                name
                for name, value in (
                    ("base_url", base_url),
                    ("model", model),
                    ("dimension", dimension),
                )
                if value is None
            ]
            raise ValueError(f"embedder kind 'openai' needs {', '.join(missing)}")
        return OpenAIHTTPEmbedder(
            base_url=base_url,
            model=model,
            api_key=api_key,
            dimension=dimension,
            timeout_s=timeout_s,
        )
    raise ValueError(f"unknown embedder kind {kind!r} (expected 'onnx' or 'openai')")
