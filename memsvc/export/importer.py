"""ImportMemories: the JSON lines ExportMemories wrote, back into one user, all or nothing.

Every line is read and checked first (export/parse.py), the tenant's PII policy is applied to
every text as the write paths apply it (facts as Remember: a rejected kind refuses the
import, naming the line; conversation history as Ingest: redacted), the texts not stored yet
are embedded with the configured embedder in batches (the export carries no vectors; for
half the call's deadline at most, the rest is stored `missing` for the reconciler), and
then everything is written in one transaction under the user's lock, the version bumped
and the Prefetch cache dropped.

Ids: a record imported into the user it was exported from keeps its ids; into another user
each id becomes uuid5(tenant, target user, original id), so links between records (a
correction's supersedes/superseded_by, an episode's facts and topics) stay consistent and
a re-run maps every record to the same id. A record whose id (a message: its session and
message id) is already stored is skipped and counted as such: a re-run imports nothing
twice. History (superseded versions with their validity and links), provenance, retention
and demotion are kept; messages are indexed for search (context index and vectors) as the
ingest workers index them, so Recall finds them at once.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import asyncpg
import numpy as np
import orjson

from memsvc.cache.invalidation import PacketInvalidator
from memsvc.concurrency.deadline import Budget
from memsvc.config import from_setting
from memsvc.embedding import Embedder, EmbeddingError
from memsvc.errors import InvalidArgument
from memsvc.export import parse
from memsvc.export.checks import RecordLimits, check_records
from memsvc.export.parse import (
    CoreBlockLine,
    EpisodeLine,
    MemoryLine,
    MessageLine,
    Parsed,
    RecordScope,
    TopicLine,
)
from memsvc.governance.guard import PiiGuard
from memsvc.governance.pii import Screened
from memsvc.observability import metrics
from memsvc.storage import changes
from memsvc.storage import imports as sql
from memsvc.storage import messages as message_sql
from memsvc.storage.imports import Column, json_array_column
from memsvc.storage.locks import lock_user
from memsvc.storage.model import Scope
from memsvc.storage.normalize import content_hash
from memsvc.storage.pool import acquire

log = logging.getLogger(__name__)

# The namespace of ids derived for another user (uuid5 of tenant, target user, original id).
ID_NAMESPACE = uuid.UUID("5b0f9c0e-7a53-4c1e-9d1f-6d656d737663")
KINDS = ("memory", "episode", "topic", "message", "core_block")


@dataclass(frozen=True)
class ImportConfig:
    acquire_timeout_s: float = field(metadata=from_setting("pg_acquire_timeout_ms"))
    # Batches of many texts: the background bound, not one query's.
    embed_timeout_s: float = field(metadata=from_setting("worker_embed_timeout_s"))
    embed_batch: int = field(metadata=from_setting("import_embed_batch"))
    # This server's closed vocabularies: a record outside them is refused, as Remember would.
    categories: tuple[str, ...] = field(default=(), metadata=from_setting("categories"))
    roles: tuple[str, ...] = field(default=(), metadata=from_setting("roles"))
    # Remember's and Ingest's length limits (MEMSVC_MAX_CONTENT_CHARS, _MAX_MESSAGE_CHARS).
    limits: RecordLimits = field(
        default_factory=lambda: RecordLimits(max_content_chars=2_000, max_message_chars=8_000)
    )


@dataclass
class ImportResult:
    """Imported and skipped records of each kind, and the lines read."""

    lines: int
    imported: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))


@dataclass(frozen=True)
class _Ids:
    """Maps a record's ids into the target user (see the module docstring)."""

    tenant_id: str
    user_id: str

    def __call__(self, original: uuid.UUID, owner: str) -> uuid.UUID:
        if owner == self.user_id:
            return original
        return uuid.uuid5(ID_NAMESPACE, f"{self.tenant_id}\x1f{self.user_id}\x1f{original}")

    def opt(self, original: uuid.UUID | None, owner: str) -> uuid.UUID | None:
        return None if original is None else self(original, owner)


@dataclass
class _Screened:
    """The texts as they may be stored, by kind, in the parsed order."""

    memories: list[dict[str, str]]
    episodes: list[dict[str, str]]
    topics: list[str]
    messages: list[str]
    core_blocks: list[str]
    # The messages' sender_name, screened like their text.
    sender_names: list[str] = field(default_factory=list)


class ImportService:
    def __init__(
        self,
        pool: asyncpg.Pool,
        embedder: Embedder,
        invalidator: PacketInvalidator,
        guard: PiiGuard,
        config: ImportConfig,
    ) -> None:
        self._pool = pool
        self._embedder = embedder
        self._invalidator = invalidator
        # Each write wakes the user's change watchers where the trigger cannot (Citus).
        self._waker = changes.Waker()
        self._guard = guard
        self._config = config

    async def import_lines(
        self,
        target: Scope,
        lines: Sequence[tuple[int, str]],
        budget: Budget,
        *,
        keep_record_scopes: bool = False,
    ) -> ImportResult:
        """Check every line, then write them all in one transaction (see the module
        docstring). InvalidArgument names the first bad line; nothing is written then."""
        parsed = await asyncio.to_thread(parse.parse, lines)
        self._check_vocabulary(parsed)
        check_records(parsed, self._config.limits)
        policy = await self._guard.policy(target.tenant_id)
        texts = await asyncio.to_thread(self._screen, parsed, policy)
        ids = _Ids(target.tenant_id, target.user_id)

        def where(scope: RecordScope) -> Scope:
            if keep_record_scopes:
                return Scope(target.tenant_id, target.user_id, scope.persona_id, scope.agent_id)
            return target

        keys: dict[str, list[Any]] = {
            "memory": [ids(m.memory_id, m.scope.user_id) for _, m in parsed.memories],
            "episode": [ids(e.episode_id, e.scope.user_id) for _, e in parsed.episodes],
            "topic": [ids(t.topic_id, t.scope.user_id) for _, t in parsed.topics],
            "message": [_message_key(m, where) for _, m in parsed.messages],
        }
        result = ImportResult(parsed.lines)
        async with acquire(self._pool, budget, timeout_s=self._config.acquire_timeout_s) as conn:
            await _check_memory_ids(conn, target, parsed, keys["memory"], where)
            fresh = await self._fresh(conn, target, keys)
            # What a message's vector is of: its unit (`{name} said, "{text}"`).
            units = await message_sql.units(
                conn,
                [
                    (name, m.sender_id, text)
                    for (_, m), text, name in zip(
                        parsed.messages, texts.messages, texts.sender_names, strict=True
                    )
                ],
            )
        # No connection held while the model runs.
        vectors = await self._embed_new(replace(texts, messages=units), keys, fresh, budget)
        async with (
            acquire(self._pool, budget, timeout_s=self._config.acquire_timeout_s) as conn,
            conn.transaction(),
        ):
            await lock_user(conn, target.tenant_id, target.user_id)
            writer = _Writer(conn, target, ids, where, self._embedder, result)
            await writer.memories(parsed.memories, texts.memories, vectors["memory"])
            await writer.episodes(parsed.episodes, texts.episodes, vectors["episode"])
            await writer.topics(parsed.topics, texts.topics, vectors["topic"])
            await writer.messages(
                parsed.messages, texts.messages, vectors["message"], texts.sender_names
            )
            await writer.links(parsed)
            await writer.core_blocks(parsed.core_blocks, texts.core_blocks)
            await self._waker.bump(conn, target.tenant_id, target.user_id)
        await self._invalidator.drop_user(target.tenant_id, target.user_id)
        for kind in KINDS:
            metrics.IMPORT_RECORDS.labels(kind, "imported").inc(result.imported[kind])
            metrics.IMPORT_RECORDS.labels(kind, "skipped").inc(result.skipped[kind])
        return result

    def _check_vocabulary(self, parsed: Parsed) -> None:
        """A memory whose category or role this server does not have is refused (exported
        from a server configured otherwise): it could never be listed by that value here."""
        for number, m in parsed.memories:
            for name, value, allowed in (
                ("category", m.category, self._config.categories),
                ("role", m.role, self._config.roles),
            ):
                if allowed and value not in allowed:
                    raise InvalidArgument(
                        f"line {number}: memory.{name}: not one of this server's {name}"
                        f" values ({', '.join(allowed)})"
                    )

    def _screen(self, parsed: Parsed, policy: Mapping[str, str]) -> _Screened:
        """Facts as Remember screens them (a rejected kind refuses the import); episodes,
        topics and messages as Ingest does (redacted, never refused)."""
        guard = self._guard
        found: list[Screened] = []

        def history(text: str) -> str:
            screened = guard.screen(text, policy, may_reject=False)
            found.append(screened)
            return screened.text

        memories: list[dict[str, str]] = []
        for number, m in parsed.memories:
            core = guard.is_core(m.role, m.pinned)
            triple = m.triple
            fields = {
                "content": m.content,
                "subject": triple.subject if triple else "",
                "object": triple.object if triple else "",
                "correction_reason": m.correction_reason,
            }
            out: dict[str, str] = {}
            for name, text in fields.items():
                screened = guard.screen(text, policy, core=core)
                found.append(screened)
                guard.refuse(f"line {number}: memory.{name}", screened)
                out[name] = screened.text
            memories.append(out)
        episodes = [
            {
                "title": history(e.title),
                "summary": history(e.summary),
                "excerpt": history(e.excerpt),
            }
            for _, e in parsed.episodes
        ]
        topics = [history(t.name) for _, t in parsed.topics]
        messages = [history(m.text) for _, m in parsed.messages]
        sender_names = [history(m.sender_name) if m.sender_name else "" for _, m in parsed.messages]
        core_blocks: list[str] = []
        for number, b in parsed.core_blocks:
            # As a core memory: the block is always shown, so it never keeps screened data.
            screened = guard.screen(b.text, policy, core=True)
            found.append(screened)
            guard.refuse(f"line {number}: core_block.text", screened)
            core_blocks.append(screened.text)
        guard.record("import", found)
        return _Screened(memories, episodes, topics, messages, core_blocks, sender_names)

    async def _fresh(self, conn: Any, target: Scope, keys: Mapping[str, list[Any]]) -> set[object]:
        """The (kind, key) of every record not stored yet: only those are embedded."""
        tenant, user = target.tenant_id, target.user_id
        present: set[object] = set()
        for kind, table, column in (
            ("memory", "memories", "memory_id"),
            ("episode", "episodes", "episode_id"),
            ("topic", "topics", "topic_id"),
        ):
            stored = await sql.existing_ids(conn, table, column, tenant, user, keys[kind])
            present |= {(kind, i) for i in stored}
        stored_messages = await sql.existing_messages(conn, tenant, user, keys["message"])
        present |= {("message", k) for k in stored_messages}
        every: set[object] = {(kind, k) for kind, values in keys.items() for k in values}
        return every - present

    async def _embed_new(
        self,
        texts: _Screened,
        keys: Mapping[str, list[Any]],
        fresh: set[object],
        budget: Budget,
    ) -> dict[str, list[np.ndarray | None]]:
        """A vector for each record not stored yet (None: stored, or the embedder failed and
        the row is stored `missing` for the reconciler to repair), in batches."""
        wanted: dict[str, list[str]] = {
            "memory": [m["content"] for m in texts.memories],
            "episode": [f"{e['title']}. {e['summary']}" for e in texts.episodes],
            "topic": list(texts.topics),
            "message": list(texts.messages),
        }
        todo = [
            (kind, i, text)
            for kind, values in wanted.items()
            for i, text in enumerate(values)
            if (kind, keys[kind][i]) in fresh
        ]
        out: dict[str, list[np.ndarray | None]] = {k: [None] * len(v) for k, v in wanted.items()}
        batch = self._config.embed_batch
        # Half the call's time at most, so the writes always have the rest: what is left
        # unembedded is stored `missing` and embedded by the reconciler in the background
        # (found by the lexical leg meanwhile).
        stop_below_s = budget.remaining() / 2
        for start in range(0, len(todo), batch):
            if budget.remaining() < stop_below_s:
                log.info(
                    "import: %d of %d texts left for the reconciler to embed",
                    len(todo) - start,
                    len(todo),
                )
                break
            chunk = todo[start : start + batch]
            try:
                vectors = await self._embedder.embed(
                    [t for _, _, t in chunk], timeout_s=budget.cap(self._config.embed_timeout_s)
                )
            except EmbeddingError as exc:
                log.warning(
                    "embedding failed, importing the rest unembedded: %s", type(exc).__name__
                )
                break
            for (kind, i, _), vector in zip(chunk, vectors, strict=True):
                out[kind][i] = vector
        return out


async def _check_memory_ids(
    conn: Any,
    target: Scope,
    parsed: Parsed,
    memory_ids: Sequence[uuid.UUID],
    where: Callable[[RecordScope], Scope],
) -> None:
    """InvalidArgument naming the line when a memory's id (as it would be stored) is already
    another scope's memory (another user's, or this user's under another persona or agent:
    GetMemory would answer two different rows for one id), or when its supersedes_id names
    no memory of the import nor of the target user. Read outside the writing transaction: a
    memory written meanwhile under the same id still meets the primary key (same user) or
    a fresh uuid4 (another user's)."""
    owners = await sql.memory_owners(conn, target.tenant_id, memory_ids)
    for (number, m), memory_id in zip(parsed.memories, memory_ids, strict=True):
        owner = owners.get(memory_id)
        goes_to = where(m.scope)
        if owner is not None and owner != (target.user_id, goes_to.persona_id, goes_to.agent_id):
            raise InvalidArgument(
                f"line {number}: memory.memory_id: already the id of a memory in another"
                " scope; import into that scope, or drop the line"
            )
    imported = set(memory_ids)
    ids = _Ids(target.tenant_id, target.user_id)
    pointed = {
        number: ids(m.supersedes_id, m.scope.user_id)
        for number, m in parsed.memories
        if m.supersedes_id is not None
    }
    outside = sorted({i for i in pointed.values() if i not in imported})
    stored = await sql.existing_ids(
        conn, "memories", "memory_id", target.tenant_id, target.user_id, outside
    )
    for number, supersedes in pointed.items():
        if supersedes not in imported and supersedes not in stored:
            raise InvalidArgument(
                f"line {number}: memory.supersedes_id: names no memory of this import nor of"
                " the target user (a correction must point at the version it replaced)"
            )


def _message_key(
    m: MessageLine, where: Callable[[RecordScope], Scope]
) -> tuple[str, str, str, str]:
    scope = where(m.scope)
    return (scope.persona_id, scope.agent_id, m.session_id, m.message_id)


def _json(values: Sequence[object]) -> str:
    return orjson.dumps([str(v) for v in values]).decode()


class _Writer:
    """The inserts of one import, inside its transaction, counting what each wrote."""

    def __init__(
        self,
        conn: Any,
        target: Scope,
        ids: _Ids,
        where: Callable[[RecordScope], Scope],
        embedder: Embedder,
        result: ImportResult,
    ) -> None:
        self._conn = conn
        self._target = target
        self._ids = ids
        self._where = where
        self._embedder = embedder
        self._result = result

    def _common(self, scopes: Sequence[RecordScope]) -> list[Column]:
        n = len(scopes)
        where = [self._where(s) for s in scopes]
        return [
            Column("tenant_id", "text", [self._target.tenant_id] * n),
            Column("user_id", "text", [self._target.user_id] * n),
            Column("persona_id", "text", [s.persona_id for s in where]),
            Column("agent_id", "text", [s.agent_id for s in where]),
        ]

    def _count(self, kind: str, total: int, written: int) -> None:
        self._result.imported[kind] += written
        self._result.skipped[kind] += total - written

    async def _insert(
        self,
        kind: str,
        table: str,
        columns: list[Column],
        returning: str,
        vectors: Sequence[np.ndarray | None] | None,
    ) -> list[asyncpg.Record]:
        rows = await sql.insert_rows(
            self._conn,
            table,
            columns,
            returning=returning,
            vectors=vectors,
            embedding_model=self._embedder.model_id,
            dimension=self._embedder.dimension,
        )
        self._count(kind, len(columns[0].values) if columns else 0, len(rows))
        return rows

    async def memories(
        self,
        records: Sequence[tuple[int, MemoryLine]],
        texts: Sequence[dict[str, str]],
        vectors: Sequence[np.ndarray | None],
    ) -> None:
        if not records:
            return
        ids = self._ids
        ms = [m for _, m in records]
        owner = [m.scope.user_id for m in ms]
        memory_ids = [ids(m.memory_id, u) for m, u in zip(ms, owner, strict=True)]
        demoted = [m.demoted for m in ms]
        columns = [
            *self._common([m.scope for m in ms]),
            Column("shared_all_agents", "bool", [m.sharing.all_agents for m in ms]),
            Column("shared_all_personas", "bool", [m.sharing.all_personas for m in ms]),
            Column("memory_id", "uuid", memory_ids),
            Column("lineage_id", "uuid", [ids(m.lineage_id, m.scope.user_id) for m in ms]),
            Column("content", "text", [t["content"] for t in texts]),
            Column("content_hash", "bytea", [content_hash(t["content"]) for t in texts]),
            Column("subject", "text", [t["subject"] for t in texts]),
            Column("predicate", "text", [m.triple.predicate if m.triple else "" for m in ms]),
            Column("object", "text", [t["object"] for t in texts]),
            Column("category", "text", [m.category for m in ms]),
            Column("role", "text", [m.role for m in ms]),
            Column("confidence", "real", [m.confidence for m in ms]),
            Column("reinforced_count", "int", [m.reinforced_count for m in ms]),
            Column("pinned", "bool", [m.pinned for m in ms]),
            Column("valid_from", "timestamptz", [m.valid_from for m in ms]),
            Column("invalid_at", "timestamptz", [m.invalid_at for m in ms]),
            Column("recorded_at", "timestamptz", [m.recorded_at for m in ms]),
            Column("last_reinforced_at", "timestamptz", [m.last_reinforced_at for m in ms]),
            Column(
                "supersedes_id", "uuid", [ids.opt(m.supersedes_id, m.scope.user_id) for m in ms]
            ),
            Column(
                "superseded_by_id",
                "uuid",
                [ids.opt(m.superseded_by_id, m.scope.user_id) for m in ms],
            ),
            json_array_column("source_message_ids", [_json(m.source_message_ids) for m in ms]),
            Column("session_id", "text", [m.session_id for m in ms]),
            Column("origin", "text", [m.origin for m in ms]),
            Column("correction_reason", "text", [t["correction_reason"] for t in texts]),
            Column("status", "text", [m.status for m in ms]),
            Column("retention_policy", "text", [m.retention_policy for m in ms]),
            Column("expires_at", "timestamptz", [m.expires_at for m in ms]),
            Column("ingest_id", "uuid", [m.ingest_id for m in ms]),
            Column("demoted_at", "timestamptz", [d.at if d else None for d in demoted]),
            Column("demoted_role", "text", [d.former_role if d else "" for d in demoted]),
            Column("demoted_pinned", "bool", [d.was_pinned if d else False for d in demoted]),
            Column(
                "demoted_into",
                "uuid",
                [
                    ids.opt(d.summarised_into, u) if d else None
                    for d, u in zip(demoted, owner, strict=True)
                ],
            ),
        ]
        if await sql.column_exists(self._conn, "memories", "updated_at"):
            columns.append(Column("updated_at", "timestamptz", [m.updated_at for m in ms]))
        rows = await self._insert("memory", "memories", columns, "memory_id", vectors)
        written = {r["memory_id"] for r in rows}
        referenced = [
            (i, m.last_referenced_at)
            for i, m in zip(memory_ids, ms, strict=True)
            if i in written and m.last_referenced_at is not None
        ]
        if referenced:
            n = len(referenced)
            await sql.insert_rows(
                self._conn,
                "memory_references",
                [
                    Column("tenant_id", "text", [self._target.tenant_id] * n),
                    Column("user_id", "text", [self._target.user_id] * n),
                    Column("memory_id", "uuid", [i for i, _ in referenced]),
                    Column("last_referenced_at", "timestamptz", [t for _, t in referenced]),
                ],
                returning="memory_id",
            )
        await self._edits(ms, memory_ids, written)

    async def _edits(
        self, ms: Sequence[MemoryLine], memory_ids: Sequence[uuid.UUID], written: set[Any]
    ) -> None:
        """UpdateMemory's edit history of the versions written."""
        edits = [
            (memory_id, m.scope.user_id, e)
            for m, memory_id in zip(ms, memory_ids, strict=True)
            if memory_id in written
            for e in m.edits
        ]
        if not edits:
            return
        n = len(edits)
        await sql.insert_rows(
            self._conn,
            "memory_edits",
            [
                Column("tenant_id", "text", [self._target.tenant_id] * n),
                Column("user_id", "text", [self._target.user_id] * n),
                Column("edit_id", "uuid", [self._ids(e.edit_id, u) for _, u, e in edits]),
                Column("memory_id", "uuid", [i for i, _, _ in edits]),
                Column("edited_at", "timestamptz", [e.edited_at for _, _, e in edits]),
                json_array_column("fields", [_json(e.fields) for _, _, e in edits]),
                Column(
                    "before",
                    "text",
                    [orjson.dumps(e.before).decode() for _, _, e in edits],
                    "{v}::jsonb",
                ),
                Column(
                    "after",
                    "text",
                    [orjson.dumps(e.after).decode() for _, _, e in edits],
                    "{v}::jsonb",
                ),
                Column("reason", "text", [e.reason for _, _, e in edits]),
            ],
            returning="edit_id",
        )

    async def episodes(
        self,
        records: Sequence[tuple[int, EpisodeLine]],
        texts: Sequence[dict[str, str]],
        vectors: Sequence[np.ndarray | None],
    ) -> None:
        if not records:
            return
        es = [e for _, e in records]
        columns = [
            *self._common([e.scope for e in es]),
            Column("episode_id", "uuid", [self._ids(e.episode_id, e.scope.user_id) for e in es]),
            Column("session_id", "text", [e.session_id for e in es]),
            Column("title", "text", [t["title"] for t in texts]),
            Column("summary", "text", [t["summary"] for t in texts]),
            Column("excerpt", "text", [t["excerpt"] for t in texts]),
            json_array_column("source_message_ids", [_json(e.source_message_ids) for e in es]),
            Column("started_at", "timestamptz", [e.started_at for e in es]),
            Column("ended_at", "timestamptz", [e.ended_at for e in es]),
            Column("recorded_at", "timestamptz", [e.recorded_at for e in es]),
            Column("expires_at", "timestamptz", [e.expires_at for e in es]),
        ]
        await self._insert("episode", "episodes", columns, "episode_id", vectors)

    async def topics(
        self,
        records: Sequence[tuple[int, TopicLine]],
        texts: Sequence[str],
        vectors: Sequence[np.ndarray | None],
    ) -> None:
        if not records:
            return
        ts = [t for _, t in records]
        columns = [
            *self._common([t.scope for t in ts]),
            Column("topic_id", "uuid", [self._ids(t.topic_id, t.scope.user_id) for t in ts]),
            Column("name", "text", list(texts)),
            Column("is_persona", "bool", [t.is_persona for t in ts]),
            Column("weight", "real", [t.weight for t in ts]),
            Column("last_episode_at", "timestamptz", [t.last_episode_at for t in ts]),
            Column("created_at", "timestamptz", [t.created_at for t in ts]),
        ]
        await self._insert("topic", "topics", columns, "topic_id", vectors)

    async def messages(
        self,
        records: Sequence[tuple[int, MessageLine]],
        texts: Sequence[str],
        vectors: Sequence[np.ndarray | None],
        sender_names: Sequence[str],
    ) -> None:
        if not records:
            return
        ms = [m for _, m in records]
        target = self._target
        columns = [
            *self._common([m.scope for m in ms]),
            Column("session_id", "text", [m.session_id for m in ms]),
            Column("message_id", "text", [m.message_id for m in ms]),
            Column(
                "ingest_id",
                "uuid",
                [
                    m.ingest_id
                    or uuid.uuid5(
                        ID_NAMESPACE, f"{target.tenant_id}\x1f{target.user_id}\x1f{m.session_id}"
                    )
                    for m in ms
                ],
            ),
            Column("sender_id", "text", [m.sender_id for m in ms]),
            Column("sender_name", "text", list(sender_names)),
            Column("role", "text", [m.role for m in ms]),
            Column("text", "text", list(texts)),
            Column("sent_at", "timestamptz", [m.sent_at for m in ms]),
            Column("recorded_at", "timestamptz", [m.recorded_at for m in ms]),
            Column("retention_policy", "text", [m.retention_policy for m in ms]),
            Column("expires_at", "timestamptz", [m.expires_at for m in ms]),
        ]
        rows = await self._insert(
            "message", "messages", columns, "persona_id, agent_id, session_id, message_id", vectors
        )
        # The context index the ingest workers build, for the sessions that gained messages.
        sessions: dict[tuple[str, str, str], list[str]] = {}
        for r in rows:
            sessions.setdefault((r["persona_id"], r["agent_id"], r["session_id"]), []).append(
                r["message_id"]
            )
        for (persona, agent, session), message_ids in sessions.items():
            scope = Scope(target.tenant_id, target.user_id, persona, agent)
            await message_sql.index_session_context(self._conn, scope, session, message_ids)

    async def links(self, parsed: Parsed) -> None:
        """episode -> memory and topic -> episode, where both ends are stored."""
        ids = self._ids
        episode_memories = {
            (ids(e.episode_id, e.scope.user_id), ids(m, e.scope.user_id))
            for _, e in parsed.episodes
            for m in e.memory_ids
        }
        topic_episodes = {
            (ids(t.topic_id, t.scope.user_id), ids(e, t.scope.user_id))
            for _, t in parsed.topics
            for e in t.episode_ids
        } | {
            (ids(t, e.scope.user_id), ids(e.episode_id, e.scope.user_id))
            for _, e in parsed.episodes
            for t in e.topic_ids
        }
        tenant, user = self._target.tenant_id, self._target.user_id
        await sql.link(
            self._conn,
            "episode_memories",
            tenant,
            user,
            ("episode_id", "memory_id"),
            sorted(episode_memories),
            (("episodes", "episode_id"), ("memories", "memory_id")),
        )
        await sql.link(
            self._conn,
            "topic_episodes",
            tenant,
            user,
            ("topic_id", "episode_id"),
            sorted(topic_episodes),
            (("topics", "topic_id"), ("episodes", "episode_id")),
        )

    async def core_blocks(
        self, records: Sequence[tuple[int, CoreBlockLine]], texts: Sequence[str]
    ) -> None:
        """Every revision of the core blocks; a revision (or a current text) the target's
        block already has is skipped, so a block written there since is never replaced."""
        if not records:
            return
        bs = [b for _, b in records]
        written = await sql.insert_rows(
            self._conn,
            "core_block_revisions",
            [
                *self._common([b.scope for b in bs]),
                Column("block", "text", [b.block for b in bs]),
                Column("revision", "int", [b.revision for b in bs]),
                Column("text", "text", list(texts)),
                Column("mode", "text", [b.mode for b in bs]),
                Column("author", "text", [b.author for b in bs]),
                Column("reason", "text", [b.reason for b in bs]),
                Column("recorded_at", "timestamptz", [b.recorded_at for b in bs]),
                Column("replaced_at", "timestamptz", [b.replaced_at for b in bs]),
            ],
            returning="revision",
        )
        self._count("core_block", len(bs), len(written))
