"""Packets to bytes and back, for the cache (JSON via orjson, with a format number)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import orjson

from memsvc.memories.model import MemoryRecord, Scope, Sharing
from memsvc.prefetch.model import EpisodeRecord, Packet, SectionCount

FORMAT = 1


class CodecError(ValueError):
    """Cached bytes that this version cannot read (treated as a miss)."""


def _default(value: object) -> str:
    # asyncpg returns its own UUID subclass, which orjson does not take for a uuid.UUID.
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


def encode(packet: Packet) -> bytes:
    # orjson serialises dataclasses, datetimes and (exact) UUIDs natively.
    return orjson.dumps({"format": FORMAT, "packet": packet}, default=_default)


def _dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _uuid(value: str | None) -> uuid.UUID | None:
    return None if value is None else uuid.UUID(value)


def _scope(d: dict[str, Any]) -> Scope:
    return Scope(d["tenant_id"], d["user_id"], d["persona_id"], d["agent_id"])


def _memory(d: dict[str, Any]) -> MemoryRecord:
    valid_from, recorded_at = _dt(d["valid_from"]), _dt(d["recorded_at"])
    memory_id, lineage_id = _uuid(d["memory_id"]), _uuid(d["lineage_id"])
    assert valid_from and recorded_at and memory_id and lineage_id
    return MemoryRecord(
        scope=_scope(d["scope"]),
        memory_id=memory_id,
        lineage_id=lineage_id,
        content=d["content"],
        category=d["category"],
        role=d["role"],
        confidence=d["confidence"],
        reinforced_count=d["reinforced_count"],
        pinned=d["pinned"],
        valid_from=valid_from,
        recorded_at=recorded_at,
        status=d["status"],
        origin=d["origin"],
        subject=d["subject"],
        predicate=d["predicate"],
        object=d["object"],
        invalid_at=_dt(d["invalid_at"]),
        supersedes_id=_uuid(d["supersedes_id"]),
        superseded_by_id=_uuid(d["superseded_by_id"]),
        source_message_ids=tuple(d["source_message_ids"]),
        session_id=d["session_id"],
        sharing=Sharing(d["sharing"]["all_agents"], d["sharing"]["all_personas"]),
        correction_reason=d["correction_reason"],
    )


def _episode(d: dict[str, Any]) -> EpisodeRecord:
    started_at, ended_at, episode_id = _dt(d["started_at"]), _dt(d["ended_at"]), d["episode_id"]
    assert started_at and ended_at
    return EpisodeRecord(
        scope=_scope(d["scope"]),
        episode_id=uuid.UUID(episode_id),
        session_id=d["session_id"],
        title=d["title"],
        summary=d["summary"],
        excerpt=d["excerpt"],
        source_message_ids=tuple(d["source_message_ids"]),
        started_at=started_at,
        ended_at=ended_at,
    )


def decode(raw: bytes) -> Packet:
    try:
        outer = orjson.loads(raw)
        if outer.get("format") != FORMAT:
            raise CodecError(f"packet format {outer.get('format')!r}, expected {FORMAT}")
        d = outer["packet"]
        return Packet(
            body=d["body"],
            facts=tuple(_memory(m) for m in d["facts"]),
            episodes=tuple(_episode(e) for e in d["episodes"]),
            counts={k: SectionCount(v["shown"], v["total"]) for k, v in d["counts"].items()},
            withheld=tuple(d["withheld"]),
            version=d["version"],
            degraded=d["degraded"],
            built_at=_dt(d["built_at"]),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AssertionError) as exc:
        raise CodecError(f"unreadable cached packet ({type(exc).__name__})") from exc
