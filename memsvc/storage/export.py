"""SQL of ExportMemories: each kind's rows for one subject, read through server-side cursors.

The caller holds one read-only REPEATABLE READ transaction (one snapshot for every kind) and
pulls each cursor in bounded batches, so a user's whole history is never held in memory.
Expiry is judged against one instant (`at`, the snapshot's now()): a row with
expires_at <= at is being deleted and is not exported. Embeddings and search indexes are
derived data and are never selected.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from memsvc.storage.conditions import not_expired, visible
from memsvc.storage.connection import Connection
from memsvc.storage.edits import EDITS_JSON_SQL
from memsvc.storage.model import Scope
from memsvc.storage.references import last_referenced_sql

# Marks the export's statements in pg_stat_activity (and lets a test find them).
MARKER = "/* memsvc:export */"

Statement = tuple[str, list[Any]]


@dataclass(frozen=True)
class Subject:
    """Whose data: one exact scope, or (whole_user) every persona and agent of scope.user_id."""

    scope: Scope
    whole_user: bool = False


def _owner(subject: Subject, alias: str) -> tuple[str, list[Any]]:
    """The rows stored in the subject's scope (or under its user): predicate and arguments."""
    p = f"{alias}."
    scope = subject.scope
    if subject.whole_user:
        return f"{p}tenant_id = $1 AND {p}user_id = $2", [scope.tenant_id, scope.user_id]
    return (
        f"{p}tenant_id = $1 AND {p}user_id = $2 AND {p}persona_id = $3 AND {p}agent_id = $4",
        list(scope.key),
    )


def memories(subject: Subject, at: datetime) -> Statement:
    """Every version of every memory, lineages oldest first, versions oldest first. An exact
    scope exports what its reads can show: its own rows and rows of the same user explicitly
    shared into it (the rule of storage.conditions.visible)."""
    if subject.whole_user:
        where, args = _owner(subject, "m")
    else:
        where = visible("m")
        args = list(subject.scope.key)
    args.append(at)
    return (
        f"""{MARKER}
        SELECT m.memory_id, m.lineage_id, m.user_id, m.persona_id, m.agent_id, m.content,
               m.subject, m.predicate, m.object, m.category, m.role, m.confidence,
               m.reinforced_count, m.pinned, m.status, m.valid_from, m.invalid_at,
               m.recorded_at, m.last_reinforced_at,
               {last_referenced_sql("m", user_id="$2")} AS last_referenced_at, m.supersedes_id,
               m.superseded_by_id, m.source_message_ids, m.session_id, m.origin,
               m.correction_reason, m.retention_policy, m.expires_at, m.shared_all_agents,
               m.shared_all_personas, m.ingest_id, m.demoted_at, m.demoted_role,
               m.demoted_pinned, m.demoted_into, m.updated_at, {EDITS_JSON_SQL} AS edits,
               min(m.recorded_at) OVER (PARTITION BY m.lineage_id) AS lineage_started_at
        FROM memories m
        WHERE {where} AND {not_expired("m", at=f"${len(args)}")}
        ORDER BY lineage_started_at, m.lineage_id, m.recorded_at, m.memory_id""",
        args,
    )


# The subqueries below name the user by $2 (every statement here is of one user), not by the
# outer row: on Citus a subquery correlated only to the row is planned over every shard.


def episodes(subject: Subject, at: datetime) -> Statement:
    """Episodes oldest first, with the facts they produced and the topics they belong to."""
    where, args = _owner(subject, "e")
    args.append(at)
    return (
        f"""{MARKER}
        SELECT e.episode_id, e.user_id, e.persona_id, e.agent_id, e.session_id, e.title,
               e.summary, e.excerpt, e.source_message_ids, e.started_at, e.ended_at,
               e.recorded_at, e.expires_at,
               ARRAY(SELECT em.memory_id FROM episode_memories em
                     WHERE em.tenant_id = e.tenant_id AND em.user_id = $2
                       AND em.episode_id = e.episode_id ORDER BY em.memory_id) AS memory_ids,
               ARRAY(SELECT te.topic_id FROM topic_episodes te
                     WHERE te.tenant_id = e.tenant_id AND te.user_id = $2
                       AND te.episode_id = e.episode_id ORDER BY te.topic_id) AS topic_ids
        FROM episodes e
        WHERE {where} AND {not_expired("e", at=f"${len(args)}")}
        ORDER BY e.started_at, e.episode_id""",
        args,
    )


def topics(subject: Subject, at: datetime) -> Statement:
    """Topics oldest first, with the episodes linked to each."""
    where, args = _owner(subject, "t")
    return (
        f"""{MARKER}
        SELECT t.topic_id, t.user_id, t.persona_id, t.agent_id, t.name, t.is_persona, t.weight,
               t.last_episode_at, t.created_at,
               ARRAY(SELECT te.episode_id FROM topic_episodes te
                     WHERE te.tenant_id = t.tenant_id AND te.user_id = $2
                       AND te.topic_id = t.topic_id ORDER BY te.episode_id) AS episode_ids
        FROM topics t
        WHERE {where}
        ORDER BY t.created_at, t.topic_id""",
        args,
    )


def messages(subject: Subject, at: datetime) -> Statement:
    """Messages grouped by session (sessions in order of their first message), conversation
    order inside. Whole user: also what they said in sessions owned by someone else (a
    meeting; the rows erase_user deletes too), never the other participants' turns."""
    if subject.whole_user:
        where = "g.tenant_id = $1 AND (g.user_id = $2 OR g.sender_id = $2)"
        args: list[Any] = [subject.scope.tenant_id, subject.scope.user_id]
    else:
        where, args = _owner(subject, "g")
    args.append(at)
    return (
        f"""{MARKER}
        SELECT g.user_id, g.persona_id, g.agent_id, g.session_id, g.message_id, g.sender_id,
               g.sender_name, g.role, g.text, g.sent_at, g.recorded_at, g.retention_policy,
               g.expires_at, g.ingest_id,
               min(g.sent_at) OVER (PARTITION BY g.user_id, g.persona_id, g.agent_id,
                                    g.session_id) AS session_started_at
        FROM messages g
        WHERE {where} AND {not_expired("g", at=f"${len(args)}")}
        ORDER BY session_started_at, g.user_id, g.persona_id, g.agent_id, g.session_id,
                 g.sent_at, g.message_id""",
        args,
    )


def core_blocks(subject: Subject, at: datetime) -> Statement:
    """Every revision of the core blocks (persona, human), oldest first per block; the current
    one has no replaced_at. Only the subject's own blocks (never shared)."""
    where, args = _owner(subject, "b")
    return (
        f"""{MARKER}
        SELECT b.user_id, b.persona_id, b.agent_id, b.block, b.revision, b.text, b.mode,
               b.author, b.reason, b.recorded_at, b.replaced_at
        FROM core_block_revisions b
        WHERE {where}
        ORDER BY b.user_id, b.persona_id, b.agent_id, b.block, b.revision""",
        args,
    )


# Export order of the kinds, and each kind's statement.
KINDS: tuple[tuple[str, Callable[[Subject, datetime], Statement]], ...] = (
    ("memory", memories),
    ("episode", episodes),
    ("topic", topics),
    ("message", messages),
    ("core_block", core_blocks),
)


async def snapshot_time(conn: Connection) -> datetime:
    """The transaction's now(): the export's `exported_at` and the instant expiry is judged at."""
    value: datetime = await conn.fetchval("SELECT now()")
    return value


async def batches(
    conn: Connection,
    statement: Statement,
    *,
    batch_rows: int,
    fetch_timeout: Callable[[], float],
) -> AsyncGenerator[list[asyncpg.Record], None]:
    """The statement's rows, at most `batch_rows` at a time, through a server-side cursor (it
    needs the caller's transaction). `fetch_timeout` is asked before each round trip."""
    sql, args = statement
    cursor = await conn.cursor(sql, *args, timeout=fetch_timeout())
    while True:
        rows = await cursor.fetch(batch_rows, timeout=fetch_timeout())
        if rows:
            yield rows
        if len(rows) < batch_rows:
            return
