"""Which installed packages differ from requirements/lock.txt (make test-latest prints it).

Usage: python tools/lock_drift.py FREEZE LOCK [LOCK...]: FREEZE is a `pip freeze`, each LOCK a
hashed requirements file (the lock, and the spaCy model pinned on its own).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name

# `name==version ; marker \` as uv and pip freeze write them (the hashes follow on their own lines).
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)\s*(?:;([^\\]*))?")


def pins(path: Path) -> dict[str, str]:
    """Package name (canonical) -> version, for every `name==version` line of a requirements
    file whose environment marker holds for this interpreter (a universal lock pins some
    packages once per Python version)."""
    found: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _PIN.match(line)
        if match and (not match[3] or Marker(match[3].strip()).evaluate()):
            found[canonicalize_name(match[1])] = match[2]
    return found


def main(freeze_path: str, *lock_paths: str) -> int:
    installed = pins(Path(freeze_path))
    locked: dict[str, str] = {}
    for lock_path in lock_paths:
        locked |= pins(Path(lock_path))
    moved = sorted(n for n in locked.keys() & installed.keys() if locked[n] != installed[n])
    added = sorted(installed.keys() - locked.keys())
    against = ", ".join(lock_paths)
    print(f"newest allowed releases against {against}: {len(moved)} moved, {len(added)} new")
    for name in moved:
        print(f"  {name}: {locked[name]} -> {installed[name]}")
    for name in added:
        print(f"  {name}: new, {installed[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
