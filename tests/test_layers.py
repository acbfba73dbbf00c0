"""The package's imports run down the layers the README describes, never back up."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "memsvc"

# Lower numbers are lower layers; a module may import its own layer and those below it.
LAYER = {
    "errors": 0,
    "config": 0,
    "v1": 0,
    "concurrency": 0,
    "observability": 0,
    "overload": 1,
    "storage": 1,
    "cache": 1,
    "embedding": 1,
    "embedded": 1,
    "http": 1,
    "wire": 2,
    "extraction": 2,
    "governance": 2,
    "retrieval": 3,
    "prefetch": 3,
    "ingest": 3,
    "memories": 3,
    "export": 3,
    "server": 4,
    "cli": 5,
    "__main__": 5,
}
# The Python client ships in the package but talks to the server only over gRPC.
CLIENT_MAY_IMPORT = {"client", "v1", "concurrency"}
TOP_LEVEL_MODULES = {"__init__", "__main__", "cli", "config", "errors"}


def _part(module: str) -> str:
    return module.split(".")[1]


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "memsvc":
                found += [f"memsvc.{alias.name}" for alias in node.names]
            elif node.module.startswith("memsvc."):
                found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("memsvc.")]
    return found


def _sources() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "v1" not in p.relative_to(ROOT).parts)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_down_the_layers(path: Path) -> None:
    part = path.relative_to(ROOT).parts[0].removesuffix(".py")
    if part == "__init__":
        return
    wrong = []
    for module in _imports(path):
        target = _part(module)
        if part == "client":
            if target not in CLIENT_MAY_IMPORT:
                wrong.append(module)
        elif target == "client" or LAYER[target] > LAYER[part]:
            wrong.append(module)
    assert not wrong, f"{path.relative_to(ROOT)} imports upward: {wrong}"


def test_no_loose_modules_at_the_top() -> None:
    loose = {p.stem for p in ROOT.glob("*.py")} - TOP_LEVEL_MODULES
    assert not loose, f"modules belong in a layer's folder: {sorted(loose)}"


def test_every_folder_has_a_layer() -> None:
    folders = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert folders <= set(LAYER) | {"client"}, sorted(folders - set(LAYER) - {"client"})


def test_readme_layout_matches_the_tree() -> None:
    readme = (ROOT.parent / "README.md").read_text()
    layout = readme[readme.index("## Layout") :]
    layout = layout.split("\n## ")[0]
    named = set(re.findall(r"memsvc/(\w+)/", layout))
    folders = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert named == folders, (
        f"README layout names {sorted(named - folders)} that do not exist"
        f" and misses {sorted(folders - named)}"
    )


def test_the_product_never_imports_tests_bench_or_tools() -> None:
    """tools/ (generators, the test clusters), tests/ and bench/ stand on the product; the
    installed package holds none of them, so an import of one would fail in production."""
    wrong = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            wrong += [
                f"{path.relative_to(ROOT)}: {name}"
                for name in names
                if name.split(".")[0] in {"tools", "tests", "bench"}
            ]
    assert wrong == []


SERVICES = {"retrieval", "prefetch", "ingest", "memories", "export"}


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_service_uses_another_service_only_through_what_it_exports(path: Path) -> None:
    """A service package may use another only by the names its __init__ exports (`from
    memsvc.retrieval import rrf`), never by reaching into one of its modules."""
    part = path.relative_to(ROOT).parts[0]
    if part not in SERVICES:
        return
    wrong = []
    for module in _imports(path):
        pieces = module.split(".")
        if pieces[1] in SERVICES and pieces[1] != part and len(pieces) > 2:
            wrong.append(module)
    assert wrong == [], f"{path.relative_to(ROOT)} reaches into another service: {wrong}"


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_what_a_service_exports_exists(service: str) -> None:
    package = importlib.import_module(f"memsvc.{service}")
    missing = [name for name in getattr(package, "__all__", []) if not hasattr(package, name)]
    assert missing == []
