"""Request validation: proto messages in, domain values out, InvalidArgument on anything wrong."""

from __future__ import annotations

import dataclasses
import math
import unicodedata
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from memsvc.config import Settings
from memsvc.errors import InvalidArgument
from memsvc.governance import time_bounds
from memsvc.ingest.command import IngestCommand
from memsvc.server import page_tokens
from memsvc.storage.messages import StoredMessage
from memsvc.storage.model import ListQuery, NewMemory, Scope, Sharing
from memsvc.storage.normalize import normalize_content
from memsvc.v1 import memory_pb2 as pb

DEFAULT_EXPLICIT_CONFIDENCE = 0.9
MAX_TRIPLE_CHARS = 200
# Timestamps outside this range are almost always unit mistakes (ms sent as s, or zero).
_MIN_TS = datetime(1900, 1, 1, tzinfo=UTC)
_MAX_TS = datetime(2200, 1, 1, tzinfo=UTC)


def _has_control(text: str, *, allow_newlines: bool) -> bool:
    for ch in text:
        if allow_newlines and ch in "\n\r\t":
            continue
        if unicodedata.category(ch) in ("Cc", "Cs"):
            return True
    return False


def identifier(value: str, field: str, settings: Settings, *, required: bool) -> str:
    """An id-like field: trimmed-equal, bounded, printable."""
    if not value:
        if required:
            raise InvalidArgument(f"{field}: required")
        return ""
    if len(value) > settings.max_id_chars:
        raise InvalidArgument(f"{field}: at most {settings.max_id_chars} characters")
    if value != value.strip():
        raise InvalidArgument(f"{field}: must not start or end with whitespace")
    if _has_control(value, allow_newlines=False):
        raise InvalidArgument(f"{field}: must not contain control characters")
    return value


def scope(msg: pb.Scope, tenant_id: str, settings: Settings, *, present: bool = True) -> Scope:
    """The caller's exact scope; user_id is required, the tenant comes from credentials."""
    if not present:
        raise InvalidArgument("scope: required (scope.user_id at least)")
    return Scope(
        tenant_id=tenant_id,
        user_id=identifier(msg.user_id, "scope.user_id", settings, required=True),
        persona_id=identifier(msg.persona_id, "scope.persona_id", settings, required=False),
        agent_id=identifier(msg.agent_id, "scope.agent_id", settings, required=False),
    )


def content(value: str, field: str, settings: Settings) -> str:
    """Free text of a memory: non-empty, bounded, no control characters but line breaks."""
    text = normalize_content(value)
    if not text:
        raise InvalidArgument(f"{field}: required and must not be blank")
    if len(text) > settings.max_content_chars:
        raise InvalidArgument(f"{field}: at most {settings.max_content_chars} characters")
    if _has_control(text, allow_newlines=True):
        raise InvalidArgument(f"{field}: must not contain control characters")
    return text


def vocabulary(value: str, field: str, allowed: tuple[str, ...], default: str) -> str:
    """A value of a closed vocabulary (case-insensitive), or the default when empty."""
    if not value:
        return default
    normalized = value.strip().lower()
    if normalized not in allowed:
        raise InvalidArgument(f"{field}: not one of {', '.join(allowed)}")
    return normalized


def confidence(value: float) -> float:
    if math.isnan(value) or value < 0.0 or value > 1.0:
        raise InvalidArgument("confidence: must be between 0 and 1")
    return value if value > 0.0 else DEFAULT_EXPLICIT_CONFIDENCE


def short_text(value: str, field: str, limit: int) -> str:
    if len(value) > limit:
        raise InvalidArgument(f"{field}: at most {limit} characters")
    if _has_control(value, allow_newlines=False):
        raise InvalidArgument(f"{field}: must not contain control characters")
    return value.strip()


def id_list(values: Iterable[str], field: str, settings: Settings, limit: int) -> tuple[str, ...]:
    items = list(values)
    if len(items) > limit:
        raise InvalidArgument(f"{field}: at most {limit} entries")
    return tuple(
        identifier(v, f"{field}[{i}]", settings, required=True) for i, v in enumerate(items)
    )


def memory_id(value: str, field: str = "memory_id") -> uuid.UUID:
    if not value:
        raise InvalidArgument(f"{field}: required")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(f"{field}: not a memory id (a UUID)") from None


def timestamp(ts: Timestamp, field: str) -> datetime:
    if not 0 <= ts.nanos < 1_000_000_000:
        raise InvalidArgument(f"{field}: nanos out of range")
    try:
        value = datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, tz=UTC)
    except (OverflowError, OSError, ValueError):
        raise InvalidArgument(f"{field}: out of range") from None
    if not _MIN_TS <= value <= _MAX_TS:
        raise InvalidArgument(f"{field}: must be between 1900 and 2200")
    return value


def valid_from(ts: Timestamp) -> datetime:
    """When a remembered fact began to hold: from 1900 up to a day after now (a fact that
    only holds later is a plan, not a current memory)."""
    return bounded_time(ts, "valid_from")


def bounded_time(ts: Timestamp, field: str) -> datetime:
    """A time something happened (governance.time_bounds): from 1900 up to a day after now."""
    value = timestamp(ts, field)
    if not time_bounds.within(value):
        raise InvalidArgument(
            f"{field}: must be {time_bounds.RULE} (a time that has not come yet is not"
            " something that happened)"
        )
    return value


def triple(request: pb.RememberRequest) -> tuple[str, str, str]:
    """subject, predicate and object: all three set, or none."""
    parts = {
        name: short_text(getattr(request, name), name, MAX_TRIPLE_CHARS)
        for name in ("subject", "predicate", "object")
    }
    missing = [name for name, text in parts.items() if not text]
    if len(missing) not in (0, 3):
        given = ", ".join(name for name in parts if name not in missing)
        raise InvalidArgument(
            f"{missing[0]}: subject, predicate and object go together (all three or none); "
            f"got {given} without {', '.join(missing)}"
        )
    return parts["subject"], parts["predicate"], parts["object"]


# A memory's time to live: at least a second, at most ten years (leap days included).
MIN_TTL_S = 1
MAX_TTL_S = 3_653 * 86_400


def retention(request: pb.RememberRequest, session_id: str, settings: Settings) -> dict[str, Any]:
    """The NewMemory retention fields of a Remember: policy and seconds to live."""
    policy = request.retention_policy
    has_ttl = request.HasField("ttl")
    if policy in (pb.RETENTION_POLICY_UNSPECIFIED, pb.RETENTION_POLICY_USER_CONTROLLED):
        if has_ttl:
            raise InvalidArgument("ttl: only with retention_policy RETENTION_POLICY_TTL")
        return {"retention_policy": "user-controlled"}
    if policy == pb.RETENTION_POLICY_SESSION:
        if has_ttl:
            raise InvalidArgument(
                "ttl: only with retention_policy RETENTION_POLICY_TTL (a SESSION memory lasts "
                "until its session ends)"
            )
        if not session_id:
            raise InvalidArgument("session_id: required with retention_policy SESSION")
        return {"retention_policy": "session", "expires_in_s": float(settings.session_retention_s)}
    if policy == pb.RETENTION_POLICY_TTL:
        if not has_ttl:
            raise InvalidArgument("ttl: required with retention_policy RETENTION_POLICY_TTL")
        ttl = request.ttl
        if not -999_999_999 <= ttl.nanos <= 999_999_999 or (ttl.seconds * ttl.nanos < 0):
            raise InvalidArgument("ttl: not a valid duration (seconds and nanos disagree)")
        seconds = ttl.seconds + ttl.nanos / 1e9
        if not MIN_TTL_S <= seconds <= MAX_TTL_S:
            raise InvalidArgument(f"ttl: between {MIN_TTL_S} s and 10 years ({MAX_TTL_S} s)")
        return {"retention_policy": "ttl", "expires_in_s": seconds}
    raise InvalidArgument("retention_policy: unknown value; not a RetentionPolicy")


def remember(request: pb.RememberRequest, settings: Settings) -> NewMemory:
    session_id = identifier(request.session_id, "session_id", settings, required=False)
    subject, predicate, object_ = triple(request)
    return NewMemory(
        content=content(request.content, "content", settings),
        category=vocabulary(request.category, "category", settings.categories, "context"),
        role=vocabulary(request.role, "role", settings.roles, "context"),
        confidence=confidence(request.confidence),
        pinned=request.pinned,
        subject=subject,
        predicate=predicate,
        object=object_,
        source_message_ids=id_list(
            request.source_message_ids, "source_message_ids", settings, settings.max_source_ids
        ),
        session_id=session_id,
        sharing=Sharing(request.sharing.all_agents, request.sharing.all_personas),
        valid_from=valid_from(request.valid_from) if request.HasField("valid_from") else None,
        **retention(request, session_id, settings),
    )


_MEMORIES = "memories"


def memories_listing(scope: Scope, query: ListQuery) -> str:
    """The digest a ListMemories page token is bound to: the scope and every filter."""
    return page_tokens.listing(
        _MEMORIES,
        scope.key,
        query.include_superseded,
        sorted(query.categories),
        sorted(query.roles),
        query.pinned_only,
        query.session_id,
    )


def encode_page_token(after: tuple[datetime, uuid.UUID], listing: str) -> str:
    return page_tokens.encode(_MEMORIES, listing, [after[0].isoformat(), str(after[1])])


def decode_page_token(token: str, listing: str) -> tuple[datetime, uuid.UUID]:
    recorded_at, memory_id_text = page_tokens.decode(
        _MEMORIES, "ListMemories", listing, token, size=2
    )
    try:
        at = datetime.fromisoformat(recorded_at)
        if at.tzinfo is None:
            raise ValueError("naive")
        return at, uuid.UUID(memory_id_text)
    except ValueError:
        raise InvalidArgument("page_token: not a token returned by ListMemories") from None


def list_query(request: pb.ListMemoriesRequest, owner: Scope, settings: Settings) -> ListQuery:
    """The page asked for; a page_token must come from the same scope and filters."""
    if request.page_size < 0 or request.page_size > settings.max_page_size:
        raise InvalidArgument(f"page_size: between 1 and {settings.max_page_size} (0: default)")
    filters = request.filters
    query = ListQuery(
        page_size=request.page_size or settings.default_page_size,
        include_superseded=request.include_superseded,
        categories=tuple(
            vocabulary(c, "filters.categories", settings.categories, "") for c in filters.categories
        ),
        roles=tuple(vocabulary(r, "filters.roles", settings.roles, "") for r in filters.roles),
        pinned_only=filters.pinned_only,
        session_id=identifier(filters.session_id, "filters.session_id", settings, required=False),
    )
    if not request.page_token:
        return query
    after = decode_page_token(request.page_token, memories_listing(owner, query))
    return dataclasses.replace(query, after=after)


_MESSAGE_ROLES = {
    pb.MESSAGE_ROLE_USER: "user",
    pb.MESSAGE_ROLE_ASSISTANT: "assistant",
    pb.MESSAGE_ROLE_SYSTEM: "system",
    pb.MESSAGE_ROLE_TOOL: "tool",
}
MAX_IDEMPOTENCY_KEY_CHARS = 200
MAX_GOAL_CHARS = 300
MAX_SENDER_NAME_CHARS = 128


def ingest(request: pb.IngestRequest, tenant_id: str, settings: Settings) -> IngestCommand:
    """A complete, well-formed Ingest, or InvalidArgument naming the first bad field."""
    owner = scope(request.scope, tenant_id, settings, present=request.HasField("scope"))
    session_id = identifier(request.session_id, "session_id", settings, required=True)
    key = request.idempotency_key
    if not key:
        raise InvalidArgument("idempotency_key: required (a retry must reuse the same key)")
    if len(key) > MAX_IDEMPOTENCY_KEY_CHARS or _has_control(key, allow_newlines=False):
        raise InvalidArgument(
            f"idempotency_key: at most {MAX_IDEMPOTENCY_KEY_CHARS} printable characters"
        )
    if len(request.messages) > settings.max_messages_per_ingest:
        raise InvalidArgument(
            f"messages: at most {settings.max_messages_per_ingest} per call; send only new ones"
        )
    if not request.messages and not request.goals and not request.end_of_session:
        raise InvalidArgument("messages: required (or goals, or end_of_session)")
    seen: set[str] = set()
    stored: list[StoredMessage] = []
    for i, m in enumerate(request.messages):
        field = f"messages[{i}]"
        message_id = identifier(m.message_id, f"{field}.message_id", settings, required=True)
        if message_id in seen:
            raise InvalidArgument(
                f"{field}.message_id: the same as an earlier message's in this call"
            )
        seen.add(message_id)
        role = _MESSAGE_ROLES.get(m.role)
        if role is None:
            raise InvalidArgument(f"{field}.role: one of USER, ASSISTANT, SYSTEM, TOOL")
        if not m.HasField("sent_at"):
            raise InvalidArgument(f"{field}.sent_at: required")
        text = m.text.strip()
        if not text:
            raise InvalidArgument(f"{field}.text: required and must not be blank")
        if len(text) > settings.max_message_chars:
            raise InvalidArgument(f"{field}.text: at most {settings.max_message_chars} characters")
        if _has_control(text, allow_newlines=True):
            raise InvalidArgument(f"{field}.text: must not contain control characters")
        stored.append(
            StoredMessage(
                session_id=session_id,
                message_id=message_id,
                sender_id=identifier(m.sender_id, f"{field}.sender_id", settings, required=True),
                sender_name=short_text(
                    m.sender_name, f"{field}.sender_name", MAX_SENDER_NAME_CHARS
                ),
                role=role,
                text=text,
                sent_at=bounded_time(m.sent_at, f"{field}.sent_at"),
            )
        )
    total_chars = sum(len(m.text) for m in stored)
    if total_chars > settings.max_ingest_chars:
        # One Ingest is one extraction job: a bigger one could only run out of time.
        raise InvalidArgument(
            f"messages: {total_chars} characters in all, at most {settings.max_ingest_chars}"
            " per Ingest (one extraction job); split them over several Ingests"
        )
    if len(request.goals) > settings.max_goals:
        raise InvalidArgument(f"goals: at most {settings.max_goals}")
    goals = tuple(short_text(g, f"goals[{i}]", MAX_GOAL_CHARS) for i, g in enumerate(request.goals))
    if any(not g for g in goals):
        raise InvalidArgument("goals: entries must not be blank")
    counterpart = identifier(
        request.counterpart_persona_id, "counterpart_persona_id", settings, required=False
    )
    if counterpart and owner.persona_id and counterpart != owner.persona_id:
        raise InvalidArgument(
            "counterpart_persona_id: differs from scope.persona_id; a session has one persona"
        )
    return IngestCommand(
        scope=owner,
        session_id=session_id,
        messages=tuple(stored),
        idempotency_key=key,
        end_of_session=request.end_of_session,
        goals=goals,
        counterpart_persona_id=counterpart,
    )


def ingest_id(value: str) -> uuid.UUID:
    if not value:
        raise InvalidArgument("ingest_id: required")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgument("ingest_id: not an ingest id (a UUID)") from None
