"""Domain records as the contract's messages (pure).

Shared by the edge (server/) and by the read path, whose cached Prefetch packet is the
contract's PrefetchResponse itself.
"""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from memsvc.storage.model import MemoryEdit, MemoryRecord, Scope
from memsvc.v1 import memory_pb2 as pb

_STATUS = {
    "active": pb.MEMORY_STATUS_ACTIVE,
    "superseded": pb.MEMORY_STATUS_SUPERSEDED,
}
_RETENTION = {
    "user-controlled": pb.RETENTION_POLICY_USER_CONTROLLED,
    "session": pb.RETENTION_POLICY_SESSION,
    "ttl": pb.RETENTION_POLICY_TTL,
}


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _seconds_nanos(value: datetime) -> tuple[int, int]:
    # Timestamp.FromDatetime does this in pure Python through a time tuple and calendar.timegm
    # at ~1.5 us, 3x this; a Recall answer carries 30-50 timestamps, and a saturated server
    # answers hundreds a second. Same result (a naive datetime is UTC, as FromDatetime takes it;
    # timedelta keeps seconds and microseconds non-negative, as Timestamp's nanos are).
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - _EPOCH
    return delta.days * 86_400 + delta.seconds, delta.microseconds * 1_000


def timestamp(value: datetime) -> Timestamp:
    seconds, nanos = _seconds_nanos(value)
    return Timestamp(seconds=seconds, nanos=nanos)


def _set_time(field: Timestamp, value: datetime) -> None:
    """Fill a message's Timestamp field in place (no message built and copied in)."""
    field.seconds, field.nanos = _seconds_nanos(value)


def scope(value: Scope) -> pb.Scope:
    """The caller-visible part of a scope (the tenant comes from credentials, never echoed)."""
    return pb.Scope(user_id=value.user_id, persona_id=value.persona_id, agent_id=value.agent_id)


def memory(record: MemoryRecord) -> pb.Memory:
    msg = pb.Memory(
        memory_id=str(record.memory_id),
        scope=scope(record.scope),
        content=record.content,
        subject=record.subject,
        predicate=record.predicate,
        object=record.object,
        category=record.category,
        role=record.role,
        confidence=record.confidence,
        reinforced_count=record.reinforced_count,
        pinned=record.pinned,
        valid_from=timestamp(record.valid_from),
        recorded_at=timestamp(record.recorded_at),
        supersedes_id=str(record.supersedes_id) if record.supersedes_id else "",
        superseded_by_id=str(record.superseded_by_id) if record.superseded_by_id else "",
        source_message_ids=list(record.source_message_ids),
        session_id=record.session_id,
        status=_STATUS.get(record.status, pb.MEMORY_STATUS_UNSPECIFIED),
        sharing=pb.Sharing(
            all_agents=record.sharing.all_agents, all_personas=record.sharing.all_personas
        ),
        origin=record.origin,
        correction_reason=record.correction_reason,
        negated=record.negated,
    )
    if record.invalid_at is not None:
        _set_time(msg.invalid_at, record.invalid_at)
    msg.retention_policy = _RETENTION.get(record.retention_policy, pb.RETENTION_POLICY_UNSPECIFIED)
    if record.expires_at is not None:
        _set_time(msg.expires_at, record.expires_at)
    _trust_fields(msg, record)
    return msg


def _trust_fields(msg: pb.Memory, record: MemoryRecord) -> None:
    """Decay and reference fields; a record no service decorated shows its stored trust."""
    msg.effective_confidence = (
        record.confidence if record.effective_confidence is None else record.effective_confidence
    )
    for field, value in (
        (msg.last_reinforced_at, record.last_reinforced_at),
        (msg.last_referenced_at, record.last_referenced_at),
        (msg.demoted_at, record.demoted_at),
        (msg.updated_at, record.updated_at),
    ):
        if value is not None:
            _set_time(field, value)


def memory_edit(edit: MemoryEdit) -> pb.MemoryEdit:
    """One in-place change (UpdateMemory) as GetMemoryHistory shows it."""
    return pb.MemoryEdit(
        memory_id=str(edit.memory_id),
        edited_at=timestamp(edit.edited_at),
        fields=list(edit.fields),
        before=edit.before,
        after=edit.after,
        reason=edit.reason,
    )
