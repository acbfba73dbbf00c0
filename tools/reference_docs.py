"""The documentation's generated pages: the configuration reference from `Settings` and the
error reference from the error tree and the contract's comments.

    python -m tools.reference_docs           rewrite docs/reference/*.md
    python -m tools.reference_docs --check   exit 1 when a page differs from the code

`tests/test_reference_docs.py` runs the check in `make test`; `mkdocs build --strict` (in `make
docs`) then renders them with the rest of the site. The product never imports this module."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2

from memsvc import errors
from memsvc.config import ENV_SETTINGS, Settings

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
PROTO = "memsvc/v1/memory.proto"

CONFIGURATION_INTRO = """\
# Configuration

Read once at start from the environment (flags of `memsvc dev/serve` win). Every field of
`memsvc.config.Settings` is set by `MEMSVC_` and its name in capitals, and nothing else is
read. Values are parsed strictly, and a bad one stops the command with a message naming the
variable: booleans are `true/false/1/0/yes/no/on/off` (any case), integers are plain digits,
numbers are finite, lists are comma-separated, and an empty variable counts as unset. Keys and
connection strings stay out of `repr(settings)`.

This page is generated from `memsvc/config.py` (`python -m tools.reference_docs`); the suite
fails when it drifts from the code.
"""

ERRORS_INTRO = """\
# Errors

Bad input is `INVALID_ARGUMENT` with a message that starts with the field name and states the
rule it broke (never the value sent), and writes nothing. An id not in the caller's exact
scope (or tenant) is `NOT_FOUND`. Missing or wrong key: `UNAUTHENTICATED`. Correcting an
already superseded version: `FAILED_PRECONDITION`. A database or embedder outage:
`UNAVAILABLE` (safe to retry); no free connection in time: `RESOURCE_EXHAUSTED`; a per-tenant
limit or the read cap: `RESOURCE_EXHAUSTED` with a retry hint (`retry-after-ms`,
`google.rpc.RetryInfo`). If the embedder fails on Remember, the memory is still stored, marked
`missing` in its embedding projection so it can be re-embedded later. Clients never see
`UNKNOWN`.

This page is generated from `memsvc/errors.py` and the comments of
`protos/memsvc/v1/memory.proto` (`python -m tools.reference_docs`); the suite fails when it
drifts from them.
"""


def _cell(value: object) -> str:
    if value is None or value in ("", ()):
        return ""
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, tuple):
        text = ",".join(
            f"{item[0]}={item[1]:g}" if isinstance(item, tuple) else str(item) for item in value
        )
    else:
        text = str(value)
    return f"`{text}`".replace("|", "\\|")


def settings_table() -> list[str]:
    """One row per Settings field: its variable, default and description."""
    defaults = Settings()
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for spec in ENV_SETTINGS:
        default = _cell(getattr(defaults, spec.field))
        meaning = spec.help.replace("|", "\\|")
        rows.append(f"| `{spec.variable}` | {default} | {meaning} |")
    return rows


def configuration_page() -> str:
    return CONFIGURATION_INTRO + "\n" + "\n".join(settings_table()) + "\n"


def _error_classes() -> list[type[errors.MemsvcError]]:
    found: list[type[errors.MemsvcError]] = []
    stack: list[type[errors.MemsvcError]] = [errors.MemsvcError]
    while stack:
        cls = stack.pop(0)
        found.append(cls)
        stack.extend(cls.__subclasses__())
    return [cls for cls in found if cls.__module__ == errors.__name__]


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _rpc_comments() -> list[tuple[str, str, str]]:
    """(rpc, streaming form, leading comment) for each RPC of the contract, in its order."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "contract.pb"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{ROOT / 'protos'}",
                "--include_source_info",
                f"--descriptor_set_out={out}",
                PROTO,
            ],
            check=True,
        )
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    contract = next(f for f in files.file if f.name == PROTO)
    service_index = 0
    comments = {tuple(loc.path): loc.leading_comments for loc in contract.source_code_info.location}
    rpcs = []
    service = contract.service[service_index]
    for index, method in enumerate(service.method):
        # Path of a method: service (6), its index, method (2), the method's index.
        comment = comments.get((6, service_index, 2, index), "")
        shape = (
            f"{'stream ' if method.client_streaming else ''}{method.input_type.split('.')[-1]}"
            f" → {'stream ' if method.server_streaming else ''}"
            f"{method.output_type.split('.')[-1]}"
        )
        rpcs.append((method.name, shape, comment))
    return rpcs


_STATUS = re.compile(r"\b(" + "|".join(code.name for code in grpc.StatusCode) + r")\b")


def errors_page() -> str:
    lines = [ERRORS_INTRO, "## The error tree", ""]
    lines += ["| error | gRPC status | meaning |", "|---|---|---|"]
    for cls in _error_classes():
        lines.append(f"| `{cls.__name__}` | `{cls.code.name}` | {_one_line(cls.__doc__)} |")
    lines += ["", "## Statuses by RPC", ""]
    lines += ["| RPC | statuses it answers besides `OK` |", "|---|---|"]
    rpcs = _rpc_comments()
    for name, _, comment in rpcs:
        codes = sorted(set(_STATUS.findall(comment)) - {"OK"})
        listed = ", ".join(f"`{code}`" for code in codes) or "—"
        lines.append(f"| [`{name}`](#{name.lower()}) | {listed} |")
    for name, shape, comment in rpcs:
        lines += ["", f"### {name}", "", f"`{shape}`", "", _one_line(comment)]
    return "\n".join(lines) + "\n"


PAGES = {"configuration.md": configuration_page, "errors.md": errors_page}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when a page is stale")
    args = parser.parse_args(argv)
    stale = []
    for name, build in PAGES.items():
        path = REFERENCE / name
        text = build()
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)} (rewrite with `python -m tools.reference_docs`)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
