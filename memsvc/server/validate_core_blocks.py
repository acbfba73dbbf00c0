"""Validation of the core-block RPCs: proto in, domain values out, InvalidArgument naming the
field on anything wrong (before anything is read or written)."""

from __future__ import annotations

import re
import unicodedata

from memsvc.config import Settings
from memsvc.errors import InvalidArgument
from memsvc.memories.core_blocks import APPEND, DEFAULT_AUTHOR, HUMAN, PERSONA, REPLACE, BlockUpdate
from memsvc.server import validate
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb

MAX_REASON_CHARS = 500
DEFAULT_HISTORY_PAGE = 50
MAX_HISTORY_PAGE = 500
_AUTHOR = re.compile(r"[a-z0-9_-]{1,64}")
_BLOCKS = {pb.CORE_BLOCK_KIND_PERSONA: PERSONA, pb.CORE_BLOCK_KIND_HUMAN: HUMAN}
_MODES = {pb.CORE_BLOCK_MODE_REPLACE: REPLACE, pb.CORE_BLOCK_MODE_APPEND: APPEND}
_LINE_ENDS = re.compile(r"\r\n?")
_TRAILING_SPACE = re.compile(r"[ \t]+\n")


def block(value: int, field: str = "block") -> str:
    try:
        return _BLOCKS[value]  # type: ignore[index]
    except KeyError:
        raise InvalidArgument(
            f"{field}: required, CORE_BLOCK_KIND_PERSONA or CORE_BLOCK_KIND_HUMAN"
        ) from None


def mode(value: int) -> str:
    try:
        return _MODES[value]  # type: ignore[index]
    except KeyError:
        raise InvalidArgument(
            "mode: required, CORE_BLOCK_MODE_REPLACE or CORE_BLOCK_MODE_APPEND"
        ) from None


def text(value: str, how: str, settings: Settings) -> str:
    """Block text keeps its line breaks (each line is trimmed at its end); no other control
    characters. At most the largest packet budget (a tenant's block limit is checked when
    writing)."""
    normalized = unicodedata.normalize("NFC", _LINE_ENDS.sub("\n", value))
    normalized = _TRAILING_SPACE.sub("\n", normalized).strip()
    if how == APPEND and not normalized:
        raise InvalidArgument("text: required and must not be blank with CORE_BLOCK_MODE_APPEND")
    if len(normalized) > settings.packet_max_chars:
        raise InvalidArgument(f"text: at most {settings.packet_max_chars:,} characters")
    if validate._has_control(normalized, allow_newlines=True):
        raise InvalidArgument("text: must not contain control characters (line breaks aside)")
    return normalized


def author(value: str) -> str:
    if not value:
        return DEFAULT_AUTHOR
    if not _AUTHOR.fullmatch(value):
        raise InvalidArgument("author: 1..64 characters of a-z, 0-9, '_' and '-'")
    return value


def update(request: pb.UpdateCoreBlockRequest, tenant: str, settings: Settings) -> BlockUpdate:
    scope = validate.scope(request.scope, tenant, settings, present=request.HasField("scope"))
    kind = block(request.block)
    how = mode(request.mode)
    if request.expected_revision < 0:
        raise InvalidArgument("expected_revision: must be >= 0 (0: whatever is current)")
    return BlockUpdate(
        scope=scope,
        block=kind,
        mode=how,
        text=text(request.text, how, settings),
        author=author(request.author),
        reason=validate.short_text(request.reason, "reason", MAX_REASON_CHARS),
        expected_revision=request.expected_revision,
    )


def history(
    request: pb.GetCoreBlockHistoryRequest, tenant: str, settings: Settings
) -> tuple[Scope, str, int]:
    scope = validate.scope(request.scope, tenant, settings, present=request.HasField("scope"))
    kind = block(request.block)
    size = request.page_size or DEFAULT_HISTORY_PAGE
    if not 1 <= size <= MAX_HISTORY_PAGE:
        raise InvalidArgument(
            f"page_size: 0 (default {DEFAULT_HISTORY_PAGE}) to {MAX_HISTORY_PAGE}"
        )
    return scope, kind, size
