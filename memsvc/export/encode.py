"""Rows to export records: one JSON object per line, ISO-8601 UTC times, no derived data.

Each object names its own kind ("type"), so the concatenated lines are a self-describing
JSON-lines file. Vectors and search indexes are never included: they are derived from the
text and rebuilt by any system that imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from memsvc.storage.model import Row

# Exports can be read with str.splitlines(), which also breaks on these; orjson leaves them
# raw (valid JSON), so they are escaped. Control characters are already escaped by orjson.
_LINE_BREAKS = {
    "\u0085".encode(): b"\\u0085",
    "\u2028".encode(): b"\\u2028",
    "\u2029".encode(): b"\\u2029",
}
# Confidence and weights are stored as float4: shown with the precision they have.
_REAL_DIGITS = 6


def dumps(obj: Mapping[str, Any]) -> str:
    """One JSON object on one line (no line break of any kind inside)."""
    raw = orjson.dumps(obj, option=orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC)
    for char, escaped in _LINE_BREAKS.items():
        if char in raw:
            raw = raw.replace(char, escaped)
    return raw.decode("utf-8")


def _scope(row: Row) -> dict[str, str]:
    return {"user_id": row["user_id"], "persona_id": row["persona_id"], "agent_id": row["agent_id"]}


def _real(value: float) -> float:
    return round(float(value), _REAL_DIGITS)


def _ids(values: Any) -> list[str]:
    return [str(v) for v in values or ()]


def _opt_id(value: Any) -> str | None:
    return str(value) if value is not None else None


def memory(row: Row) -> dict[str, Any]:
    """One version of a memory: the fact, its provenance, validity, retention and sharing."""
    triple = None
    if row["subject"] or row["predicate"] or row["object"]:
        triple = {"subject": row["subject"], "predicate": row["predicate"], "object": row["object"]}
    return {
        "type": "memory",
        "memory_id": str(row["memory_id"]),
        "lineage_id": str(row["lineage_id"]),
        "scope": _scope(row),
        "content": row["content"],
        "triple": triple,
        "category": row["category"],
        "role": row["role"],
        "confidence": _real(row["confidence"]),
        "reinforced_count": row["reinforced_count"],
        "pinned": row["pinned"],
        "status": row["status"],
        "valid_from": row["valid_from"],
        "invalid_at": row["invalid_at"],
        "recorded_at": row["recorded_at"],
        "last_reinforced_at": row["last_reinforced_at"],
        "last_referenced_at": row["last_referenced_at"],
        "supersedes_id": _opt_id(row["supersedes_id"]),
        "superseded_by_id": _opt_id(row["superseded_by_id"]),
        "source_message_ids": list(row["source_message_ids"]),
        "session_id": row["session_id"],
        "ingest_id": _opt_id(row["ingest_id"]),
        "origin": row["origin"],
        "correction_reason": row["correction_reason"],
        "retention_policy": row["retention_policy"],
        "expires_at": row["expires_at"],
        "sharing": {
            "all_agents": row["shared_all_agents"],
            "all_personas": row["shared_all_personas"],
        },
        # Set when core-memory compaction moved it out of the core block.
        "demoted": None
        if row["demoted_at"] is None
        else {
            "at": row["demoted_at"],
            "former_role": row["demoted_role"],
            "was_pinned": row["demoted_pinned"],
            "summarised_into": _opt_id(row["demoted_into"]),
        },
        # When UpdateMemory last changed it in place, and each of those changes, oldest first.
        "updated_at": row["updated_at"],
        "edits": [_edit(e) for e in orjson.loads(row["edits"])],
    }


def _edit(edit: Mapping[str, Any]) -> dict[str, Any]:
    """One in-place change of a memory version (UpdateMemory; GetMemoryHistory `edits`)."""
    return {
        "edit_id": edit["edit_id"],
        "edited_at": datetime.fromisoformat(edit["edited_at"]),
        "fields": list(edit["fields"]),
        "before": dict(edit["before"]),
        "after": dict(edit["after"]),
        "reason": edit["reason"],
    }


def episode(row: Row) -> dict[str, Any]:
    """A summarised conversation, with the facts it produced and its topics."""
    return {
        "type": "episode",
        "episode_id": str(row["episode_id"]),
        "scope": _scope(row),
        "session_id": row["session_id"],
        "title": row["title"],
        "summary": row["summary"],
        "excerpt": row["excerpt"],
        "source_message_ids": list(row["source_message_ids"]),
        "started_at": row["started_at"],
        "ended_at": row["ended_at"],
        "recorded_at": row["recorded_at"],
        "expires_at": row["expires_at"],
        "memory_ids": _ids(row["memory_ids"]),
        "topic_ids": _ids(row["topic_ids"]),
    }


def topic(row: Row) -> dict[str, Any]:
    """A topic (the persona topic holds the persona's own description), with its episodes."""
    return {
        "type": "topic",
        "topic_id": str(row["topic_id"]),
        "scope": _scope(row),
        "name": row["name"],
        "is_persona": row["is_persona"],
        "weight": _real(row["weight"]),
        "last_episode_at": row["last_episode_at"],
        "created_at": row["created_at"],
        "episode_ids": _ids(row["episode_ids"]),
    }


def message(row: Row) -> dict[str, Any]:
    """One stored message of the conversation history (scope: the session owner's)."""
    return {
        "type": "message",
        "scope": _scope(row),
        "session_id": row["session_id"],
        "message_id": row["message_id"],
        "sender_id": row["sender_id"],
        "sender_name": row["sender_name"],
        "role": row["role"],
        "text": row["text"],
        "sent_at": row["sent_at"],
        "recorded_at": row["recorded_at"],
        "ingest_id": _opt_id(row["ingest_id"]),
        "retention_policy": row["retention_policy"],
        "expires_at": row["expires_at"],
    }


def core_block(row: Row) -> dict[str, Any]:
    """One revision of a core block ("persona" or "human"): the whole text after that write,
    how and by whom it was written; replaced_at null for the current revision."""
    return {
        "type": "core_block",
        "scope": _scope(row),
        "block": row["block"],
        "revision": row["revision"],
        "text": row["text"],
        "mode": row["mode"],
        "author": row["author"],
        "reason": row["reason"],
        "recorded_at": row["recorded_at"],
        "replaced_at": row["replaced_at"],
    }


ENCODERS = {
    "memory": memory,
    "episode": episode,
    "topic": topic,
    "message": message,
    "core_block": core_block,
}


def summary(
    *,
    user_id: str,
    persona_id: str,
    agent_id: str,
    whole_user: bool,
    counts: Mapping[str, int],
    exported_at: datetime,
) -> dict[str, Any]:
    """The last record: what was asked, how many of each kind, and the snapshot's time."""
    return {
        "type": "summary",
        "scope": {"user_id": user_id, "persona_id": persona_id, "agent_id": agent_id},
        "whole_user": whole_user,
        "counts": dict(counts),
        "exported_at": exported_at.astimezone(UTC),
    }
