"""The spaCy model's files, checked against the sha256 pinned here before it is loaded.

The wheel itself is pinned by hash (requirements/spacy-model.txt). These per-file hashes
guard what is on disk afterwards, and record the comparison with Explosion's official
en_core_web_sm 3.8.0 (wheel sha256 1932429d…0fb85, published in the spacy-models meta): the
re-upload's performance figures, spaCy git version and labels equal the official meta's, and
the files marked "official" have the same sha256 as recorded from the official wheel
elsewhere; the rest had no official per-file reference to compare with.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

# Relative to the model's data directory: sha256 (hex).
MODEL_FILES = {
    "config.cfg": "65c545ca2da5bd4b87b22d4917318605360b37dee6ed6b18516a036f87319f79",  # official
    "tokenizer": "b014e8bba4958b120af2d0c1c63eabb7c00379f2bacaf10df7c5325efd2ea467",  # official
    "tok2vec/model": "e84fc06eb319c94d28e460fc334e292120b01f18baa5dc8b50c977459820a090",  # official
    "tagger/model": "1ec3d93f38cebe172f2b5c89d84be72856ce42c8f1a64f1699f1d98a771f36b7",  # official
    "vocab/strings.json": "b1966d1f07a05b68576df07f43f40203b4e11124ad82cc839e8312ad8d7fdae7",  # official
    "vocab/lookups.bin": "fce9c883c56165f29573cc938c2a1c9d417ac61bd8f56b671dd5f7996de70682",  # official
    "parser/model": "e0098910535a863d430082ece57455d5fa071cd4ca3a0054e80582076c752b1e",
    "ner/model": "cd93e9ca9126c69f1d10a1039ef67c3d9ec1223b44d079856705970f0f19ff4e",
    "senter/model": "b69e7174a0b6307739adec3c8053ac45fdbad7171c4d3d8bfcd9713ecbc01f8c",
    "lemmatizer/lookups/lookups.bin": "eb64f40c0f8396d1762730c0ddf4dad2a52d138f5a389f71a1a1d088173b7737",
    "attribute_ruler/patterns": "f8b97f7ebef9b8536bba5f0fc1e73af6183563e96e2325bcbb021b8c6dbc6683",
    "ner/moves": "d82b13473ebd33e0396004dd22f00c71fe3c1251742bf1f7c4554f23fd3b0af4",
    "parser/moves": "ec41318c32eb7f9e4d8f050b2e8466ee67954d2d3455c1aec73abf46c82dd67f",
}


class ModelFileError(RuntimeError):
    """An installed model file is missing or differs from its pinned sha256."""


def verify_model_files(data_dir: Path) -> None:
    """Raise ModelFileError unless every pinned file is there with its sha256."""
    for relative, expected in MODEL_FILES.items():
        path = data_dir / relative
        if not path.is_file():
            raise ModelFileError(f"spaCy model file missing: {path}; run `make install`")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != expected:
            raise ModelFileError(
                f"spaCy model file {relative} has sha256 {digest}, expected {expected}:"
                " reinstall with `make install` (requirements/spacy-model.txt)"
            )
