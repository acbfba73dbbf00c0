"""SQL for the messages table: the searchable conversation history (recall tier)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg
import numpy as np

from memsvc.storage.connection import Connection
from memsvc.storage.model import Scope


@dataclass(frozen=True)
class StoredMessage:
    """One message as Ingest stores it."""

    session_id: str
    message_id: str
    sender_id: str
    role: str  # user | assistant | system | tool
    text: str
    sent_at: datetime
    # The speaker's name as given by the caller ('' when none; see SPEAKER_SQL).
    sender_name: str = ""


# Who said a message, as a retrieval unit names them: the caller's sender_name, else a
# sender_id made of letters only ("Caroline", "mary-jane"; an id such as "u_81f3" names
# nobody), else NULL.
SPEAKER_SQL = (
    "coalesce(nullif(sender_name, ''),"
    " substring(sender_id from '^[[:alpha:]]+(?:[ .''-][[:alpha:]]+)*$'))"
)
# What the dense leg embeds and the context index holds of a message: `{name} said, "{text}"`
# when the speaker has a name (the LoCoMo paper's unit), else the text alone. Measured on the
# LoCoMo development split, dense leg alone, R@10: 34.1 for the text alone, 54.2 with the
# name (questions name the person: "What did Caroline research?"). The same unit with the
# session date in front (54.3) or the previous turn (53.8) was no better, so neither is in it.
UNIT_SQL = (
    f"CASE WHEN {SPEAKER_SQL} IS NULL THEN text"
    f" ELSE {SPEAKER_SQL} || ' said, \"' || text || '\"' END"
)


# Up to this many messages are inserted with one VALUES row each, taking its columns from the
# array arguments ($6..$13): on Citus a multi-row VALUES whose user_id is the one $2 is a
# single-shard router insert, while INSERT ... SELECT FROM unnest(...) is planned as "pull to
# coordinator" (its source is a function, not a shard). Ingest calls are this small; larger
# batches (bulk loads) keep the unnest form, whose text does not grow with the count.
_VALUES_MAX_ROWS = 32
_MESSAGE_ROW = (
    "($1, $2, $3, $4, ($6::text[])[{i}], ($7::text[])[{i}], $5, ($8::text[])[{i}],"
    " ($9::text[])[{i}], ($10::text[])[{i}], ($11::timestamptz[])[{i}],"
    " CASE WHEN $12::float8 > 0 THEN 'ttl' ELSE 'user-controlled' END,"
    " CASE WHEN $12::float8 > 0 THEN now() + $12::float8 * interval '1 second' END,"
    " ($13::text[])[{i}])"
)
_INSERT_INTO = (
    "INSERT INTO messages (tenant_id, user_id, persona_id, agent_id, session_id, message_id,"
    " ingest_id, sender_id, role, text, sent_at, retention_policy, expires_at, sender_name)"
)
_ON_CONFLICT = (
    " ON CONFLICT (tenant_id, user_id, persona_id, agent_id, session_id, message_id) DO NOTHING"
)
_INSERT_UNNEST = (
    _INSERT_INTO + " SELECT $1, $2, $3, $4, m.session_id, m.message_id, $5, m.sender_id, m.role,"
    " m.text, m.sent_at, CASE WHEN $12::float8 > 0 THEN 'ttl' ELSE 'user-controlled' END,"
    " CASE WHEN $12::float8 > 0 THEN now() + $12::float8 * interval '1 second' END,"
    " m.sender_name"
    " FROM unnest($6::text[], $7::text[], $8::text[], $9::text[], $10::text[],"
    " $11::timestamptz[], $13::text[])"
    " AS m(session_id, message_id, sender_id, role, text, sent_at, sender_name)" + _ON_CONFLICT
)


@functools.lru_cache(maxsize=_VALUES_MAX_ROWS)
def _insert_values(count: int) -> str:
    rows = ", ".join(_MESSAGE_ROW.format(i=i) for i in range(1, count + 1))
    return f"{_INSERT_INTO} VALUES {rows}{_ON_CONFLICT}"


def _insert_sql(count: int) -> str:
    return _insert_values(count) if count <= _VALUES_MAX_ROWS else _INSERT_UNNEST


async def insert_messages(
    conn: Connection,
    scope: Scope,
    ingest_id: uuid.UUID,
    messages: Sequence[StoredMessage],
    *,
    ttl_s: int = 0,
) -> int:
    """Store messages in one statement; ones already stored (same session and id) are skipped.
    They expire ``ttl_s`` seconds from now (0: never; retention_policy user-controlled).

    Returns how many were new.
    """
    if not messages:
        return 0
    result: str = await conn.execute(
        _insert_sql(len(messages)),
        scope.tenant_id,
        scope.user_id,
        scope.persona_id,
        scope.agent_id,
        ingest_id,
        [m.session_id for m in messages],
        [m.message_id for m in messages],
        [m.sender_id for m in messages],
        [m.role for m in messages],
        [m.text for m in messages],
        [m.sent_at for m in messages],
        ttl_s,
        [m.sender_name for m in messages],
    )
    return int(result.split()[-1])


async def messages_of_ingest(
    conn: Connection, scope: Scope, ingest_id: uuid.UUID
) -> list[asyncpg.Record]:
    """The messages an ingest stored, in conversation order; ``unit`` is what to embed."""
    rows: list[asyncpg.Record] = await conn.fetch(
        "SELECT session_id, message_id, sender_id, sender_name, role, text, sent_at,"
        f" embedding_state, {UNIT_SQL} AS unit"
        " FROM messages WHERE tenant_id = $1 AND user_id = $2 AND persona_id = $3"
        " AND agent_id = $4 AND ingest_id = $5 ORDER BY sent_at, message_id",
        scope.tenant_id,
        scope.user_id,
        scope.persona_id,
        scope.agent_id,
        ingest_id,
    )
    return rows


async def units(conn: Connection, messages: Sequence[tuple[str, str, str]]) -> list[str]:
    """The retrieval unit (UNIT_SQL) of each (sender_name, sender_id, text), in order: for
    texts embedded before their rows exist (an import)."""
    if not messages:
        return []
    rows = await conn.fetch(
        f"SELECT {UNIT_SQL} AS unit FROM unnest($1::text[], $2::text[], $3::text[])"
        " WITH ORDINALITY AS m(sender_name, sender_id, text, n) ORDER BY n",
        [m[0] for m in messages],
        [m[1] for m in messages],
        [m[2] for m in messages],
    )
    return [r["unit"] for r in rows]


async def set_message_embeddings(
    conn: Connection,
    scope: Scope,
    keys: Sequence[tuple[str, str]],
    vectors: np.ndarray,
    model_id: str,
) -> None:
    """Store embeddings of (session_id, message_id) rows and mark their projection ok."""
    await conn.executemany(
        "UPDATE messages SET embedding = $7, embedding_model = $8, embedding_state = 'ok'"
        " WHERE tenant_id = $1 AND user_id = $2 AND persona_id = $3 AND agent_id = $4"
        " AND session_id = $5 AND message_id = $6",
        [
            (scope.tenant_id, scope.user_id, scope.persona_id, scope.agent_id, s, m, v, model_id)
            for (s, m), v in zip(keys, vectors, strict=True)
        ],
    )


async def index_session_context(
    conn: Connection, scope: Scope, session_id: str, message_ids: Sequence[str]
) -> int:
    """(Re)build the context tsvector of the given messages and of the two before each of
    them in the session (their forward neighbours changed). Returns rows updated.

    A message's unit (UNIT_SQL) weighs A, its neighbours' at distance 1 B and at distance 2
    C (retrieval.sources.MESSAGES says how much each counts). The date it was said is not in it:
    its words ("8", "may", "2023") matched every question holding "may" or a number, and a
    query that names a date is served by the route's date factor instead."""
    result: str = await conn.execute(
        f"""
        WITH s AS (
            SELECT message_id, sent_at, {UNIT_SQL} AS unit,
                   row_number() OVER (ORDER BY sent_at, message_id) AS i
            FROM messages
            WHERE tenant_id = $1 AND user_id = $2 AND persona_id = $3 AND agent_id = $4
              AND session_id = $5
        ),
        w AS (
            SELECT message_id, i, unit,
                   concat_ws(' ', lag(unit) OVER o, lead(unit) OVER o) AS near,
                   concat_ws(' ', lag(unit, 2) OVER o, lead(unit, 2) OVER o) AS far
            FROM s WINDOW o AS (ORDER BY i)
        ),
        first_new AS (SELECT coalesce(min(i), 0) AS i FROM s WHERE message_id = ANY($6::text[])),
        ctx AS (
            SELECT w.message_id,
                   setweight(to_tsvector('english', w.unit), 'A')
                || setweight(to_tsvector('english', w.near), 'B')
                || setweight(to_tsvector('english', w.far), 'C') AS tsv
            FROM w, first_new f
            WHERE f.i > 0 AND w.i >= f.i - 2
        )
        UPDATE messages m SET context_tsv = ctx.tsv
        FROM ctx
        WHERE m.tenant_id = $1 AND m.user_id = $2 AND m.persona_id = $3 AND m.agent_id = $4
          AND m.session_id = $5 AND m.message_id = ctx.message_id
        """,
        scope.tenant_id,
        scope.user_id,
        scope.persona_id,
        scope.agent_id,
        session_id,
        list(message_ids),
    )
    return int(result.split()[-1])


async def reindex_sessions(conn: Connection, sessions: Sequence[tuple[Scope, str]]) -> None:
    """Rebuild the context index of whole sessions, after some of their messages were erased
    (their neighbours' context still held the erased words)."""
    for scope, session_id in dict.fromkeys(sessions):
        ids = [
            r["message_id"]
            for r in await conn.fetch(
                "SELECT message_id FROM messages WHERE tenant_id = $1 AND user_id = $2"
                " AND persona_id = $3 AND agent_id = $4 AND session_id = $5",
                scope.tenant_id,
                scope.user_id,
                scope.persona_id,
                scope.agent_id,
                session_id,
            )
        ]
        if ids:
            await index_session_context(conn, scope, session_id, ids)


async def delete_returning_sessions(
    conn: Connection, where_sql: str, *args: object
) -> list[tuple[Scope, str]]:
    """DELETE messages matching `where_sql`; the (owner scope, session) of every row deleted."""
    rows = await conn.fetch(
        f"DELETE FROM messages WHERE {where_sql}"
        " RETURNING tenant_id, user_id, persona_id, agent_id, session_id",
        *args,
    )
    return [(Scope.from_row(r), r["session_id"]) for r in rows]
