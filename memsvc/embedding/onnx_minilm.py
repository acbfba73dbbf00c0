"""The default embedder: all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime, off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import (
    EPFail,
    Fail,
    InvalidArgument,
    RuntimeException,
)
from tokenizers import Tokenizer

from memsvc.embedding.assets import (
    AssetError,
    default_quantized_model_path,
    default_tokenizer_path,
)
from memsvc.embedding.base import EmbeddingError, EmbeddingTimeout, as_text_list, l2_normalise

MODEL_ID = "all-MiniLM-L6-v2-onnx-qint8"
DIMENSION = 384
#: sentence-transformers' max_seq_length for this model. tokenizer.json itself
#: says 128 (and fixed-length padding), so both are overridden on load.
MAX_TOKENS = 256

# onnxruntime's errors do not share a base class with anything but Exception.
_ORT_ERRORS = (EPFail, Fail, InvalidArgument, RuntimeException)


# Niceness of background embedding threads (extraction, reconcile): on a small machine the
# kernel then gives the cores to query embeddings and the database first.
BACKGROUND_NICENESS = 10


def _lower_thread_priority() -> None:
    """Runs in each background executor thread: Linux schedules threads individually."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICENESS)


class OnnxMiniLMEmbedder:
    """Local all-MiniLM-L6-v2 embeddings, computed exactly as sentence-transformers does.

    WordPiece tokens (truncated to 256), mean pooling, L2 normalisation. The
    matrix products run in int8 (``model-qint8.onnx``, see embedding/assets.py),
    so vectors are close to but not identical with the fp32 model's and carry
    their own ``model_id``.

    One text per run, never a padded batch: dynamic quantization scales each
    activation tensor by its own range, so in a batch a text's vector would
    depend on the texts beside it (and on their padding). One text at a time,
    the same text always gets the same vector, whichever call embeds it, and
    an int8 run of one text still costs less than its share of an fp32 batch.
    The derived model has no attention mask at all (assets.drop_padding_ops):
    it must never be fed padding.

    The constructor loads the model and tokenizer eagerly and blocks (about a
    third of a second, including the checksum of the model file): build it at
    start-up, or use :meth:`create` from async code. Inference runs in a
    dedicated thread pool of ``max_workers`` threads, each run using
    ``intra_op_threads`` cores, so the event loop never computes a vector.
    """

    def __init__(
        self,
        *,
        intra_op_threads: int = 1,
        max_workers: int = 1,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        warmup: bool = True,
        background: bool = False,
    ) -> None:
        if intra_op_threads < 1:
            raise ValueError(f"intra_op_threads must be >= 1, got {intra_op_threads}")
        if max_workers not in (1, 2):
            # More workers than cores only queue inside onnxruntime instead of here.
            raise ValueError(f"max_workers must be 1 or 2, got {max_workers}")
        self._tokenizer = _load_tokenizer(
            Path(tokenizer_path) if tokenizer_path is not None else default_tokenizer_path()
        )
        self._session = _load_session(
            Path(model_path) if model_path is not None else default_quantized_model_path(),
            intra_op_threads,
        )
        self._executor = ThreadPoolExecutor(
            max_workers=max_workers,
            thread_name_prefix="memsvc-embed-bg" if background else "memsvc-embed",
            initializer=_lower_thread_priority if background else None,
        )
        self._in_flight: set[ort.RunOptions] = set()
        self._closed = False
        if warmup:
            # One run at start-up proves model and tokenizer fit together before the
            # server reports healthy, and pays the first run's allocations (~1 ms).
            self._embed_blocking(["warm up"], ort.RunOptions())

    @classmethod
    async def create(
        cls,
        *,
        intra_op_threads: int = 1,
        max_workers: int = 1,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        warmup: bool = True,
    ) -> OnnxMiniLMEmbedder:
        """Construct off the event loop; same arguments as the constructor."""
        return await asyncio.to_thread(
            lambda: cls(
                intra_op_threads=intra_op_threads,
                max_workers=max_workers,
                model_path=model_path,
                tokenizer_path=tokenizer_path,
                warmup=warmup,
            )
        )

    @property
    def model_id(self) -> str:
        """Identifier of the vector space (int8 weights: not the fp32 model's space)."""
        return MODEL_ID

    @property
    def dimension(self) -> int:
        """Vector length, 384."""
        return DIMENSION

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model_id={MODEL_ID!r}, closed={self._closed})"

    async def embed(
        self, texts: Sequence[str], *, timeout_s: float | None = None
    ) -> npt.NDArray[np.float32]:
        """Embed ``texts``; ``timeout_s=None`` waits as long as it takes."""
        items = as_text_list(texts)
        if self._closed:
            raise EmbeddingError("the ONNX embedder is closed")
        if not items:
            return np.zeros((0, DIMENSION), dtype=np.float32)
        run_options = ort.RunOptions()
        self._in_flight.add(run_options)
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self._embed_blocking, items, run_options)
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError as exc:
            raise EmbeddingTimeout(
                f"embedding {len(items)} texts did not finish within {timeout_s} s"
            ) from exc
        finally:
            self._in_flight.discard(run_options)
            if not future.done() or future.cancelled():
                # Cancelling the asyncio future cannot stop a running thread: without
                # this the abandoned run would hold the worker, and every later query
                # would queue behind work nobody waits for. onnxruntime polls the flag.
                run_options.terminate = True

    async def aclose(self) -> None:
        """Stop in-flight runs and join the worker threads; idempotent."""
        if self._closed:
            return
        self._closed = True
        for run_options in self._in_flight:
            run_options.terminate = True
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)

    def _embed_blocking(
        self, texts: list[str], run_options: ort.RunOptions
    ) -> npt.NDArray[np.float32]:
        """Worker-thread body: one run per text (see the class docstring), in input order."""
        out = np.empty((len(texts), DIMENSION), dtype=np.float32)
        for i, encoding in enumerate(self._tokenizer.encode_batch(texts)):
            if run_options.terminate:
                raise EmbeddingTimeout("embedding abandoned by its caller")
            out[i] = self._embed_one(encoding.ids, encoding.type_ids, run_options)
        return out

    def _embed_one(
        self, ids: list[int], type_ids: list[int], run_options: ort.RunOptions
    ) -> npt.NDArray[np.float32]:
        input_ids = np.array([ids], dtype=np.int64)
        feeds = {
            "input_ids": input_ids,
            "attention_mask": np.ones_like(input_ids),
            "token_type_ids": np.array([type_ids], dtype=np.int64),
        }
        try:
            (hidden,) = self._session.run(["last_hidden_state"], feeds, run_options)
        except _ORT_ERRORS as exc:
            raise EmbeddingError(f"onnxruntime failed: {type(exc).__name__}: {exc}") from exc
        # No padding: the mean over the tokens is the masked mean.
        pooled = np.asarray(hidden, dtype=np.float32)[0].mean(axis=0, keepdims=True)
        vector: npt.NDArray[np.float32] = l2_normalise(pooled)[0]
        return vector


def _load_tokenizer(path: Path) -> Tokenizer:
    if not path.is_file():
        raise AssetError(f"tokenizer file not found: {path}")
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    # One text per run: no padding at all (tokenizer.json says fixed 128).
    tokenizer.no_padding()
    return tokenizer


def _load_session(path: Path, intra_op_threads: int) -> ort.InferenceSession:
    if not path.is_file():
        raise AssetError(f"ONNX model file not found: {path}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle intra-op threads spin by default, burning the cores the event loop and
    # the database driver need between queries.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
