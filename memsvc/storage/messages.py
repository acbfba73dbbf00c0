"""SQL for the messages table: the searchable conversation history (recall tier)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Hashable, Sequence
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
# What the context index holds of a message: `{name} said, "{text}"` when the speaker has a
# name (the LoCoMo paper's unit), else the text alone.
UNIT_SQL = (
    f"CASE WHEN {SPEAKER_SQL} IS NULL THEN text"
    f" ELSE {SPEAKER_SQL} || ' said, \"' || text || '\"' END"
)
# The previous turn's unit in a message's vector, at most this many characters (its end, the
# words next to the message): half of the embedder's 256-token window, so a long assistant
# turn before a short user turn does not push the user's own words out of the window.
PREV_CHARS = 512
# What the dense leg embeds of a message: its previous turn in the session (embed_prev, kept
# by index_session_context) and its unit, `{previous unit}\n{unit}`. An assistant's answer
# carries the user turn it answers, a user's reply the question it replies to, and a turn
# such as "Yes, every weekend!" what it is about. Measured in docs/read-path.md ("The
# previous turn in a message's vector"): without speaker names it is most of what a turn can
# say about itself (LoCoMo, dense leg alone); on RealMem it is neutral.
EMBED_UNIT_SQL = f"coalesce(embed_prev || E'\\n', '') || ({UNIT_SQL})"


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
    """The messages an ingest stored, in conversation order."""
    rows: list[asyncpg.Record] = await conn.fetch(
        "SELECT session_id, message_id, sender_id, sender_name, role, text, sent_at,"
        " embedding_state"
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


async def embed_units(
    conn: Connection, scope: Scope, keys: Sequence[tuple[str, str]]
) -> list[str | None]:
    """What the dense leg embeds (EMBED_UNIT_SQL) of each (session_id, message_id), in order;
    None for a row that is gone."""
    if not keys:
        return []
    rows = await conn.fetch(
        f"SELECT session_id, message_id, {EMBED_UNIT_SQL} AS unit FROM messages"
        " WHERE tenant_id = $1 AND user_id = $2 AND persona_id = $3 AND agent_id = $4"
        " AND session_id = ANY($5::text[]) AND message_id = ANY($6::text[])",
        *scope.key,
        list({s for s, _ in keys}),
        list({m for _, m in keys}),
    )
    found = {(r["session_id"], r["message_id"]): r["unit"] for r in rows}
    return [found.get(k) for k in keys]


def previous_units(
    units: Sequence[str], order: Sequence[tuple[Hashable, datetime, str]]
) -> list[str | None]:
    """Each message's previous turn's unit among the given ones, cut as index_session_context
    stores it (embed_prev); ``order`` is each one's (session key, sent_at, message_id)."""
    previous: list[str | None] = [None] * len(units)
    ranked = sorted(range(len(units)), key=lambda i: (order[i][1], order[i][2]))
    last: dict[Hashable, int] = {}
    for i in ranked:
        before = last.get(order[i][0])
        if before is not None:
            previous[i] = units[before][-PREV_CHARS:]
        last[order[i][0]] = i
    return previous


def embed_unit(unit: str, previous: str | None) -> str:
    """EMBED_UNIT_SQL in Python: for texts embedded before their rows exist (an import)."""
    return unit if previous is None else f"{previous}\n{unit}"


async def set_message_embeddings(
    conn: Connection,
    scope: Scope,
    keys: Sequence[tuple[str, str]],
    vectors: np.ndarray,
    model_id: str,
    units: Sequence[str],
) -> None:
    """Store embeddings of (session_id, message_id) rows and mark their projection ok. Each
    row's unit is re-checked: one whose previous turn changed meanwhile (index_session_context)
    keeps its state, for the reconciler."""
    await conn.executemany(
        "UPDATE messages SET embedding = $7, embedding_model = $8, embedding_state = 'ok'"
        " WHERE tenant_id = $1 AND user_id = $2 AND persona_id = $3 AND agent_id = $4"
        f" AND session_id = $5 AND message_id = $6 AND {EMBED_UNIT_SQL} = $9",
        [
            (*scope.key, s, m, v, model_id, u)
            for (s, m), v, u in zip(keys, vectors, units, strict=True)
        ],
    )


async def index_session_context(
    conn: Connection, scope: Scope, session_id: str, message_ids: Sequence[str]
) -> int:
    """(Re)build the context tsvector of the given messages and of the two before each of
    them in the session (their forward neighbours changed), and their previous turn as their
    vector holds it (embed_prev, EMBED_UNIT_SQL): a vector made with another previous turn
    is stale, for the reconciler. Returns rows updated.

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
            SELECT message_id, i, unit, right(lag(unit) OVER o, {PREV_CHARS}) AS prev,
                   concat_ws(' ', lag(unit) OVER o, lead(unit) OVER o) AS near,
                   concat_ws(' ', lag(unit, 2) OVER o, lead(unit, 2) OVER o) AS far
            FROM s WINDOW o AS (ORDER BY i)
        ),
        first_new AS (SELECT coalesce(min(i), 0) AS i FROM s WHERE message_id = ANY($6::text[])),
        ctx AS (
            SELECT w.message_id, w.prev,
                   setweight(to_tsvector('english', w.unit), 'A')
                || setweight(to_tsvector('english', w.near), 'B')
                || setweight(to_tsvector('english', w.far), 'C') AS tsv
            FROM w, first_new f
            WHERE f.i > 0 AND w.i >= f.i - 2
        )
        UPDATE messages m
        SET context_tsv = ctx.tsv, embed_prev = ctx.prev,
            embedding_state = CASE
                WHEN m.embedding_state = 'ok' AND m.embed_prev IS DISTINCT FROM ctx.prev
                THEN 'stale' ELSE m.embedding_state END
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
