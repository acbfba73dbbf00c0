"""UpdateMemory's plan (pure): what a mask changes on one stored version, and how the edit
shows each changed value.

A path whose value is already the stored one changes nothing and is left out of the edit;
"ttl" always changes (it re-arms the expiry from now). Values are shown as text, as
MemoryEdit says: "true"/"false" for pinned, the word for category and role, JSON for
sharing, the RetentionPolicy name for retention_policy, seconds for ttl (before: the whole
seconds that were left; "" when it never expired) and the number for confidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import orjson

from memsvc.errors import InvalidArgument
from memsvc.storage import retention
from memsvc.storage.model import MemoryRecord, MemoryUpdate, Sharing

RETENTION_NAMES = {
    retention.USER_CONTROLLED: "RETENTION_POLICY_USER_CONTROLLED",
    retention.SESSION: "RETENTION_POLICY_SESSION",
    retention.TTL: "RETENTION_POLICY_TTL",
}
# Confidence is stored as float4: values equal to this many digits are the same value.
_CONFIDENCE_DIGITS = 6


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _sharing(value: Sharing) -> str:
    return orjson.dumps(
        {"all_agents": value.all_agents, "all_personas": value.all_personas}
    ).decode()


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(round(value, 3))


def _confidence(value: float) -> str:
    return repr(round(float(value), _CONFIDENCE_DIGITS))


@dataclass(frozen=True)
class Plan:
    """The version's values after the update, and the edit describing it (no fields: no-op)."""

    pinned: bool
    category: str
    role: str
    sharing: Sharing
    retention_policy: str
    confidence: float
    # expires_at is set to now + expires_in_s (None: never) when rearm_expiry.
    rearm_expiry: bool = False
    expires_in_s: float | None = None
    fields: tuple[str, ...] = ()
    before: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.fields)

    @property
    def confirmed(self) -> bool:
        """A new confidence restarts the decay clock, as a confirmation does."""
        return "confidence" in self.fields


def plan(old: MemoryRecord, update: MemoryUpdate, now: datetime) -> Plan:
    """What the update does to ``old`` (a current version of the caller's own scope).
    InvalidArgument when a value does not fit this memory (nothing is written)."""
    paths = update.paths
    pinned = update.pinned if "pinned" in paths else old.pinned
    category = update.category if "category" in paths else old.category
    role = update.role if "role" in paths else old.role
    sharing = update.sharing if "sharing" in paths else old.sharing
    confidence = update.confidence if "confidence" in paths else old.confidence
    shown = {
        "pinned": (_bool(old.pinned), _bool(pinned)),
        "category": (old.category, category),
        "role": (old.role, role),
        "sharing": (_sharing(old.sharing), _sharing(sharing)),
        "confidence": (_confidence(old.confidence), _confidence(confidence)),
    }
    policy, rearm = _retention(old, update)
    if policy != old.retention_policy:
        shown["retention_policy"] = (
            RETENTION_NAMES.get(old.retention_policy, old.retention_policy),
            RETENTION_NAMES[policy],
        )
    if "ttl" in paths:
        assert update.expires_in_s is not None
        left = (old.expires_at - now).total_seconds() if old.expires_at is not None else None
        shown["ttl"] = (
            "" if left is None else str(max(round(left), 0)),
            _seconds(update.expires_in_s),
        )
    # "ttl" always changes something: the expiry starts again from now.
    fields = tuple(p for p in paths if p in shown and (p == "ttl" or shown[p][0] != shown[p][1]))
    return Plan(
        pinned=pinned,
        category=category,
        role=role,
        sharing=sharing,
        retention_policy=policy,
        confidence=confidence,
        rearm_expiry=rearm and bool(fields),
        expires_in_s=update.expires_in_s,
        fields=fields,
        before={p: shown[p][0] for p in fields},
        after={p: shown[p][1] for p in fields},
    )


def _retention(old: MemoryRecord, update: MemoryUpdate) -> tuple[str, bool]:
    """(the policy after the update, whether expires_at is set anew)."""
    paths = update.paths
    if "retention_policy" not in paths:
        if "ttl" in paths and old.retention_policy != retention.TTL:
            raise InvalidArgument(
                "ttl: this memory's retention is "
                f"{RETENTION_NAMES.get(old.retention_policy, old.retention_policy)}; set "
                'retention_policy RETENTION_POLICY_TTL with it ("retention_policy" in the mask)'
            )
        return old.retention_policy, "ttl" in paths
    policy = update.retention_policy
    if policy == retention.SESSION and not old.session_id:
        raise InvalidArgument(
            "retention_policy: RETENTION_POLICY_SESSION needs the memory's session_id, and this "
            "memory has none"
        )
    # TTL always re-arms (from now); another policy only when it changes.
    return policy, policy == retention.TTL or policy != old.retention_policy
