"""SQL of the extraction workers: run idempotency, dedup look-ups, quota, episodes, topics."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg
import numpy as np
import orjson

from memsvc.storage.conditions import CURRENT, EXACT_SCOPE
from memsvc.storage.connection import Connection
from memsvc.storage.model import CandidateEpisode, ExistingFact, Scope
from memsvc.storage.projections import projection

_EXACT_SCOPE = EXACT_SCOPE
# Dedup compares against live facts only: an expired one is neither reinforced nor superseded.


async def claim_run(conn: Connection, scope: Scope, ingest_id: uuid.UUID, session_id: str) -> bool:
    """Record that this job's extraction for this speaker is being committed; False if it was.

    Inside the speaker's transaction: a concurrent duplicate blocks on the key, then skips.
    """
    inserted = await conn.fetchval(
        "INSERT INTO extraction_runs (tenant_id, user_id, persona_id, agent_id, ingest_id,"
        " session_id) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING true",
        *scope.key,
        ingest_id,
        session_id,
    )
    return bool(inserted)


async def finish_run(
    conn: Connection, scope: Scope, ingest_id: uuid.UUID, outcome: dict[str, int]
) -> None:
    await conn.execute(
        f"UPDATE extraction_runs SET outcome = $6 WHERE {_EXACT_SCOPE} AND ingest_id = $5",
        *scope.key,
        ingest_id,
        orjson.dumps(outcome).decode(),
    )


async def run_outcome(
    conn: Connection, scope: Scope, ingest_id: uuid.UUID
) -> dict[str, int] | None:
    """The stored outcome of a committed speaker run, or None when it has not run."""
    raw = await conn.fetchval(
        f"SELECT outcome FROM extraction_runs WHERE {_EXACT_SCOPE} AND ingest_id = $5",
        *scope.key,
        ingest_id,
    )
    if raw is None:
        return None
    value: dict[str, int] = orjson.loads(raw)
    return value


_FACT_COLUMNS = "memory_id, content, subject, predicate, object, valid_from, category"


def _existing(row: asyncpg.Record, similarity: float = 1.0) -> ExistingFact:
    return ExistingFact(
        memory_id=row["memory_id"],
        content=row["content"],
        subject=row["subject"],
        predicate=row["predicate"],
        object=row["object"],
        similarity=similarity,
        valid_from=row["valid_from"],
        category=row["category"],
    )


async def exact_active(conn: Connection, scope: Scope, content_hash: bytes) -> ExistingFact | None:
    row = await conn.fetchrow(
        f"SELECT {_FACT_COLUMNS} FROM memories WHERE {_EXACT_SCOPE}"
        f" AND content_hash = $5 AND {CURRENT}",
        *scope.key,
        content_hash,
    )
    return _existing(row) if row is not None else None


async def active_with_predicates(
    conn: Connection, scope: Scope, subject: str, predicates: Sequence[str]
) -> list[ExistingFact]:
    rows = await conn.fetch(
        f"SELECT {_FACT_COLUMNS} FROM memories WHERE {_EXACT_SCOPE}"
        f" AND {CURRENT} AND subject = $5 AND predicate = ANY($6::text[])"
        " ORDER BY recorded_at DESC",
        *scope.key,
        subject,
        list(predicates),
    )
    return [_existing(r) for r in rows]


async def active_of_subject(
    conn: Connection, scope: Scope, subject: str, limit: int = 500
) -> list[ExistingFact]:
    """The current facts about one subject (newest first): what a change may end."""
    rows = await conn.fetch(
        f"SELECT {_FACT_COLUMNS} FROM memories WHERE {_EXACT_SCOPE}"
        f" AND {CURRENT} AND subject = $5 ORDER BY recorded_at DESC LIMIT $6",
        *scope.key,
        subject,
        limit,
    )
    return [_existing(r) for r in rows]


async def nearest_active(
    conn: Connection, scope: Scope, vector: np.ndarray, k: int
) -> list[ExistingFact]:
    """The k most similar active facts of exactly this scope, computed exactly.

    The MATERIALIZED scope subquery keeps the planner off the global HNSW index, which would
    return the nearest rows of all users and filter afterwards (missing this user's).
    """
    rows = await conn.fetch(
        f"""
        WITH scoped AS MATERIALIZED (
            SELECT {_FACT_COLUMNS}, embedding FROM memories
            WHERE {_EXACT_SCOPE} AND {CURRENT} AND embedding IS NOT NULL
        )
        SELECT {_FACT_COLUMNS}, 1 - (embedding <=> $5) AS similarity
        FROM scoped ORDER BY embedding <=> $5 LIMIT $6
        """,
        *scope.key,
        vector,
        k,
    )
    return [_existing(r, float(r["similarity"])) for r in rows]


async def reinforce(
    conn: Connection,
    scope: Scope,
    memory_id: uuid.UUID,
    source_ids: Sequence[str],
    session_id: str = "",
) -> None:
    """Count one more statement of the fact; `session_id`, the session it was stated in, is
    kept in also_stated_in when it is not the fact's own (ForgetSession's provenance)."""
    await conn.execute(
        f"UPDATE memories SET reinforced_count = reinforced_count + 1,"
        " last_reinforced_at = now(),"
        " source_message_ids = ARRAY(SELECT DISTINCT unnest(source_message_ids || $6::text[])"
        " ORDER BY 1),"
        " also_stated_in = CASE WHEN $7 = '' OR $7 = session_id OR $7 = ANY(also_stated_in)"
        " THEN also_stated_in ELSE also_stated_in || $7 END"
        f" WHERE {_EXACT_SCOPE} AND memory_id = $5",
        *scope.key,
        memory_id,
        list(source_ids),
        session_id,
    )


async def take_quota(conn: Connection, tenant_id: str, user_id: str, limit: int) -> bool:
    """Count one new memory against today's quota; False (and nothing counted) when used up."""
    taken = await conn.fetchval(
        "INSERT INTO quota_counters (tenant_id, user_id, day, inserted)"
        " VALUES ($1, $2, current_date, 1)"
        " ON CONFLICT (tenant_id, user_id, day) DO UPDATE"
        " SET inserted = quota_counters.inserted + 1 WHERE quota_counters.inserted < $3"
        " RETURNING true",
        tenant_id,
        user_id,
        limit,
    )
    return bool(taken) and limit > 0


async def episode_summary(conn: Connection, scope: Scope, session_id: str) -> asyncpg.Record | None:
    """The session's episode so far (a session ingested turn by turn grows one episode)."""
    row: asyncpg.Record | None = await conn.fetchrow(
        f"SELECT episode_id, title, summary, excerpt, source_message_ids, started_at,"
        f" embedding, embedding_model, embedding_state"
        f" FROM episodes WHERE {_EXACT_SCOPE} AND session_id = $5",
        *scope.key,
        session_id,
    )
    return row


async def upsert_episode(
    conn: Connection,
    scope: Scope,
    session_id: str,
    episode: CandidateEpisode,
    *,
    started_at: datetime,
    ended_at: datetime,
    embedding: np.ndarray | None,
    embedding_model: str,
) -> uuid.UUID:
    episode_id: uuid.UUID = await conn.fetchval(
        """
        INSERT INTO episodes (tenant_id, user_id, persona_id, agent_id, episode_id, session_id,
                              title, summary, excerpt, source_message_ids, started_at, ended_at,
                              embedding, embedding_model, embedding_state)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
        ON CONFLICT (tenant_id, user_id, persona_id, agent_id, session_id) DO UPDATE SET
            title = EXCLUDED.title, summary = EXCLUDED.summary, excerpt = EXCLUDED.excerpt,
            source_message_ids = EXCLUDED.source_message_ids,
            started_at = least(episodes.started_at, EXCLUDED.started_at),
            ended_at = greatest(episodes.ended_at, EXCLUDED.ended_at),
            embedding = EXCLUDED.embedding, embedding_model = EXCLUDED.embedding_model,
            embedding_state = EXCLUDED.embedding_state
        RETURNING episode_id
        """,
        *scope.key,
        uuid.uuid4(),
        session_id,
        episode.title,
        episode.summary,
        episode.excerpt,
        list(episode.source_message_ids),
        started_at,
        ended_at,
        *projection(embedding, embedding_model),
    )
    return episode_id


async def upsert_topic(
    conn: Connection,
    scope: Scope,
    name: str,
    *,
    seen_at: datetime,
    embedding: np.ndarray | None,
    embedding_model: str,
) -> uuid.UUID:
    """Merge into this user's own topic of that name, or create it (never another user's)."""
    topic_id: uuid.UUID = await conn.fetchval(
        """
        INSERT INTO topics (tenant_id, user_id, persona_id, agent_id, topic_id, name,
                            last_episode_at, embedding, embedding_model, embedding_state)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
        ON CONFLICT (tenant_id, user_id, persona_id, agent_id, name) DO UPDATE SET
            weight = topics.weight + 1,
            last_episode_at = greatest(topics.last_episode_at, EXCLUDED.last_episode_at)
        RETURNING topic_id
        """,
        *scope.key,
        uuid.uuid4(),
        name,
        seen_at,
        *projection(embedding, embedding_model),
    )
    return topic_id


async def link(
    conn: Connection,
    scope: Scope,
    *,
    episode_id: uuid.UUID,
    topic_ids: Sequence[uuid.UUID] = (),
    memory_ids: Sequence[uuid.UUID] = (),
) -> None:
    """Edges topic -> episode and episode -> memory; repeated links add weight."""
    args: list[Any] = [scope.tenant_id, scope.user_id, episode_id]
    if topic_ids:
        await conn.execute(
            "INSERT INTO topic_episodes (tenant_id, user_id, topic_id, episode_id)"
            " SELECT $1, $2, t, $3 FROM unnest($4::uuid[]) AS t"
            " ON CONFLICT (tenant_id, user_id, topic_id, episode_id)"
            " DO UPDATE SET weight = topic_episodes.weight + 1",
            *args,
            list(topic_ids),
        )
    if memory_ids:
        await conn.execute(
            "INSERT INTO episode_memories (tenant_id, user_id, episode_id, memory_id)"
            " SELECT $1, $2, $3, m FROM unnest($4::uuid[]) AS m"
            " ON CONFLICT (tenant_id, user_id, episode_id, memory_id)"
            " DO UPDATE SET weight = episode_memories.weight + 1",
            *args,
            list(dict.fromkeys(memory_ids)),
        )


async def sources_remain(
    conn: Connection,
    owner: Scope,
    ingest_id: uuid.UUID,
    session_id: str,
    message_ids: Sequence[str],
) -> bool:
    """Whether the job and every message a speaker's facts would come from still exist.

    Checked under the user's lock: False means an erasure ran since the job read them, and
    the job must write nothing for that speaker. A job's messages are stored as its owner's
    (whoever spoke them), so both counts name the owner: one shard on Citus.
    """
    alive = await conn.fetchval(
        "SELECT (SELECT count(*) FROM ingest_outbox WHERE tenant_id = $1 AND user_id = $2"
        "         AND ingest_id = $3) = 1"
        " AND (SELECT count(*) FROM messages WHERE tenant_id = $1 AND user_id = $2"
        "      AND session_id = $4 AND message_id = ANY($5::text[])) = cardinality($5::text[])",
        owner.tenant_id,
        owner.user_id,
        ingest_id,
        session_id,
        list(message_ids),
    )
    return bool(alive)
