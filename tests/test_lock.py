"""requirements/lock.txt holds what pyproject.toml asks for, every pin with its hashes, and the
image's requirements/service.txt pins the same versions (`make lock` writes both)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tools.lock_drift import pins

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "lock.txt"
SERVICE = ROOT / "requirements" / "service.txt"


def _asked(*, extras: tuple[str, ...]) -> list[Requirement]:
    """pyproject.toml's requirements (with the named extras, and memsvc[x] expanded) whose
    markers hold here, plus the build system's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    optional = project["project"]["optional-dependencies"]
    wanted = [Requirement(r) for r in project["build-system"]["requires"]]
    todo, seen = list(extras), set()
    wanted += [Requirement(r) for r in project["project"]["dependencies"]]
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in optional[extra]:
            req = Requirement(line)
            if canonicalize_name(req.name) == "memsvc":
                todo.extend(req.extras)
            else:
                wanted.append(req)
    return [r for r in wanted if r.marker is None or r.marker.evaluate()]


def _unmet(requirements: list[Requirement], pinned: dict[str, str]) -> list[str]:
    problems = []
    for req in requirements:
        version = pinned.get(canonicalize_name(req.name))
        if version is None:
            problems.append(f"{req.name}: not in the lock")
        elif not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name}: locked {version}, asked {req.specifier}")
    return problems


def _pins_without_hashes(path: Path) -> list[str]:
    """Every `name==version` entry of a hashed requirements file that carries no --hash."""
    blocks = re.split(r"\n(?=[A-Za-z0-9])", path.read_text(encoding="utf-8"))
    return [b.split()[0] for b in blocks if "==" in b.split("\n", 1)[0] and "--hash=" not in b]


def test_the_lock_holds_everything_pyproject_asks_for() -> None:
    assert _unmet(_asked(extras=("dev", "bench")), pins(LOCK)) == [], "run `make lock`"


def test_the_service_lock_holds_the_service_at_the_locked_versions() -> None:
    service, everything = pins(SERVICE), pins(LOCK)
    assert _unmet(_asked(extras=()), service) == [], "run `make lock`"
    assert {n: v for n, v in service.items() if everything.get(n) != v} == {}
    # The image installs no dev tool.
    assert {"pytest", "mypy", "ruff", "uv"}.isdisjoint(service)


def test_every_pin_has_its_hashes() -> None:
    assert _pins_without_hashes(LOCK) == []
    assert _pins_without_hashes(SERVICE) == []
    assert len(pins(LOCK)) > 50  # the parser found the pins at all


def test_an_unmet_range_is_reported() -> None:
    # The checks above can fail: a range the pinned version misses, and a package not pinned.
    assert _unmet([Requirement("redis>=99")], {"redis": "8.2.0"}) == [
        "redis: locked 8.2.0, asked >=99"
    ]
    assert _unmet([Requirement("nothere")], {}) == ["nothere: not in the lock"]
