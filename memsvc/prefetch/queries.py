"""SQL of the Prefetch walk. Every statement takes the scope as $1..$4 and filters by it.

Topics and episodes belong to exactly one scope (no sharing); facts honour explicit sharing
(storage.conditions.VISIBLE), so a fact reached through an edge is shown only if the caller's
scope may see it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from memsvc.prefetch.model import EdgeRow, TopicRow
from memsvc.storage.conditions import CURRENT, EXACT_SCOPE, NOT_EXPIRED, VISIBLE, not_expired
from memsvc.storage.connection import Connection
from memsvc.storage.episodes import episode_from_row
from memsvc.storage.memories import HOT_COLUMNS as COLUMNS
from memsvc.storage.memories import record_from_row
from memsvc.storage.model import MemoryRecord, Scope

_EXACT = EXACT_SCOPE
_OR_QUERY = "replace(plainto_tsquery('english', $5)::text, ' & ', ' | ')::tsquery"
_EPISODE_COLUMNS = (
    "e.tenant_id, e.user_id, e.persona_id, e.agent_id, e.episode_id, e.session_id, e.title,"
    " e.summary, e.excerpt, e.source_message_ids, e.started_at, e.ended_at, e.expires_at"
)


def _finished(alias: str) -> str:
    """The episode's session is over: an Ingest said end_of_session (as ListSessions reads
    it; the job is in the owner's scope, whichever persona the episode is stamped with), or
    its last message is older than $8 seconds (MEMSVC_SESSION_IDLE_S). A packet is cached
    under the content version: one built while a session was in progress may leave it out
    for MEMSVC_PACKET_TTL_S past its idle time (an end_of_session is a write and bumps it).
    The outbox is filtered by the scope's parameters ($1, $2), not by the outer row's columns:
    on Citus that keeps the query on the user's shard (a correlated subquery is planned over
    every shard)."""
    return f"""({alias}.ended_at <= now() - make_interval(secs => $8)
        OR EXISTS (SELECT 1 FROM ingest_outbox o
                   WHERE o.tenant_id = $1 AND o.user_id = $2
                     AND o.agent_id = {alias}.agent_id AND o.session_id = {alias}.session_id
                     AND o.payload->>'end_of_session' = 'true'))"""


async def core_facts(
    conn: Connection, scope: Scope, *, core_role: str, limit: int, timeout_s: float
) -> list[MemoryRecord]:
    """Pinned facts and facts of the core role, current only."""
    rows = await conn.fetch(
        f"/* memsvc:prefetch:core */ SELECT {COLUMNS} FROM memories"
        f" WHERE {VISIBLE} AND {CURRENT} AND (pinned OR role = $5)"
        " ORDER BY pinned DESC, confidence DESC, recorded_at DESC, memory_id LIMIT $6",
        *scope.key,
        core_role,
        limit,
        timeout=timeout_s,
    )
    return [record_from_row(r) for r in rows]


async def block_texts(conn: Connection, scope: Scope, *, timeout_s: float) -> dict[str, str]:
    """The exact scope's current core-block texts by block ("persona", "human"); a block
    never written is absent. Tagged as part of the core stage."""
    rows = await conn.fetch(
        "/* memsvc:prefetch:core:blocks */ SELECT block, text FROM core_block_revisions"
        " WHERE tenant_id = $1 AND user_id = $2 AND persona_id = $3 AND agent_id = $4"
        " AND replaced_at IS NULL",
        *scope.key,
        timeout=timeout_s,
    )
    return {r["block"]: r["text"] for r in rows}


async def persona_facts(
    conn: Connection, scope: Scope, *, limit: int, timeout_s: float
) -> list[tuple[MemoryRecord, float]]:
    """Facts filed under the scope's reserved persona topic (topics.is_persona), through its
    episodes, with their best edge weight."""
    rows = await conn.fetch(
        f"""
        /* memsvc:prefetch:persona */
        SELECT {COLUMNS}, w.weight FROM memories JOIN (
            SELECT em.memory_id, max(em.weight) AS weight
            FROM topics t
            JOIN topic_episodes te ON te.tenant_id = t.tenant_id AND te.user_id = t.user_id
                                  AND te.topic_id = t.topic_id
            JOIN episode_memories em ON em.tenant_id = te.tenant_id
                                    AND em.user_id = te.user_id
                                    AND em.episode_id = te.episode_id
            WHERE t.tenant_id = $1 AND t.user_id = $2 AND t.persona_id = $3
              AND t.agent_id = $4 AND t.is_persona
            GROUP BY em.memory_id) AS w USING (memory_id)
        WHERE {VISIBLE} AND {CURRENT}
        ORDER BY w.weight DESC, confidence DESC, memory_id
        LIMIT $5
        """,
        *scope.key,
        limit,
        timeout=timeout_s,
    )
    return [(record_from_row(r), float(r["weight"])) for r in rows]


async def topics(
    conn: Connection,
    scope: Scope,
    *,
    hint: str,
    vector: npt.NDArray[np.float32] | None,
    model_id: str,
    patterns: Sequence[str],
    limit: int,
    timeout_s: float,
) -> list[TopicRow]:
    """The scope's topics (not the persona one) with their distance and text match to the
    hint; NULL where there is no hint, no vector, or no match."""
    rows = await conn.fetch(
        f"""
        /* memsvc:prefetch:topics */
        WITH q AS (SELECT {_OR_QUERY} AS tsq)
        SELECT topic_id, name, weight, last_episode_at,
               CASE WHEN $6::vector IS NULL OR embedding IS NULL OR embedding_model <> $7
                    THEN NULL ELSE embedding <=> $6 END AS distance,
               CASE WHEN search_tsv @@ q.tsq OR name ILIKE ANY ($8::text[])
                    THEN ts_rank_cd(search_tsv, q.tsq)
                         + (SELECT count(*) FROM unnest($8::text[]) AS p
                            WHERE name ILIKE p)::real / greatest(cardinality($8::text[]), 1)
               END AS lexical
        FROM topics, q
        WHERE {_EXACT} AND NOT is_persona
        ORDER BY weight DESC, last_episode_at DESC NULLS LAST, topic_id
        LIMIT $9
        """,
        *scope.key,
        hint,
        vector,
        model_id,
        list(patterns),
        limit,
        timeout=timeout_s,
    )
    return [
        TopicRow(
            topic_id=r["topic_id"],
            name=r["name"],
            weight=float(r["weight"]),
            last_episode_at=r["last_episode_at"],
            distance=None if r["distance"] is None else float(r["distance"]),
            lexical=None if r["lexical"] is None else float(r["lexical"]),
        )
        for r in rows
    ]


async def episodes(
    conn: Connection,
    scope: Scope,
    *,
    topic_ids: Sequence[uuid.UUID],
    recent: int,
    limit: int,
    idle_s: float,
    timeout_s: float,
) -> list[EdgeRow]:
    """Episodes of finished sessions (a session in progress is no earlier conversation)
    linked to the given topics (one row per edge), plus the ``recent`` latest such
    episodes of the scope (topic_id NULL when not linked)."""
    rows = await conn.fetch(
        f"""
        /* memsvc:prefetch:episodes */
        WITH recent AS (
            SELECT episode_id FROM episodes AS r
            WHERE {_EXACT} AND {NOT_EXPIRED} AND {_finished("r")}
            ORDER BY ended_at DESC, episode_id LIMIT $6),
        linked AS (
            SELECT episode_id, topic_id, weight FROM topic_episodes
            WHERE tenant_id = $1 AND user_id = $2 AND topic_id = ANY ($5::uuid[]))
        SELECT {_EPISODE_COLUMNS}, l.topic_id, coalesce(l.weight, 0) AS edge_weight
        FROM episodes e LEFT JOIN linked l ON l.episode_id = e.episode_id
        WHERE e.tenant_id = $1 AND e.user_id = $2 AND e.persona_id = $3 AND e.agent_id = $4
          AND {not_expired("e")} AND {_finished("e")}
          AND (l.topic_id IS NOT NULL OR e.episode_id IN (SELECT episode_id FROM recent))
        ORDER BY e.ended_at DESC, e.episode_id, l.topic_id
        LIMIT $7
        """,
        *scope.key,
        list(topic_ids),
        recent,
        limit,
        float(idle_s),
        timeout=timeout_s,
    )
    return [EdgeRow(episode_from_row(r), r["topic_id"], float(r["edge_weight"])) for r in rows]


async def walk_facts(
    conn: Connection,
    scope: Scope,
    *,
    episode_ids: Sequence[uuid.UUID],
    limit: int,
    timeout_s: float,
) -> list[tuple[MemoryRecord, uuid.UUID, float]]:
    """Current facts of the given episodes: (fact, episode, edge weight), one per edge."""
    if not episode_ids:
        return []
    rows = await conn.fetch(
        f"""
        /* memsvc:prefetch:facts */
        SELECT {COLUMNS}, w.episode_id, w.weight FROM memories JOIN (
            SELECT memory_id, episode_id, weight FROM episode_memories
            WHERE tenant_id = $1 AND user_id = $2 AND episode_id = ANY ($5::uuid[])
        ) AS w USING (memory_id)
        WHERE {VISIBLE} AND {CURRENT}
        ORDER BY w.weight DESC, memory_id, w.episode_id
        LIMIT $6
        """,
        *scope.key,
        list(episode_ids),
        limit,
        timeout=timeout_s,
    )
    return [(record_from_row(r), r["episode_id"], float(r["weight"])) for r in rows]


async def recent_facts(
    conn: Connection, scope: Scope, *, core_role: str, limit: int, timeout_s: float
) -> list[MemoryRecord]:
    """The most recently recorded or reinforced current facts, but pinned and core ones
    (they have their own section)."""
    rows = await conn.fetch(
        f"/* memsvc:prefetch:recent */ SELECT {COLUMNS} FROM memories"
        f" WHERE {VISIBLE} AND {CURRENT} AND NOT pinned AND role <> $5"
        " ORDER BY greatest(recorded_at, last_reinforced_at) DESC, memory_id LIMIT $6",
        *scope.key,
        core_role,
        limit,
        timeout=timeout_s,
    )
    return [record_from_row(r) for r in rows]
