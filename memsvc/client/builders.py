"""Builders for the request parts every gateway writes: a Scope and a Message."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from memsvc.v1 import memory_pb2 as pb

_ROLES: dict[str, pb.MessageRole.ValueType] = {
    "user": pb.MESSAGE_ROLE_USER,
    "assistant": pb.MESSAGE_ROLE_ASSISTANT,
    "system": pb.MESSAGE_ROLE_SYSTEM,
    "tool": pb.MESSAGE_ROLE_TOOL,
}


def scope(user_id: str, *, persona_id: str = "", agent_id: str = "") -> pb.Scope:
    """Whose memory: every read matches all three fields exactly."""
    return pb.Scope(user_id=user_id, persona_id=persona_id, agent_id=agent_id)


def message(
    text: str,
    *,
    sender_id: str,
    role: str = "user",
    message_id: str | None = None,
    sent_at: datetime | None = None,
    sender_name: str = "",
) -> pb.Message:
    """One turn's message; ``message_id`` defaults to a fresh id, ``sent_at`` to now (UTC).

    ``sender_name`` is the speaker's name ("Caroline"): the message is found by questions that
    name them (it is embedded as `{name} said, "{text}"`).

    Give a stable ``message_id`` when a message may be sent twice: the server drops a
    message_id the session already holds.
    """
    try:
        role_value = _ROLES[role]
    except KeyError:
        raise ValueError(f"role must be one of {sorted(_ROLES)}, got {role!r}") from None
    stamp = Timestamp()
    stamp.FromDatetime(sent_at or datetime.now(UTC))
    return pb.Message(
        message_id=message_id or f"m-{uuid.uuid4().hex}",
        sender_id=sender_id,
        role=role_value,
        text=text,
        sent_at=stamp,
        sender_name=sender_name,
    )
