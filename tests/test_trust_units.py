"""Trust over time, the arithmetic (pure): decay by half-life, what does not decay, the clock
that reinforcement resets, the settings that configure it, and the demotion order."""

from __future__ import annotations

import inspect
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from memsvc.config import ConfigError, Settings
from memsvc.governance import compaction, trust
from memsvc.storage.model import MemoryRecord, Scope

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
POLICY = trust.TrustPolicy()


def eff(
    confidence: float = 0.8,
    *,
    category: str = "event",
    pinned: bool = False,
    origin: str = "explicit",
    recorded: datetime = NOW,
    reinforced: datetime | None = None,
    now: datetime = NOW,
    policy: trust.TrustPolicy = POLICY,
) -> float:
    return trust.effective_confidence(
        confidence,
        category=category,
        pinned=pinned,
        origin=origin,
        recorded_at=recorded,
        last_reinforced_at=reinforced,
        now=now,
        policy=policy,
    )


def test_one_half_life_halves_and_two_quarter() -> None:
    # event: 30 days by default; preference 180.
    assert eff(recorded=NOW - timedelta(days=30)) == pytest.approx(0.4, abs=1e-12)
    assert eff(recorded=NOW - timedelta(days=60)) == pytest.approx(0.2, abs=1e-12)
    assert eff(category="preference", recorded=NOW - timedelta(days=180)) == pytest.approx(0.4)
    assert eff(recorded=NOW) == 0.8


def test_half_life_is_per_category_and_configurable() -> None:
    policy = trust.policy_from([("event", 10.0)])
    assert eff(recorded=NOW - timedelta(days=10), policy=policy) == pytest.approx(0.4)
    # Unchanged defaults for the others, and context's for an unknown category.
    assert policy.half_life("profile") == 365.0
    assert policy.half_life("hobby") == policy.half_life("context") == 60.0


def test_pinned_and_corrected_memories_do_not_decay() -> None:
    old = NOW - timedelta(days=3_650)
    assert eff(0.9, pinned=True, recorded=old) == 0.9
    assert eff(1.0, origin="correction", recorded=old) == 1.0
    assert eff(0.9, origin="extraction", recorded=old) < 0.01


def test_reinforcement_restarts_the_clock() -> None:
    recorded = NOW - timedelta(days=90)
    assert eff(recorded=recorded, reinforced=NOW - timedelta(days=30)) == pytest.approx(0.4)
    assert eff(recorded=recorded, reinforced=NOW) == 0.8


def test_future_confirmations_count_as_fresh() -> None:
    # Clock skew: recorded "after" now never raises trust above the stored value.
    assert eff(recorded=NOW + timedelta(days=5)) == 0.8
    # An as_of read before a reinforcement decays from the last confirmation it knew of.
    as_of = NOW - timedelta(days=30)
    value = eff(recorded=NOW - timedelta(days=60), reinforced=NOW, now=as_of)
    assert value == pytest.approx(0.4)


def _record(content: str, **fields: object) -> MemoryRecord:
    base = MemoryRecord(
        scope=Scope("t", "u"),
        memory_id=uuid.uuid4(),
        lineage_id=uuid.uuid4(),
        content=content,
        category="profile",
        role="core",
        confidence=0.9,
        reinforced_count=0,
        pinned=False,
        valid_from=NOW,
        recorded_at=NOW - timedelta(days=1),
        status="active",
        origin="explicit",
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def test_demotion_order_lowest_priority_first() -> None:
    pinned = _record("pinned", pinned=True, confidence=0.1)
    low = _record("low confidence", confidence=0.5)
    unreinforced = _record("never reinforced")
    reinforced = _record("reinforced", reinforced_count=3)
    referenced = _record("referenced", reinforced_count=3, last_referenced_at=NOW)
    newer = _record(
        "newer", reinforced_count=3, last_referenced_at=NOW, recorded_at=NOW - timedelta(hours=1)
    )
    shuffled = [newer, pinned, referenced, low, reinforced, unreinforced]
    order = compaction.demotion_order(shuffled, now=NOW, policy=POLICY)
    assert [r.content for r in order] == [
        "low confidence",
        "never reinforced",
        "reinforced",
        "referenced",
        "newer",
        "pinned",
    ]
    # Protected rows (just written) go after everything else.
    protected = compaction.demotion_order(shuffled, now=NOW, policy=POLICY, protect={low.memory_id})
    assert protected[-1] is low


def test_plan_takes_the_fewest_lowest_items() -> None:
    records = [_record("a" * 100, confidence=0.5), _record("b" * 100), _record("c" * 100)]
    chosen = compaction.plan(records, 250, now=NOW, policy=POLICY)
    assert [r.content[0] for r in chosen] == ["a"]
    assert compaction.plan(records, 300, now=NOW, policy=POLICY) == []
    chosen = compaction.plan(records, 100, now=NOW, policy=POLICY, protect={records[0].memory_id})
    assert sorted(r.content[0] for r in chosen) == ["b", "c"]  # equal but for the random id


def test_settings_parse_and_validate_half_lives() -> None:
    env = {"MEMSVC_CONFIDENCE_HALF_LIFE_DAYS": "preference=200, event=7.5"}
    settings = Settings.from_env(env)
    assert dict(settings.confidence_half_life_days) == {"preference": 200.0, "event": 7.5}
    assert trust.policy_from(settings.confidence_half_life_days).half_life("goal") == 90.0
    for bad, words in (
        ("hobby=10", "unknown category 'hobby'"),
        ("event=0", "positive"),
        ("event=-3", "positive"),
        ("event=soon", "expected a number"),
        ("event", "category=days"),
        ("event=inf", "positive"),
    ):
        with pytest.raises(ConfigError, match=words):
            Settings.from_env({"MEMSVC_CONFIDENCE_HALF_LIFE_DAYS": bad})


def test_settings_core_limits_and_references() -> None:
    settings = Settings.from_env(
        {
            "MEMSVC_HUMAN_BLOCK_MAX_CHARS": "1500",
            "MEMSVC_PERSONA_BLOCK_MAX_CHARS": "0",
            "MEMSVC_REFERENCES_FLUSH_INTERVAL_MS": "250",
        }
    )
    assert (settings.human_block_max_chars, settings.persona_block_max_chars) == (1500, 0)
    assert settings.references_flush_interval_ms == 250
    with pytest.raises(ConfigError, match="REFERENCES_FLUSH_INTERVAL_MS"):
        Settings.from_env({"MEMSVC_REFERENCES_FLUSH_INTERVAL_MS": "0"})


def test_ranking_boosts_by_effective_confidence() -> None:
    from memsvc.retrieval.fusion import Fused
    from memsvc.retrieval.query import Hit, ItemKind
    from memsvc.retrieval.ranking import Ranked, RankWeights, final_order

    def fact(content: str, confidence: float, recorded: datetime) -> Fused:
        record = _record(
            content, category="event", role="context", confidence=confidence, recorded_at=recorded
        )
        hit = Hit(
            kind=ItemKind.FACT,
            id=str(record.memory_id),
            text=content,
            session_id="",
            occurred_at=recorded,  # a fact occurs when recorded (no recency boost: below)
            scope=record.scope,
            shared_all_agents=False,
            shared_all_personas=False,
            score=0.0,
            role="context",
            confidence=confidence,
            category="event",
            origin=record.origin,
            record_factory=lambda: record,
        )
        return Fused(hit, 0.1)

    stale = fact("stale but once sure", 0.9, NOW - timedelta(days=120))  # 0.9/16 now
    fresh = fact("fresh and fairly sure", 0.6, NOW)

    def order(items: list[Fused], **options: Any) -> list[Ranked]:
        # Query routing replaces the `route` argument by a plan: pass it where still asked.
        if "route" in inspect.signature(final_order).parameters:
            options["route"] = "fact"
        # Recency off: only confidence tells the two apart.
        options.setdefault("weights", RankWeights(recency=0.0))
        return final_order(items, now=NOW, role_order=("core", "context"), **options)

    assert order([stale, fresh])[0].fused.hit.text == "stale but once sure"
    decayed = order([stale, fresh], trust_policy=POLICY)
    assert decayed[0].fused.hit.text == "fresh and fairly sure"
    memory = decayed[1].memory
    assert memory is not None and memory.effective_confidence == pytest.approx(0.9 / 16)
    # as_of: decayed to that time instead.
    back = order([stale], trust_policy=POLICY, trust_now=NOW - timedelta(days=90))
    assert back[0].memory is not None
    assert back[0].memory.effective_confidence == pytest.approx(0.45)
