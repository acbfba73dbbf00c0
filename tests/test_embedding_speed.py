"""The derived int8 model drops the padding-only nodes without changing a single vector."""

from __future__ import annotations

import platform
import shutil
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from memsvc.embedding import assets as assets_module
from memsvc.embedding.assets import AssetError
from memsvc.embedding.onnx_minilm import OnnxMiniLMEmbedder

TEXTS = [
    "hi",
    "What did Caroline say about the adoption agency?",
    'Melanie said, "We went camping near the lake and watched the meteor shower." ' * 3,
    # Longer than MAX_TOKENS: the truncated run is covered too.
    "a long message about pottery, painting and the kids " * 40,
]

#: First components of two vectors from the model derived before recipe 2 (recipe 1 kept the
#: mask nodes); close, not exact, across CPUs whose fp32 kernels round differently. Two sets:
#: onnxruntime's int8 products take another kernel on a CPU with VNNI instructions. Without
#: them (AVX2, AMD EPYC) a pair of uint8 x int8 products is summed into int16 and saturates;
#: with them (AVX-512 VNNI, Intel Xeon) it is summed exactly, and the vectors move by up to
#: 0.015 a component (cosine ~0.99 between the two; the VNNI ones are the nearer to fp32).
REFERENCE_SATURATING = {
    "What did Caroline say about the adoption agency?": [
        -0.12163, 0.05859, -0.0341, 0.07695, -0.04771, 0.01837, -0.00793, -0.01445,
    ],
    "hi": [-0.08259, 0.0305, 0.02729, 0.06022, -0.03026, -0.04748, 0.05526, 0.0049],
}  # fmt: skip
REFERENCE_VNNI = {
    "What did Caroline say about the adoption agency?": [
        -0.12194, 0.06636, -0.02448, 0.07215, -0.03409, 0.0095, -0.00542, -0.01546,
    ],
    "hi": [-0.09999, 0.02068, 0.01695, 0.05808, -0.02731, -0.05426, 0.04612, 0.01093],
}  # fmt: skip


def cpu_has_vnni() -> bool:
    """Whether this x86 Linux CPU has the VNNI instructions onnxruntime's int8 kernels use.
    Read from /proc/cpuinfo's flags: py-cpuinfo would be a dependency for this one line."""
    cpuinfo = Path("/proc/cpuinfo")
    if platform.machine() not in ("x86_64", "AMD64") or not cpuinfo.exists():
        pytest.skip("reference vectors are recorded for x86-64 Linux CPUs only")
    flags = cpuinfo.read_text()
    return " avx512_vnni" in flags or " avx_vnni" in flags


@pytest.fixture(scope="module")
async def onnx() -> AsyncIterator[OnnxMiniLMEmbedder]:
    embedder = OnnxMiniLMEmbedder()
    yield embedder
    await embedder.aclose()


def test_the_installed_model_has_no_padding_ops() -> None:
    import onnx as onnx_format

    model = onnx_format.load(str(assets_module.default_quantized_model_path()))
    ops = Counter(node.op_type for node in model.graph.node)
    assert ops["Where"] == 0 and ops["IsNaN"] == 0
    assert ops["Softmax"] == 6 and ops["MatMulInteger"] >= 36


async def test_vectors_equal_the_model_with_the_mask(
    onnx: OnnxMiniLMEmbedder, tmp_path: Path
) -> None:
    masked = tmp_path / "masked.onnx"
    assets_module.quantize_model(assets_module.default_model_path(), masked)
    reference = OnnxMiniLMEmbedder(model_path=masked)
    try:
        ours, theirs = await onnx.embed(TEXTS), await reference.embed(TEXTS)
    finally:
        await reference.aclose()
    np.testing.assert_array_equal(ours, theirs)


async def test_vectors_match_the_stored_reference(onnx: OnnxMiniLMEmbedder) -> None:
    reference = REFERENCE_VNNI if cpu_has_vnni() else REFERENCE_SATURATING
    texts = list(reference)
    vectors = await onnx.embed(texts)
    for text, vector in zip(texts, vectors, strict=True):
        np.testing.assert_allclose(vector[:8], reference[text], atol=2e-3)


def test_dropping_twice_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "model.onnx"
    shutil.copy(assets_module.default_quantized_model_path(), copy)
    with pytest.raises(AssetError, match="expected 6 attention masks"):
        assets_module.drop_padding_ops(copy)


def test_a_model_of_an_older_recipe_is_re_derived(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    installed = assets_module.default_quantized_model_path()
    copy = tmp_path / installed.name
    shutil.copy(installed, copy)
    record = orjson.loads(installed.with_suffix(".json").read_bytes())
    del record["recipe"]
    copy.with_suffix(".json").write_bytes(orjson.dumps(record))
    monkeypatch.setattr(assets_module, "quantized_model_path", lambda: copy)
    problem = assets_module.quantized_model_problem()
    assert problem is not None and "older recipe" in problem
