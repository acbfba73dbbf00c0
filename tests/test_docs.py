"""The documentation: generated reference pages match the code, and every relative link of the
README and of the site points at a file that exists (`mkdocs build --strict`, in `make docs`,
checks the site's own links and nav)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools import reference_docs

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("name", sorted(reference_docs.PAGES))
def test_generated_reference_page_is_current(name: str) -> None:
    page = reference_docs.REFERENCE / name
    assert page.read_text() == reference_docs.PAGES[name](), (
        f"docs/reference/{name} differs from the code: rewrite it with "
        "`python -m tools.reference_docs`"
    )


def test_every_setting_is_in_the_configuration_reference() -> None:
    text = (reference_docs.REFERENCE / "configuration.md").read_text()
    for spec in reference_docs.ENV_SETTINGS:
        assert f"| `{spec.variable}` |" in text, spec.variable


def test_every_rpc_is_in_the_error_reference() -> None:
    text = (reference_docs.REFERENCE / "errors.md").read_text()
    from memsvc.v1 import memory_pb2

    for method in memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].methods:
        assert f"### {method.name}\n" in text, method.name


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    targets = [t for t in LINK.findall(text) if not t.startswith(("http://", "https://"))]
    assert targets, "the README links to no page of the manual"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert missing == [], missing
