"""Content normalisation and the exact-duplicate key (pure functions)."""

from __future__ import annotations

import hashlib
import re
import unicodedata

_SPACE = re.compile(r"\s+")


def normalize_content(text: str) -> str:
    """The stored form: Unicode NFC, runs of whitespace collapsed, ends trimmed."""
    return _SPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()


def content_hash(text: str) -> bytes:
    """Key of exact duplicates: the normalised text, case-folded, without a final period.

    "I like tea." and "i like tea" are the same statement; anything else is not exact.
    """
    key = normalize_content(text).casefold().rstrip(".!").rstrip()
    return hashlib.sha256(key.encode("utf-8")).digest()
