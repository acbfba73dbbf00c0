"""The lines of an export, read back: each JSON line checked against the shape export/encode.py
writes, with the line number of the first thing wrong.

Unknown fields are ignored (a newer export may carry more); a missing or mistyped field, bad
JSON, or an unknown record type is an InvalidArgument naming the line. A "summary" line
checks the counts of the records since the previous summary (an export ends with one, so
concatenated exports import too).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import orjson
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from memsvc.errors import InvalidArgument

Text = Annotated[str, Field(max_length=1_000_000)]
# Times carry their offset (the export writes UTC with "Z"): a naive time is ambiguous.
Time = AwareDatetime
# Counters and revisions are PostgreSQL integers.
Int32 = Annotated[int, Field(ge=0, le=2**31 - 1)]


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class RecordScope(_Record):
    user_id: str = Field(min_length=1)
    persona_id: str = ""
    agent_id: str = ""


class Triple(_Record):
    subject: str
    predicate: str
    object: str


class SharingJson(_Record):
    all_agents: bool
    all_personas: bool


class Demoted(_Record):
    at: Time
    former_role: str
    was_pinned: bool
    summarised_into: uuid.UUID | None = None


class MemoryEditJson(_Record):
    """One in-place edit of a memory version (UpdateMemory), when the export carries them."""

    edit_id: uuid.UUID
    edited_at: Time
    fields: list[str]
    before: dict[str, Any]
    after: dict[str, Any]
    reason: str = ""


class MemoryLine(_Record):
    type: Literal["memory"]
    memory_id: uuid.UUID
    lineage_id: uuid.UUID
    scope: RecordScope
    content: Text = Field(min_length=1)
    triple: Triple | None
    category: str = Field(min_length=1)
    role: str = Field(min_length=1)
    confidence: float = Field(ge=0.0, le=1.0)
    reinforced_count: Int32
    pinned: bool
    status: Literal["active", "superseded"]
    valid_from: Time
    invalid_at: Time | None
    recorded_at: Time
    last_reinforced_at: Time | None
    last_referenced_at: Time | None = None
    supersedes_id: uuid.UUID | None
    superseded_by_id: uuid.UUID | None
    source_message_ids: list[str]
    session_id: str
    ingest_id: uuid.UUID | None = None
    origin: str = Field(min_length=1)
    correction_reason: str
    retention_policy: str = Field(min_length=1)
    expires_at: Time | None
    sharing: SharingJson
    demoted: Demoted | None = None
    # Added with UpdateMemory: optional, so older exports import as well.
    updated_at: Time | None = None
    edits: list[MemoryEditJson] = []


class EpisodeLine(_Record):
    type: Literal["episode"]
    episode_id: uuid.UUID
    scope: RecordScope
    session_id: str = Field(min_length=1)
    title: Text
    summary: Text
    excerpt: Text
    source_message_ids: list[str]
    started_at: Time
    ended_at: Time
    recorded_at: Time
    expires_at: Time | None
    memory_ids: list[uuid.UUID]
    topic_ids: list[uuid.UUID]


class TopicLine(_Record):
    type: Literal["topic"]
    topic_id: uuid.UUID
    scope: RecordScope
    name: str = Field(min_length=1)
    is_persona: bool
    weight: float = Field(ge=0.0, le=1e30, allow_inf_nan=False)
    last_episode_at: Time | None
    created_at: Time
    episode_ids: list[uuid.UUID]


class MessageLine(_Record):
    type: Literal["message"]
    scope: RecordScope
    session_id: str = Field(min_length=1)
    message_id: str = Field(min_length=1)
    sender_id: str = Field(min_length=1)
    # Exports written before sender_name existed have none. As Ingest takes it: printable,
    # surrounding blanks dropped.
    sender_name: str = Field(default="", max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$")
    role: Literal["user", "assistant", "system", "tool"]
    text: Text = Field(min_length=1)
    sent_at: Time
    recorded_at: Time
    ingest_id: uuid.UUID | None
    retention_policy: str = Field(min_length=1)
    expires_at: Time | None


class CoreBlockLine(_Record):
    """One revision of a core block (persona or human) of one scope."""

    type: Literal["core_block"]
    scope: RecordScope
    block: Literal["persona", "human"]
    revision: Int32 = Field(ge=1)
    text: Text
    mode: Literal["replace", "append"]
    author: str = Field(min_length=1)
    reason: str = ""
    recorded_at: Time
    replaced_at: Time | None


class SummaryLine(_Record):
    type: Literal["summary"]
    counts: dict[str, Int32]


Line = MemoryLine | EpisodeLine | TopicLine | MessageLine | CoreBlockLine
_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    "memory": TypeAdapter(MemoryLine),
    "episode": TypeAdapter(EpisodeLine),
    "topic": TypeAdapter(TopicLine),
    "message": TypeAdapter(MessageLine),
    "core_block": TypeAdapter(CoreBlockLine),
    "summary": TypeAdapter(SummaryLine),
}
KINDS = ("memory", "episode", "topic", "message", "core_block")


@dataclass
class Parsed:
    """Every record of an import, by kind, in the order sent, and the lines read."""

    lines: int = 0
    # (line number, record) of each kind.
    memories: list[tuple[int, MemoryLine]] = field(default_factory=list)
    episodes: list[tuple[int, EpisodeLine]] = field(default_factory=list)
    topics: list[tuple[int, TopicLine]] = field(default_factory=list)
    messages: list[tuple[int, MessageLine]] = field(default_factory=list)
    core_blocks: list[tuple[int, CoreBlockLine]] = field(default_factory=list)


def _describe(error: ValidationError) -> str:
    """The first error's field and rule, never the line's values: pydantic's message up to
    its first comma (what follows may quote the input: "found `z` at 1"), and no key of a
    free-form map (summary.counts) in the field's name."""
    first = error.errors(include_url=False)[0]
    parts: list[str] = []
    for part in first["loc"]:
        if isinstance(part, str) and parts and parts[-1] == "counts":
            parts.append("[key]")
        else:
            parts.append(str(part))
    where = ".".join(parts) or "record"
    return f"{where}: {str(first['msg']).split(',')[0]}"


def _has_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def parse_line(number: int, text: str) -> Line | SummaryLine:
    """One line as its record, or InvalidArgument naming the line (1-based) and the field."""
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"line {number}: not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise InvalidArgument(f"line {number}: not a JSON object")
    if _has_nul(obj):
        raise InvalidArgument(f"line {number}: a text holds a NUL character (\\u0000)")
    kind = obj.get("type")
    adapter = _ADAPTERS.get(kind) if isinstance(kind, str) else None
    if adapter is None:
        raise InvalidArgument(
            f"line {number}: type: not a known record type; one of " + ", ".join(_ADAPTERS)
        )
    try:
        record: Line | SummaryLine = adapter.validate_python(obj)
    except ValidationError as exc:
        raise InvalidArgument(f"line {number}: {kind}.{_describe(exc)}") from None
    return record


def parse(lines: Iterable[tuple[int, str]]) -> Parsed:
    """Every (line number, JSON text) checked and sorted by kind; summaries check counts."""
    out = Parsed()
    since_summary: Counter[str] = Counter()
    for number, text in lines:
        out.lines += 1
        record = parse_line(number, text)
        if isinstance(record, SummaryLine):
            if not set(record.counts) <= set(KINDS):
                raise InvalidArgument(
                    f"line {number}: summary.counts: a key is not a record type; one of "
                    + ", ".join(KINDS)
                )
            for kind in KINDS:
                expected = record.counts.get(kind, 0)
                if since_summary[kind] != expected:
                    raise InvalidArgument(
                        f"line {number}: the summary counts {expected} {kind} record(s) but "
                        f"{since_summary[kind]} came before it; the export is incomplete or "
                        "was edited"
                    )
            since_summary.clear()
            continue
        since_summary[record.type] += 1
        if isinstance(record, MemoryLine):
            out.memories.append((number, record))
        elif isinstance(record, EpisodeLine):
            out.episodes.append((number, record))
        elif isinstance(record, TopicLine):
            out.topics.append((number, record))
        elif isinstance(record, MessageLine):
            out.messages.append((number, record))
        else:
            out.core_blocks.append((number, record))
    return out
