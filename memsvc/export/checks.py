"""ImportMemories' checks of the records themselves: the limits and time bounds that Remember
and Ingest apply, so an import cannot store what those refuse.

Pure functions over the parsed lines (export/parse.py checked their shape); each refusal is
an InvalidArgument naming the line and the field, never its value. The checks that need the
database (an id already used in another scope, a link to nothing) are the importer's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from memsvc.errors import InvalidArgument
from memsvc.export.parse import Parsed
from memsvc.governance import time_bounds

# As Remember's subject, predicate and object (server/validate.py MAX_TRIPLE_CHARS).
MAX_TRIPLE_CHARS = 200


@dataclass(frozen=True)
class RecordLimits:
    """This server's limits on what a write path stores (MEMSVC_MAX_*_CHARS)."""

    max_content_chars: int
    max_message_chars: int
    max_triple_chars: int = MAX_TRIPLE_CHARS


def _too_long(number: int, field: str, limit: int) -> InvalidArgument:
    return InvalidArgument(f"line {number}: {field}: at most {limit} characters")


def _check_time(number: int, field: str, value: datetime | None, now: datetime) -> None:
    if value is not None and not time_bounds.within(value, now=now):
        raise InvalidArgument(f"line {number}: {field}: must be {time_bounds.RULE}")


def check_records(parsed: Parsed, limits: RecordLimits, *, now: datetime | None = None) -> None:
    """InvalidArgument for the first record a write path would have refused: a memory's
    content or triple past Remember's limits, a message's text past Ingest's, or a time of
    something that happened (valid_from, recorded_at, sent_at...) outside the bounds of
    governance.time_bounds. Times that are about the future by nature (expires_at) and the
    end of a validity (invalid_at) are not checked here."""
    at = now or datetime.now(UTC)
    for number, m in parsed.memories:
        if len(m.content) > limits.max_content_chars:
            raise _too_long(number, "memory.content", limits.max_content_chars)
        if m.triple is not None:
            for name in ("subject", "predicate", "object"):
                if len(getattr(m.triple, name)) > limits.max_triple_chars:
                    raise _too_long(number, f"memory.triple.{name}", limits.max_triple_chars)
        _check_time(number, "memory.valid_from", m.valid_from, at)
        _check_time(number, "memory.recorded_at", m.recorded_at, at)
        _check_time(number, "memory.last_reinforced_at", m.last_reinforced_at, at)
        _check_time(number, "memory.updated_at", m.updated_at, at)
    for number, msg in parsed.messages:
        if len(msg.text) > limits.max_message_chars:
            raise _too_long(number, "message.text", limits.max_message_chars)
        _check_time(number, "message.sent_at", msg.sent_at, at)
        _check_time(number, "message.recorded_at", msg.recorded_at, at)
    for number, e in parsed.episodes:
        for name in ("started_at", "ended_at", "recorded_at"):
            _check_time(number, f"episode.{name}", getattr(e, name), at)
    for number, t in parsed.topics:
        _check_time(number, "topic.created_at", t.created_at, at)
        _check_time(number, "topic.last_episode_at", t.last_episode_at, at)
    for number, b in parsed.core_blocks:
        _check_time(number, "core_block.recorded_at", b.recorded_at, at)
