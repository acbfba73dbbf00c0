"""Trust over time: how much a stored confidence is worth at a given moment (pure).

One stored ``confidence`` has four update rules that never overwrite each other (seed 001):

1. Initial trust at write: the writer's confidence (Remember: 0.9 by default; extraction: the
   extractor's), stored as is.
2. Decay over time, computed at read time and never written back:
   ``effective = confidence * 0.5 ** (age_days / half_life(category))``, the age counted from
   the last confirmation (the latest of ``recorded_at`` and ``last_reinforced_at`` not after
   the moment asked about). Nothing is rewritten in the background.
3. Reinforcement when the fact is stated again: ``last_reinforced_at`` moves to now, which
   restarts the decay clock; the stored confidence becomes the higher of the two statements
   (an identical Remember) or stays (extraction). It never lowers trust.
4. An explicit correction writes a new version with confidence 1.0 and origin
   ``correction``; like a pinned memory, it does not decay (the user said so).
5. A confidence set by UpdateMemory replaces the stored one and counts as a confirmation:
   ``last_reinforced_at`` moves to now, so the new value decays from the moment it was set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from memsvc.storage.model import MemoryRecord

SECONDS_PER_DAY = 86_400.0
CORRECTION = "correction"
# Used for a category the table does not list (a custom vocabulary).
FALLBACK_CATEGORY = "context"
DEFAULT_HALF_LIVES: Mapping[str, float] = {
    "preference": 180.0,
    "profile": 365.0,
    "relationship": 365.0,
    "goal": 90.0,
    "event": 30.0,
    "context": 60.0,
}


@dataclass(frozen=True)
class TrustPolicy:
    """Half-life in days per category (MEMSVC_CONFIDENCE_HALF_LIFE_DAYS)."""

    half_lives: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_HALF_LIVES))

    def half_life(self, category: str) -> float:
        found = self.half_lives.get(category)
        if found is None:
            found = self.half_lives.get(FALLBACK_CATEGORY, DEFAULT_HALF_LIVES[FALLBACK_CATEGORY])
        return found


def last_confirmed(
    recorded_at: datetime, last_reinforced_at: datetime | None, now: datetime
) -> datetime | None:
    """The latest confirmation not after ``now`` (None: confirmed only after it)."""
    known = [t for t in (recorded_at, last_reinforced_at) if t is not None and t <= now]
    return max(known) if known else None


def effective_confidence(
    confidence: float,
    *,
    category: str,
    pinned: bool,
    origin: str,
    recorded_at: datetime,
    last_reinforced_at: datetime | None,
    now: datetime,
    policy: TrustPolicy,
) -> float:
    """``confidence`` decayed to ``now``; pinned and corrected memories keep it whole, and a
    confirmation in the future of ``now`` (an as_of read, clock skew) counts as fresh."""
    if pinned or origin == CORRECTION:
        return confidence
    since = last_confirmed(recorded_at, last_reinforced_at, now)
    if since is None:
        return confidence
    age_days = (now - since).total_seconds() / SECONDS_PER_DAY
    return float(confidence * 0.5 ** (age_days / policy.half_life(category)))


def of_record(record: MemoryRecord, now: datetime, policy: TrustPolicy) -> float:
    return effective_confidence(
        record.confidence,
        category=record.category,
        pinned=record.pinned,
        origin=record.origin,
        recorded_at=record.recorded_at,
        last_reinforced_at=record.last_reinforced_at,
        now=now,
        policy=policy,
    )


def decorate(record: MemoryRecord, now: datetime, policy: TrustPolicy) -> MemoryRecord:
    """The record with ``effective_confidence`` filled for ``now``."""
    return replace(record, effective_confidence=of_record(record, now, policy))


def policy_from(overrides: Iterable[tuple[str, float]]) -> TrustPolicy:
    """The defaults with the configured half-lives over them (validated by Settings)."""
    return TrustPolicy({**DEFAULT_HALF_LIVES, **dict(overrides)})


def trust_of(record: MemoryRecord) -> float:
    """The effective confidence when the service filled it, else the stored one."""
    if record.effective_confidence is not None:
        return record.effective_confidence
    return record.confidence


def core_order(records: Iterable[MemoryRecord]) -> list[MemoryRecord]:
    """Pinned first, then more confident (effective confidence), then newest."""
    return sorted(
        records,
        key=lambda r: (
            not r.pinned,
            -round(trust_of(r), 6),
            -r.recorded_at.timestamp(),
            r.memory_id,
        ),
    )
