"""Erasure that reaches every derived copy: memories with their chains, the messages they came
from, episode and topic text derived from them, pending work — for one memory, a scope or a user.

Every function runs inside the caller's transaction and first takes the user's extraction lock
(the one the workers hold while committing a speaker), so a job in flight can never write back
what an erasure just removed: it either committed before (and is erased now) or finds its
source messages gone and writes nothing.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence

from memsvc.storage import changes, messages
from memsvc.storage.conditions import EXACT_SCOPE
from memsvc.storage.connection import Connection
from memsvc.storage.locks import lock_user
from memsvc.storage.model import Scope

# Every table with rows about a user (keyed by tenant_id, user_id). Listing them makes
# "nothing left anywhere" a property a test can check table by table.
USER_TABLES = (
    "episode_memories",
    "topic_episodes",
    # Edits go with their memory (ON DELETE CASCADE); listed so erasure is checked for them.
    "memory_edits",
    "memories",
    "episodes",
    "topics",
    "messages",
    "ingest_outbox",
    "extraction_runs",
    "quota_counters",
    "core_block_revisions",
    "scope_versions",
)
# Tables whose rows belong to one exact scope (tenant, user, persona, agent).
SCOPED_TABLES = (
    "memories",
    "episodes",
    "topics",
    "messages",
    "ingest_outbox",
    "extraction_runs",
    "core_block_revisions",
)

_EXACT = EXACT_SCOPE


def _count(status: str) -> int:
    return int(status.split()[-1])


async def erase_user(conn: Connection, tenant_id: str, user_id: str) -> int:
    """Everything about the user in this tenant, across personas and agents, including what
    they said in other people's sessions. Returns how many memory rows went."""
    await lock_user(conn, tenant_id, user_id)
    deleted_memories = 0
    # The change stream: no entry per memory; the user's log is replaced by one 'erased'.
    async with changes.deletes_recorded_as(conn, "none"):
        for table in USER_TABLES:
            status: str = await conn.execute(
                f"DELETE FROM {table} WHERE tenant_id = $1 AND user_id = $2", tenant_id, user_id
            )
            if table == "memories":
                deleted_memories = _count(status)
    await changes.record_erasure(conn, tenant_id, user_id)
    # Their turns in sessions owned by others (meetings): data about them too, and the
    # context index of the turns around them.
    touched = await messages.delete_returning_sessions(
        conn, "tenant_id = $1 AND sender_id = $2", tenant_id, user_id
    )
    await messages.reindex_sessions(conn, touched)
    return deleted_memories


async def erase_scope(conn: Connection, scope: Scope) -> int:
    """Everything stored in exactly this scope (memories, episodes, topics, messages, pending
    work); other personas and agents of the user are untouched. Returns memory rows deleted."""
    await lock_user(conn, scope.tenant_id, scope.user_id)
    args = (scope.tenant_id, scope.user_id, scope.persona_id, scope.agent_id)
    deleted_memories = 0
    for table in SCOPED_TABLES:
        status: str = await conn.execute(f"DELETE FROM {table} WHERE {_EXACT}", *args)
        if table == "memories":
            deleted_memories = _count(status)
    return deleted_memories


async def erase_memories(
    conn: Connection,
    scope: Scope,
    lineage_ids: Sequence[uuid.UUID],
) -> int:
    """Every version of the given memories and what was derived from them: their source
    messages, the episodes' text (an episode with no other fact goes entirely, another is
    rewritten from its remaining facts and re-embedded), the episodes' topics no remaining
    fact names (fed_topics), and topics left without episodes. Returns memory rows deleted."""
    tenant, user = scope.tenant_id, scope.user_id
    await lock_user(conn, tenant, user)
    rows = await conn.fetch(
        "SELECT memory_id, session_id, source_message_ids FROM memories"
        " WHERE tenant_id = $1 AND user_id = $2 AND lineage_id = ANY($3::uuid[])",
        tenant,
        user,
        list(lineage_ids),
    )
    memory_ids = [r["memory_id"] for r in rows]
    episodes = [
        r["episode_id"]
        for r in await conn.fetch(
            "SELECT DISTINCT episode_id FROM episode_memories"
            " WHERE tenant_id = $1 AND user_id = $2 AND memory_id = ANY($3::uuid[])",
            tenant,
            user,
            memory_ids,
        )
    ]
    deleted = _count(
        await conn.execute(
            "DELETE FROM memories WHERE tenant_id = $1 AND user_id = $2"
            " AND memory_id = ANY($3::uuid[])",
            tenant,
            user,
            memory_ids,
        )
    )
    # The conversation lines the memories were taken from (any owner's session, this tenant),
    # and the context index of the lines around them: one pass per session (a memory's
    # versions, and facts from one turn, share their lines). First in the user's own
    # sessions (their shard alone on Citus); only lines still missing are looked for in
    # sessions other users own (a meeting), which on Citus means every shard.
    sources: dict[str, set[str]] = {}
    for r in rows:
        if r["session_id"] and r["source_message_ids"]:
            sources.setdefault(r["session_id"], set()).update(r["source_message_ids"])
    touched: list[tuple[Scope, str]] = []
    for session_id, ids in sources.items():
        source_ids = sorted(ids)
        own = await messages.delete_returning_sessions(
            conn,
            "tenant_id = $1 AND user_id = $2 AND session_id = $3 AND message_id = ANY($4::text[])",
            tenant,
            user,
            session_id,
            source_ids,
        )
        touched += own
        if len(own) < len(source_ids):
            touched += await messages.delete_returning_sessions(
                conn,
                "tenant_id = $1 AND session_id = $2 AND message_id = ANY($3::text[])",
                tenant,
                session_id,
                source_ids,
            )
    await messages.reindex_sessions(conn, touched)
    await _rewrite_episodes(conn, tenant, user, episodes)
    await conn.execute(
        "DELETE FROM topics t WHERE t.tenant_id = $1 AND t.user_id = $2 AND NOT EXISTS ("
        " SELECT 1 FROM topic_episodes e WHERE e.tenant_id = t.tenant_id"
        " AND e.user_id = t.user_id AND e.topic_id = t.topic_id)",
        tenant,
        user,
    )
    return deleted


async def _rewrite_episodes(
    conn: Connection,
    tenant: str,
    user: str,
    episode_ids: Sequence[uuid.UUID],
) -> None:
    """Episodes that summarised an erased fact: gone when it was their only fact, otherwise
    rebuilt from the facts that remain (free text that may quote the erased fact — summary,
    excerpt, a model's title — is not kept) with the old vector dropped for re-embedding."""
    for episode_id in episode_ids:
        remaining = await conn.fetch(
            "SELECT m.content, m.predicate FROM episode_memories em JOIN memories m"
            " ON m.tenant_id = em.tenant_id AND m.user_id = em.user_id"
            " AND m.memory_id = em.memory_id"
            " WHERE em.tenant_id = $1 AND em.user_id = $2 AND em.episode_id = $3"
            " ORDER BY m.recorded_at, m.memory_id",
            tenant,
            user,
            episode_id,
        )
        if not remaining:
            await conn.execute(
                "DELETE FROM episodes WHERE tenant_id = $1 AND user_id = $2 AND episode_id = $3",
                tenant,
                user,
                episode_id,
            )
            continue
        # The title is read first, not computed in the UPDATE: Citus refuses a stable
        # function (to_char of a timestamptz) over a column in an UPDATE.
        title = await conn.fetchval(
            "SELECT 'Conversation of ' || to_char(ended_at, 'FMDD Mon YYYY') FROM episodes"
            " WHERE tenant_id = $1 AND user_id = $2 AND episode_id = $3",
            tenant,
            user,
            episode_id,
        )
        await conn.execute(
            "UPDATE episodes SET title = $5,"
            " summary = $4, excerpt = '', embedding = NULL, embedding_state = 'missing'"
            " WHERE tenant_id = $1 AND user_id = $2 AND episode_id = $3",
            tenant,
            user,
            episode_id,
            # Facts are standalone sentences: together they are the summary that is left.
            " ".join(r["content"] for r in remaining),
            title,
        )
        # Topics the erased facts alone fed: those no remaining fact names.
        linked = await conn.fetch(
            "SELECT t.topic_id, t.name FROM topic_episodes te JOIN topics t"
            " ON t.tenant_id = te.tenant_id AND t.user_id = te.user_id"
            " AND t.topic_id = te.topic_id"
            " WHERE te.tenant_id = $1 AND te.user_id = $2 AND te.episode_id = $3",
            tenant,
            user,
            episode_id,
        )
        kept = set(fed_topics([r["name"] for r in linked], [r["content"] for r in remaining]))
        await conn.execute(
            "DELETE FROM topic_episodes WHERE tenant_id = $1 AND user_id = $2"
            " AND episode_id = $3 AND topic_id = ANY($4::uuid[])",
            tenant,
            user,
            episode_id,
            [r["topic_id"] for r in linked if r["name"] not in kept],
        )


# Words as a topic name and a fact's content share them ("Stripe job" in "The user got a new
# job at Stripe."): runs of letters and digits, which is all a topic's words are.
_WORD = re.compile(r"\w+")


def fed_topics(names: Sequence[str], contents: Sequence[str]) -> list[str]:
    """The topic names some content still names: every word of the name is a word of one
    content, whatever the case. The rules extractor takes a topic's words from the sentence
    a fact came from, and a fact's content says that sentence again, so a topic no remaining
    fact names was fed by erased facts alone (or by free text: dropped too, as erasure must
    err)."""
    said = [set(_WORD.findall(c.casefold())) for c in contents]
    return [
        name
        for name in names
        if (words := set(_WORD.findall(name.casefold())))
        and any(words <= content for content in said)
    ]
