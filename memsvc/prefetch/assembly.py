"""The hierarchical walk of Prefetch, as pure functions: topics -> episodes -> facts.

1. Topics are ranked against the hint by RRF of their full-text and vector ranks, or, with
   no hint, by weight * recency decay.
2. Each edge topic -> episode scores ``topic score * edge_weight * decay(episode age)``, where
   ``decay(age) = 0.5 ** (age_days / half_life_days)``: old conversations fade smoothly,
   nothing is cut off by date. An episode keeps its best edge.
3. Facts come from the best episodes (and, directly, from the facts best matching the hint,
   so explicit memories with no episode are found too) and are ordered by role priority
   (the vocabulary's first role, "core", first), then weight, then score.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from memsvc.prefetch.model import EdgeRow, FactCandidate, TopicRow
from memsvc.storage.model import EpisodeRecord, MemoryRecord

SECONDS_PER_DAY = 86_400.0


def decay(then: datetime | None, now: datetime, half_life_days: float) -> float:
    """0.5 ** (age_days / half_life_days); an unknown time counts as one half-life old."""
    if then is None:
        return 0.5
    age_days = max(0.0, (now - then).total_seconds() / SECONDS_PER_DAY)
    return float(0.5 ** (age_days / half_life_days))


def _normalise(scores: dict[uuid.UUID, float]) -> dict[uuid.UUID, float]:
    top = max(scores.values(), default=0.0)
    if top <= 0:
        return {key: 0.0 for key in scores}
    return {key: value / top for key, value in scores.items()}


def rank_topics(
    topics: Sequence[TopicRow],
    *,
    has_hint: bool,
    now: datetime,
    half_life_days: float,
    rrf_k: int,
    limit: int,
) -> list[tuple[TopicRow, float]]:
    """The ``limit`` best topics with scores normalised to (0, 1], best first."""
    raw: dict[uuid.UUID, float] = {}
    if has_hint:
        by_distance = sorted(
            (t for t in topics if t.distance is not None),
            key=lambda t: (t.distance, t.topic_id),
        )
        by_lexical = sorted(
            (t for t in topics if t.lexical is not None and t.lexical > 0),
            key=lambda t: (-(t.lexical or 0.0), t.topic_id),
        )
        for ranked in (by_distance, by_lexical):
            for rank, topic in enumerate(ranked, start=1):
                raw[topic.topic_id] = raw.get(topic.topic_id, 0.0) + 1.0 / (rrf_k + rank)
    else:
        for topic in topics:
            raw[topic.topic_id] = topic.weight * decay(topic.last_episode_at, now, half_life_days)
    scores = _normalise(raw)
    by_id = {t.topic_id: t for t in topics}
    best = sorted(
        (tid for tid in scores if scores[tid] > 0),
        key=lambda tid: (-scores[tid], -by_id[tid].weight, tid),
    )
    return [(by_id[tid], scores[tid]) for tid in best[:limit]]


def score_episodes(
    edges: Iterable[EdgeRow],
    topic_scores: Mapping[uuid.UUID, float],
    *,
    now: datetime,
    half_life_days: float,
) -> dict[uuid.UUID, float]:
    """Episode -> its best edge score; episodes reached only as recent ones score 0."""
    scores: dict[uuid.UUID, float] = {}
    for edge in edges:
        episode = edge.episode
        score = 0.0
        if edge.topic_id is not None:
            score = (
                topic_scores.get(edge.topic_id, 0.0)
                * edge.weight
                * decay(episode.ended_at, now, half_life_days)
            )
        scores[episode.episode_id] = max(scores.get(episode.episode_id, 0.0), score)
    return scores


def pick_episodes(
    episodes: Iterable[EpisodeRecord], scores: Mapping[uuid.UUID, float], *, limit: int
) -> list[EpisodeRecord]:
    """The ``limit`` best episodes (score, then most recent), de-duplicated."""
    unique = {e.episode_id: e for e in episodes}
    ordered = sorted(
        unique.values(),
        key=lambda e: (-scores.get(e.episode_id, 0.0), -e.ended_at.timestamp(), e.episode_id),
    )
    return ordered[:limit]


def role_priority(role: str, role_order: Sequence[str]) -> int:
    """Position of the role in the vocabulary (first = most important); unknown roles last."""
    return role_order.index(role) if role in role_order else len(role_order)


def order_facts(
    candidates: Iterable[FactCandidate], role_order: Sequence[str]
) -> list[FactCandidate]:
    """Role priority, then weight, then score (all descending but role), then newest."""
    return sorted(
        candidates,
        key=lambda c: (
            role_priority(c.record.role, role_order),
            -round(c.weight, 6),
            -round(c.score, 6),
            -c.record.recorded_at.timestamp(),
            c.record.memory_id,
        ),
    )


def merge_candidates(
    walked: Iterable[tuple[MemoryRecord, uuid.UUID, float]],
    direct: Iterable[tuple[MemoryRecord, float]],
    episode_scores: Mapping[uuid.UUID, float],
) -> list[FactCandidate]:
    """One candidate per fact: the walk gives (edge weight, episode score), the direct match
    gives (its base weight, its relevance); each fact keeps the best of each."""
    best: dict[uuid.UUID, FactCandidate] = {}

    def offer(record: MemoryRecord, weight: float, score: float) -> None:
        seen = best.get(record.memory_id)
        if seen is not None:
            weight, score = max(weight, seen.weight), max(score, seen.score)
        best[record.memory_id] = FactCandidate(record, weight, score)

    for record, episode_id, edge_weight in walked:
        offer(record, max(edge_weight, base_weight(record)), episode_scores.get(episode_id, 0.0))
    for record, relevance in direct:
        offer(record, base_weight(record), relevance)
    return list(best.values())


def base_weight(record: MemoryRecord) -> float:
    """A fact's weight without an edge: 1, plus one per reinforcement (as edges grow)."""
    return 1.0 + record.reinforced_count
