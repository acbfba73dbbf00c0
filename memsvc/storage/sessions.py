"""SQL of a scope's sessions: list them with their counts, list episodes, forget one session.

A session is what Ingest stored under one session_id in one exact scope (the owner's): its
messages and its jobs. What extraction learned from it lives in the owner's scope, or in the
persona scope the session was with (Ingest counterpart_persona_id): the session's "fact
scopes". Other participants of a meeting keep their own facts (their data, their Forget).

Provenance of a fact version, P(v) = {session_id} + also_stated_in, plus '' for a correction:
the sessions it was stated in ('' = an explicit write outside any session). ForgetSession
deletes a memory chain when the union of P over its versions is exactly {the session}; a
chain stated anywhere else too stays, with the session's message ids and name removed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from memsvc.storage.conditions import EXACT_SCOPE, NOT_EXPIRED, not_expired
from memsvc.storage.connection import Connection
from memsvc.storage.locks import lock_user
from memsvc.storage.model import Scope


@dataclass(frozen=True)
class SessionRow:
    """One session of a scope, as ListSessions shows it."""

    session_id: str
    first_message_at: datetime
    last_message_at: datetime
    message_count: int
    fact_count: int
    episode_count: int
    ended: bool


@dataclass(frozen=True)
class SessionForgotten:
    """What ForgetSession removed (memories_kept: chains kept because stated elsewhere)."""

    messages_deleted: int
    episodes_deleted: int
    memories_deleted: int
    memories_kept: int


# The persona ids of a session's fact scopes ($3: the owner's; the counterpart personas its
# jobs name). `session` is the SQL of the session id; the outbox is read in the exact scope.
def _fact_personas(session: str) -> str:
    return f"""ARRAY[$3::text] || ARRAY(
        SELECT DISTINCT o.payload->>'counterpart_persona_id' FROM ingest_outbox o
        WHERE o.tenant_id = $1::text AND o.user_id = $2::text AND o.persona_id = $3::text
          AND o.agent_id = $4::text AND o.session_id = {session}
          AND coalesce(o.payload->>'counterpart_persona_id', '') NOT IN ('', $3::text))"""


_LIST_SESSIONS = f"""
WITH sessions AS (
    SELECT session_id, min(sent_at) AS first_at, max(sent_at) AS last_at, count(*) AS n
    FROM messages
    WHERE {EXACT_SCOPE} AND {NOT_EXPIRED}
    GROUP BY session_id
), page AS (
    SELECT * FROM sessions
    WHERE $5::timestamptz IS NULL OR (last_at, session_id) < ($5::timestamptz, $6::text)
    ORDER BY last_at DESC, session_id DESC
    LIMIT $7
)
SELECT p.session_id, p.first_at, p.last_at, p.n,
    (SELECT count(*) FROM memories m
     WHERE m.tenant_id = $1 AND m.user_id = $2 AND m.persona_id = ANY(f.personas)
       AND m.agent_id = $4 AND m.session_id = p.session_id
       AND m.invalid_at IS NULL AND {not_expired("m")}) AS facts,
    (SELECT count(*) FROM episodes e
     WHERE e.tenant_id = $1 AND e.user_id = $2 AND e.persona_id = ANY(f.personas)
       AND e.agent_id = $4 AND e.session_id = p.session_id AND {not_expired("e")}) AS episodes,
    EXISTS (SELECT 1 FROM ingest_outbox o
            WHERE o.tenant_id = $1 AND o.user_id = $2 AND o.persona_id = $3
              AND o.agent_id = $4 AND o.session_id = p.session_id
              AND o.payload->>'end_of_session' = 'true') AS ended
FROM page p CROSS JOIN LATERAL (SELECT {_fact_personas("p.session_id")} AS personas) f
ORDER BY p.last_at DESC, p.session_id DESC
"""


async def list_sessions(
    conn: Connection, scope: Scope, *, limit: int, after: tuple[datetime, str] | None
) -> list[SessionRow]:
    """Up to `limit` sessions of exactly this scope, most recent last message first, after
    the keyset (last_message_at, session_id) of the previous page's last one."""
    rows = await conn.fetch(
        _LIST_SESSIONS,
        *scope.key,
        after[0] if after else None,
        after[1] if after else "",
        limit,
    )
    return [
        SessionRow(
            session_id=r["session_id"],
            first_message_at=r["first_at"],
            last_message_at=r["last_at"],
            message_count=int(r["n"]),
            fact_count=int(r["facts"]),
            episode_count=int(r["episodes"]),
            ended=bool(r["ended"]),
        )
        for r in rows
    ]


EPISODE_COLUMNS = (
    "tenant_id, user_id, persona_id, agent_id, episode_id, session_id, title, summary,"
    " excerpt, source_message_ids, started_at, ended_at, expires_at"
)


# An episode's topic names, the user's most talked-about first. The edges are read by the
# parameters ($1, $2), not the outer row's columns: on Citus a correlated subquery keyed by
# the outer row is planned over every shard.
_TOPICS = (
    "coalesce((SELECT array_agg(t.name ORDER BY t.weight DESC, t.name)"
    " FROM topic_episodes te JOIN topics t ON t.tenant_id = te.tenant_id"
    " AND t.user_id = te.user_id AND t.topic_id = te.topic_id"
    " WHERE te.tenant_id = $1 AND te.user_id = $2 AND t.user_id = $2"
    " AND te.episode_id = e.episode_id), '{}')"
)


async def list_episodes(
    conn: Connection,
    scope: Scope,
    *,
    limit: int,
    after: tuple[datetime, uuid.UUID] | None,
    session_id: str = "",
) -> list[asyncpg.Record]:
    """Up to `limit` episodes of exactly this scope (optionally one session's), most
    recently ended first, after the keyset (ended_at, episode_id)."""
    rows: list[asyncpg.Record] = await conn.fetch(
        f"SELECT {EPISODE_COLUMNS}, {_TOPICS} AS topics"
        f" FROM episodes e WHERE {EXACT_SCOPE} AND {NOT_EXPIRED}"
        " AND ($5 = '' OR session_id = $5)"
        " AND ($6::timestamptz IS NULL OR (ended_at, episode_id) < ($6::timestamptz, $7::uuid))"
        " ORDER BY ended_at DESC, episode_id DESC LIMIT $8",
        *scope.key,
        session_id,
        after[0] if after else None,
        after[1] if after else uuid.UUID(int=0),
        limit,
    )
    return rows


def _count(status: str) -> int:
    return int(status.split()[-1])


# A version stated only in session $5: P(v) within {$5} (see the module's docstring).
_ONLY_IN_SESSION = (
    "(session_id = $5 AND also_stated_in <@ ARRAY[$5::text] AND origin <> 'correction')"
)


async def forget_session(
    conn: Connection, scope: Scope, session_id: str
) -> SessionForgotten | None:
    """Delete one session of exactly this scope and what only it taught; None (nothing
    deleted) when the scope has no such session. Call inside a transaction: it takes the
    user's extraction lock first, so a job of the session in flight finds its job and
    messages gone and writes nothing back."""
    await lock_user(conn, scope.tenant_id, scope.user_id)
    key = (*scope.key, session_id)
    jobs = [
        r["ingest_id"]
        for r in await conn.fetch(
            f"SELECT ingest_id FROM ingest_outbox WHERE {EXACT_SCOPE} AND session_id = $5", *key
        )
    ]
    message_ids: list[str] = [
        r["message_id"]
        for r in await conn.fetch(
            f"SELECT message_id FROM messages WHERE {EXACT_SCOPE} AND session_id = $5", *key
        )
    ]
    personas: list[str] = await conn.fetchval(f"SELECT {_fact_personas('$5::text')}", *key)
    # The session's fact scopes: $3 is the list of their persona ids.
    fact_key = (scope.tenant_id, scope.user_id, personas, scope.agent_id, session_id)
    fact_scope = (
        "tenant_id = $1 AND user_id = $2 AND persona_id = ANY($3::text[]) AND agent_id = $4"
    )
    has_episode = await conn.fetchval(
        f"SELECT EXISTS (SELECT 1 FROM episodes WHERE {fact_scope} AND session_id = $5)",
        *fact_key,
    )
    if not jobs and not message_ids and not has_episode:
        return None
    chains = await conn.fetch(
        f"SELECT lineage_id, bool_and({_ONLY_IN_SESSION}) AS only_here FROM memories"
        " WHERE tenant_id = $1 AND user_id = $2 AND lineage_id IN ("
        f"   SELECT lineage_id FROM memories WHERE {fact_scope}"
        "    AND (session_id = $5 OR $5 = ANY(also_stated_in)))"
        " GROUP BY lineage_id",
        *fact_key,
    )
    gone = [c["lineage_id"] for c in chains if c["only_here"]]
    kept = [c["lineage_id"] for c in chains if not c["only_here"]]
    memories_deleted = _count(
        await conn.execute(
            "DELETE FROM memories WHERE tenant_id = $1 AND user_id = $2"
            " AND lineage_id = ANY($3::uuid[])",
            scope.tenant_id,
            scope.user_id,
            gone,
        )
    )
    await _strip_session(conn, scope, session_id, kept, message_ids)
    episodes_deleted = _count(
        await conn.execute(
            f"DELETE FROM episodes WHERE {fact_scope} AND session_id = $5", *fact_key
        )
    )
    messages_deleted = _count(
        await conn.execute(f"DELETE FROM messages WHERE {EXACT_SCOPE} AND session_id = $5", *key)
    )
    await conn.execute(
        "DELETE FROM extraction_runs WHERE tenant_id = $1 AND user_id = $2"
        " AND ingest_id = ANY($3::uuid[])",
        scope.tenant_id,
        scope.user_id,
        jobs,
    )
    await conn.execute(f"DELETE FROM ingest_outbox WHERE {EXACT_SCOPE} AND session_id = $5", *key)
    # Topic names are derived from the conversations they grouped: one left without any
    # episode goes (the persona topic is the caller's, not a conversation's).
    await conn.execute(
        "DELETE FROM topics t WHERE t.tenant_id = $1 AND t.user_id = $2"
        " AND t.persona_id = ANY($3::text[]) AND t.agent_id = $4 AND NOT t.is_persona"
        " AND NOT EXISTS (SELECT 1 FROM topic_episodes te WHERE te.tenant_id = t.tenant_id"
        " AND te.user_id = t.user_id AND te.topic_id = t.topic_id)",
        scope.tenant_id,
        scope.user_id,
        personas,
        scope.agent_id,
    )
    return SessionForgotten(messages_deleted, episodes_deleted, memories_deleted, len(kept))


async def _strip_session(
    conn: Connection,
    scope: Scope,
    session_id: str,
    lineages: Sequence[uuid.UUID],
    message_ids: Sequence[str],
) -> None:
    """The kept chains forget the session: its message ids leave their sources, its name
    their provenance; a version first learned in it takes the next session it was stated in
    as its own ('' when only explicit writes remain)."""
    if not lineages:
        return
    await conn.execute(
        """
        UPDATE memories m SET
            source_message_ids = ARRAY(SELECT s FROM unnest(m.source_message_ids) AS s
                                       WHERE s <> ALL($5::text[])),
            session_id = CASE WHEN m.session_id = $3 THEN x.next ELSE m.session_id END,
            also_stated_in = CASE WHEN m.session_id = $3
                THEN array_remove(x.rest, x.next) ELSE x.rest END
        FROM (SELECT memory_id, array_remove(also_stated_in, $3) AS rest,
                     coalesce((SELECT min(s) FROM unnest(also_stated_in) AS s
                               WHERE s NOT IN ('', $3)), '') AS next
              FROM memories WHERE tenant_id = $1 AND user_id = $2
                AND lineage_id = ANY($4::uuid[])) AS x
        WHERE m.tenant_id = $1 AND m.user_id = $2 AND m.memory_id = x.memory_id
        """,
        scope.tenant_id,
        scope.user_id,
        session_id,
        list(lineages),
        list(message_ids),
    )
