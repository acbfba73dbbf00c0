"""SQL of retention: expired rows deleted in bounded batches, session ends, episode expiry.

Every batch is one short statement that takes the oldest expired rows with
``FOR UPDATE SKIP LOCKED``: several expiry workers each take different rows and never wait on
one another, and no lock outlives the statement's transaction. Reads never depend on these
deletions having run: they filter ``expires_at > now()`` themselves.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Literal

import asyncpg

from memsvc.storage import changes, messages, versions
from memsvc.storage.conditions import not_expired
from memsvc.storage.connection import Connection
from memsvc.storage.locks import lock_user
from memsvc.storage.model import Scope

USER_CONTROLLED = "user-controlled"
SESSION = "session"
TTL = "ttl"


def _scopes(rows: Iterable[asyncpg.Record]) -> list[Scope]:
    return [Scope.from_row(r) for r in rows]


# A per-user batch: on Citus FOR UPDATE SKIP LOCKED works only in a single-shard statement,
# so the expiry task takes one user at a time there (governance.expiry, users_with_expired);
# the user's tenant and id are $2 and $3 of the batch statements.
User = tuple[str, str]
ExpiringTable = Literal["memories", "messages", "episodes"]


async def users_with_expired(conn: Connection, table: ExpiringTable, limit: int) -> list[User]:
    """Up to ``limit`` users with expired rows in ``table``, the oldest expiry first. Reads
    only, without locks: on Citus a statement over every shard."""
    rows = await conn.fetch(
        f"SELECT tenant_id, user_id FROM {table} WHERE expires_at <= now()"
        " GROUP BY tenant_id, user_id ORDER BY min(expires_at) LIMIT $1",
        limit,
    )
    return [(r["tenant_id"], r["user_id"]) for r in rows]


def _of(user: User | None) -> tuple[str, ...]:
    return () if user is None else user


async def expire_memories(conn: Connection, limit: int, *, user: User | None = None) -> list[Scope]:
    """Delete up to ``limit`` expired memory rows, oldest expiry first; an expired current
    version takes its whole supersession chain with it. Derived edges (episode -> fact) go by
    cascade. Returns the scope of every row deleted (one entry per row). Call inside a
    transaction: the change stream records these deletes as expired. ``user``: only theirs."""
    statement = _EXPIRE_MEMORIES if user is None else _EXPIRE_MEMORIES_OF_USER
    async with changes.deletes_recorded_as(conn, "expired"):
        rows = await conn.fetch(statement, limit, *_of(user))
    return _scopes(rows)


_EXPIRE_MEMORIES_SQL = """
        WITH picked AS (
            SELECT tenant_id, user_id, memory_id, lineage_id, invalid_at FROM memories
            WHERE expires_at <= now(){picked}
            ORDER BY expires_at
            LIMIT $1
            FOR UPDATE SKIP LOCKED),
        chain AS (
            -- Older versions of an expired current one. A version another worker holds is
            -- skipped: it is expired too, and that worker deletes it.
            SELECT m.tenant_id, m.user_id, m.memory_id FROM memories m
            JOIN picked p ON {chain}
                         AND m.lineage_id = p.lineage_id AND p.invalid_at IS NULL
            FOR UPDATE OF m SKIP LOCKED)
        DELETE FROM memories m
        USING (SELECT tenant_id, user_id, memory_id FROM picked
               UNION SELECT tenant_id, user_id, memory_id FROM chain) AS d
        WHERE {target} AND m.memory_id = d.memory_id
        RETURNING m.tenant_id, m.user_id, m.persona_id, m.agent_id
        """
_EXPIRE_MEMORIES = _EXPIRE_MEMORIES_SQL.format(
    picked="",
    chain="m.tenant_id = p.tenant_id AND m.user_id = p.user_id",
    target="m.tenant_id = d.tenant_id AND m.user_id = d.user_id",
)
# One user's: every table reference names the user by its parameters (a router statement).
_EXPIRE_MEMORIES_OF_USER = _EXPIRE_MEMORIES_SQL.format(
    picked=" AND tenant_id = $2 AND user_id = $3",
    chain="m.tenant_id = $2 AND m.user_id = $3",
    target="m.tenant_id = $2 AND m.user_id = $3",
)


async def expire_messages(
    conn: Connection, limit: int, *, user: User | None = None
) -> list[tuple[Scope, str]]:
    """Delete up to ``limit`` expired messages, oldest expiry first; returns the (owner scope,
    session) of every row deleted. ``user``: only theirs."""
    # By key, not ctid: a row another transaction updated after this statement's snapshot is
    # locked at its newest version, whose ctid the snapshot's scan would never match.
    picked, target = _user_filters(user, "m")
    rows = await conn.fetch(
        f"""
        DELETE FROM messages m
        USING (SELECT tenant_id, user_id, persona_id, agent_id, session_id, message_id
               FROM messages
               WHERE expires_at <= now(){picked}
               ORDER BY expires_at
               LIMIT $1
               FOR UPDATE SKIP LOCKED) AS d
        WHERE {target}
          AND m.persona_id = d.persona_id AND m.agent_id = d.agent_id
          AND m.session_id = d.session_id AND m.message_id = d.message_id
        RETURNING m.tenant_id, m.user_id, m.persona_id, m.agent_id, m.session_id
        """,
        limit,
        *_of(user),
    )
    return [(s, r["session_id"]) for s, r in zip(_scopes(rows), rows, strict=True)]


async def expire_episodes(conn: Connection, limit: int, *, user: User | None = None) -> list[Scope]:
    """Delete up to ``limit`` expired episodes; their topic and fact edges go by cascade
    (the facts themselves stay). Returns the scope of every episode deleted. ``user``: only
    theirs."""
    picked, target = _user_filters(user, "e")
    rows = await conn.fetch(
        f"""
        DELETE FROM episodes e
        USING (SELECT tenant_id, user_id, episode_id FROM episodes
               WHERE expires_at <= now(){picked}
               ORDER BY expires_at
               LIMIT $1
               FOR UPDATE SKIP LOCKED) AS d
        WHERE {target} AND e.episode_id = d.episode_id
        RETURNING e.tenant_id, e.user_id, e.persona_id, e.agent_id
        """,
        limit,
        *_of(user),
    )
    return _scopes(rows)


def _user_filters(user: User | None, alias: str) -> tuple[str, str]:
    """(the picking subquery's extra condition, the deleted row's user condition)."""
    if user is None:
        return "", f"{alias}.tenant_id = d.tenant_id AND {alias}.user_id = d.user_id"
    return (
        " AND tenant_id = $2 AND user_id = $3",
        f"{alias}.tenant_id = $2 AND {alias}.user_id = $3",
    )


async def drop_orphan_topics(conn: Connection, tenant_id: str, user_id: str) -> int:
    """Topics of the user left without any episode (as erasure does: a topic's name is
    derived from the conversations it grouped). Takes the user's extraction lock, so a job
    linking a fresh episode to one of them is never undone; call inside a transaction."""
    await lock_user(conn, tenant_id, user_id)
    status: str = await conn.execute(
        "DELETE FROM topics t WHERE t.tenant_id = $1 AND t.user_id = $2 AND NOT EXISTS ("
        " SELECT 1 FROM topic_episodes e WHERE e.tenant_id = t.tenant_id"
        " AND e.user_id = t.user_id AND e.topic_id = t.topic_id)",
        tenant_id,
        user_id,
    )
    return int(status.split()[-1])


async def bump_versions(conn: Connection, users: Iterable[tuple[str, str]]) -> None:
    """A new content version for each (tenant, user), in one statement (storage.versions).
    Sorted, so two workers bumping overlapping users lock their rows in the same order (no
    deadlock)."""
    await versions.bump_versions(conn, sorted(set(users)))


async def live_sessions(
    conn: Connection, sessions: Sequence[tuple[Scope, str]], *, user: User | None = None
) -> list[tuple[Scope, str]]:
    """The given sessions that still hold an unexpired message (one statement). ``user``:
    they are all that user's (the per-user expiry batch on Citus, which refuses the
    correlated form below: a subquery correlated to a set-returning function)."""
    if not sessions:
        return []
    if user is not None:
        rows = await conn.fetch(
            "SELECT DISTINCT tenant_id, user_id, persona_id, agent_id, session_id FROM messages m"
            " WHERE tenant_id = $1 AND user_id = $2 AND (persona_id, agent_id, session_id) IN"
            " (SELECT * FROM unnest($3::text[], $4::text[], $5::text[]))"
            f" AND {not_expired('m')}",
            *user,
            [scope.persona_id for scope, _ in sessions],
            [scope.agent_id for scope, _ in sessions],
            [session_id for _, session_id in sessions],
        )
        return [(Scope.from_row(r), r["session_id"]) for r in rows]
    columns = list(zip(*((*scope.key, session_id) for scope, session_id in sessions), strict=True))
    rows = await conn.fetch(
        "SELECT tenant_id, user_id, persona_id, agent_id, session_id FROM unnest($1::text[],"
        " $2::text[], $3::text[], $4::text[], $5::text[])"
        " AS x(tenant_id, user_id, persona_id, agent_id, session_id) WHERE EXISTS (SELECT 1"
        " FROM messages m WHERE m.tenant_id = x.tenant_id AND m.user_id = x.user_id"
        " AND m.persona_id = x.persona_id AND m.agent_id = x.agent_id"
        " AND m.session_id = x.session_id"
        f" AND {not_expired('m')})",
        *(list(c) for c in columns),
    )
    return [(Scope.from_row(r), r["session_id"]) for r in rows]


async def reindex_session(conn: Connection, scope: Scope, session_id: str) -> None:
    """Rebuild the context index of a session some messages expired from (their neighbours'
    index still held the expired words); serialised per session."""
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 11))",
            "\x1f".join((*scope.key, session_id)),
        )
        await messages.reindex_sessions(conn, [(scope, session_id)])


async def end_session(conn: Connection, scopes: Sequence[Scope], session_id: str) -> int:
    """Delete the SESSION memories of a session that ended (every version), in each of the
    given exact scopes; call inside a transaction. Returns rows deleted."""
    deleted = 0
    for scope in dict.fromkeys(scopes):
        await lock_user(conn, scope.tenant_id, scope.user_id)
        async with changes.deletes_recorded_as(conn, "expired"):
            status: str = await conn.execute(
                "DELETE FROM memories WHERE tenant_id = $1 AND user_id = $2 AND persona_id = $3"
                " AND agent_id = $4 AND session_id = $5 AND retention_policy = 'session'",
                *scope.key,
                session_id,
            )
        deleted += int(status.split()[-1])
    return deleted


async def drop_expired_duplicate(conn: Connection, scope: Scope, content_hash: bytes) -> int:
    """Delete the expired (not yet purged) active memory with exactly this content in exactly
    this scope, with its chain, so a new write of the same content starts a fresh memory
    instead of reviving an expired one. Returns rows deleted."""
    async with changes.deletes_recorded_as(conn, "expired"):
        status: str = await conn.execute(
            "DELETE FROM memories WHERE tenant_id = $1 AND user_id = $2 AND lineage_id IN ("
            " SELECT lineage_id FROM memories WHERE tenant_id = $1 AND user_id = $2"
            " AND persona_id = $3 AND agent_id = $4 AND content_hash = $5"
            " AND invalid_at IS NULL AND expires_at <= now())",
            *scope.key,
            content_hash,
        )
    return int(status.split()[-1])


async def align_lineage(
    conn: Connection, tenant_id: str, user_id: str, lineage_id: uuid.UUID
) -> None:
    """Give the older versions of a memory the retention of its current version (after an
    explicit write changed it), so the whole chain expires, or ends with its session, as one."""
    await conn.execute(
        "UPDATE memories o SET retention_policy = c.retention_policy, expires_at = c.expires_at,"
        " session_id = CASE WHEN c.retention_policy = 'session' THEN c.session_id"
        " ELSE o.session_id END"
        " FROM memories c WHERE c.tenant_id = $1 AND c.user_id = $2 AND c.lineage_id = $3"
        " AND c.invalid_at IS NULL AND o.tenant_id = $1 AND o.user_id = $2"
        " AND o.lineage_id = $3 AND o.invalid_at IS NOT NULL"
        " AND (o.retention_policy, o.expires_at, o.session_id)"
        " IS DISTINCT FROM (c.retention_policy, c.expires_at,"
        " CASE WHEN c.retention_policy = 'session' THEN c.session_id ELSE o.session_id END)",
        tenant_id,
        user_id,
        lineage_id,
    )


async def stamp_episode(
    conn: Connection, owner: Scope, episode_scope: Scope, session_id: str
) -> None:
    """An episode expires with the last of its source messages (the session owner's; all of
    the session's when it names none): NULL (never) as soon as one of them never expires, or
    when none is found."""
    # Two statements, not one UPDATE with a subquery: the owner and the speaker are two users
    # (a meeting), whose rows Citus keeps on different shards.
    sources = await conn.fetch(
        "SELECT message_id, expires_at FROM messages"
        " WHERE tenant_id = $1 AND user_id = $2 AND persona_id = $3 AND agent_id = $4"
        " AND session_id = $5",
        *owner.key,
        session_id,
    )
    await conn.execute(
        """
        UPDATE episodes e SET expires_at = (
            SELECT CASE WHEN count(*) = 0 OR bool_or(m.expires_at IS NULL) THEN NULL
                        ELSE max(m.expires_at) END
            FROM unnest($6::text[], $7::timestamptz[]) AS m(message_id, expires_at)
            WHERE m.message_id = ANY(e.source_message_ids)
               OR cardinality(e.source_message_ids) = 0)
        WHERE e.tenant_id = $1 AND e.user_id = $2 AND e.persona_id = $3 AND e.agent_id = $4
          AND e.session_id = $5
        """,
        *episode_scope.key,
        session_id,
        [r["message_id"] for r in sources],
        [r["expires_at"] for r in sources],
    )
