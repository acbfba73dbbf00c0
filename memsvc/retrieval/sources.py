"""Where each item kind lives: its table, scope and time predicates, text, and row -> Hit.

Every predicate takes the scope as $1..$4 (tenant, user, persona, agent), so the legs can
compose them. Facts honour explicit sharing (storage.conditions.VISIBLE); episodes and messages
have no sharing and match all three scope fields exactly.

Every kind selects the same columns (``ROW_COLUMNS``; NULL where a kind has no such field), so
a leg searches all requested kinds in one statement (a UNION ALL of one branch per kind): one
round trip and one plan per leg whatever the kinds, instead of one per kind.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import asyncpg
import numpy as np
import numpy.typing as npt

from memsvc.retrieval.query import Hit, ItemKind, RecallFilters
from memsvc.storage.conditions import CURRENT, EXACT_SCOPE, NOT_EXPIRED
from memsvc.storage.conditions import VISIBLE as FACT_VISIBLE
from memsvc.storage.memories import record_from_row
from memsvc.storage.model import Scope

_EXACT_SCOPE = EXACT_SCOPE

# The shape every kind's branch selects: name and SQL type (for the NULLs of other kinds).
ROW_COLUMNS: tuple[tuple[str, str], ...] = (
    ("kind", "text"),
    ("item_id", "text"),
    ("item_text", "text"),
    ("session_id", "text"),
    ("occurred_at", "timestamptz"),
    ("tenant_id", "text"),
    ("user_id", "text"),
    ("persona_id", "text"),
    ("agent_id", "text"),
    ("shared_all_agents", "boolean"),
    ("shared_all_personas", "boolean"),
    ("sender_id", "text"),
    ("sender_name", "text"),
    ("role", "text"),
    ("confidence", "real"),
    ("pinned", "boolean"),
    # The rest of a fact's row (storage.memories.record_from_row reads these names).
    ("memory_id", "uuid"),
    ("lineage_id", "uuid"),
    ("content", "text"),
    ("subject", "text"),
    ("predicate", "text"),
    ("object", "text"),
    ("category", "text"),
    ("reinforced_count", "integer"),
    ("valid_from", "timestamptz"),
    ("invalid_at", "timestamptz"),
    ("recorded_at", "timestamptz"),
    ("supersedes_id", "uuid"),
    ("superseded_by_id", "uuid"),
    ("source_message_ids", "text[]"),
    ("origin", "text"),
    ("correction_reason", "text"),
    ("status", "text"),
    ("last_reinforced_at", "timestamptz"),
    ("last_referenced_at", "timestamptz"),
    ("demoted_at", "timestamptz"),
    ("demoted_role", "text"),
    ("retention_policy", "text"),
    ("expires_at", "timestamptz"),
    ("updated_at", "timestamptz"),
)
_ROW_NAMES = frozenset(name for name, _ in ROW_COLUMNS)


def _select_list(kind: ItemKind, exprs: dict[str, str]) -> str:
    unknown = set(exprs) - _ROW_NAMES
    assert not unknown, f"not in ROW_COLUMNS: {unknown}"
    exprs = {"kind": f"'{kind.value}'", **exprs}
    return ", ".join(
        f"{exprs.get(name, f'NULL::{sql_type}')} AS {name}" for name, sql_type in ROW_COLUMNS
    )


@dataclass(frozen=True)
class Source:
    """One item kind as the legs see it. ``{as_of}`` in ``as_of_sql`` is a parameter slot."""

    kind: ItemKind
    table: str
    select_list: str
    scope_sql: str
    current_sql: str
    as_of_sql: str
    # Text the ILIKE fallback searches, and the stored tsvector the full-text search uses.
    text_sql: str
    tsv_sql: str
    # RecallFilters.since / until: `{p}` is the parameter slot.
    since_sql: str = ""
    until_sql: str = ""
    # Without as_of but with a time range: which rows may match (facts: every version, so a
    # fact superseded since is found for a time it held); None: current_sql.
    ranged_sql: str | None = None
    # Relevance of a full-text match; `{tsv}` is replaced by tsv_sql, `q.tsq` is the query.
    rank_sql: str = "ts_rank_cd({tsv}, q.tsq)"

    def rank(self) -> str:
        return self.rank_sql.replace("{tsv}", self.tsv_sql)

    def time_sql(self, as_of_param: str | None, *, ranged: bool = False) -> str:
        if as_of_param is not None:
            return self.as_of_sql.format(as_of=as_of_param)
        if ranged and self.ranged_sql is not None:
            return self.ranged_sql
        return self.current_sql

    def filter_sql(self, shape: tuple[bool, ...], first_param: int) -> str:
        """The filters' predicates (`AND ...`, empty when none), parameters numbered from
        ``first_param`` in RecallFilters order (see filter_args). Fact-only filters never
        reach another kind: such a filter removes the kind before any SQL is built."""
        categories, roles, origins, sessions, since, until = shape
        clauses: list[str] = []
        slot = first_param
        for present, column in (
            (categories, "category"),
            (roles, "role"),
            (origins, "origin"),
            (sessions, "session_id"),
        ):
            if present:
                assert column == "session_id" or self.kind is ItemKind.FACT, column
                clauses.append(f"{column} = ANY(${slot}::text[])")
                slot += 1
        for present, template in ((since, self.since_sql), (until, self.until_sql)):
            if present:
                clauses.append(template.format(p=f"${slot}::timestamptz"))
                slot += 1
        return "".join(f" AND {c}" for c in clauses)


def count_cte(source: Source, name: str, cap_param: str) -> str:
    """A capped count of the user's rows in the source's table (stops at ``cap + 1``): it
    decides between a leg's row-by-row (exact) branch and its index branch."""
    return (
        f"{name} AS (SELECT count(*) AS n FROM (SELECT 1 FROM {source.table}"
        f" WHERE tenant_id = $1 AND user_id = $2 LIMIT {cap_param} + 1) AS capped)"
    )


def filter_args(filters: RecallFilters) -> list[object]:
    """The values of the set filters, in the order Source.filter_sql numbers them."""
    args: list[object] = [
        list(values)
        for values in (filters.categories, filters.roles, filters.origins, filters.session_ids)
        if values
    ]
    args.extend(t for t in (filters.since, filters.until) if t is not None)
    return args


def ranged(shape: tuple[bool, ...]) -> bool:
    """Whether the filters set a time range (since or until)."""
    return shape[4] or shape[5]


def to_hit(
    row: asyncpg.Record,
    score: float,
    *,
    coverage: float | None = None,
    embedding: npt.NDArray[np.float32] | None = None,
) -> Hit:
    """A Hit from a row of any kind (selected as ROW_COLUMNS)."""
    kind = ItemKind(row["kind"])
    is_fact = kind is ItemKind.FACT
    return Hit(
        kind=kind,
        id=row["item_id"],
        text=row["item_text"],
        session_id=row["session_id"],
        occurred_at=row["occurred_at"],
        scope=Scope.from_row(row),
        shared_all_agents=row["shared_all_agents"],
        shared_all_personas=row["shared_all_personas"],
        score=score,
        sender_id=row["sender_id"],
        sender_name=row["sender_name"] or "",
        role=row["role"],
        confidence=float(row["confidence"]) if is_fact else None,
        pinned=row["pinned"],
        category=row["category"] or "",
        origin=row["origin"] or "",
        last_reinforced_at=row["last_reinforced_at"],
        coverage=coverage,
        embedding=embedding,
        # The full MemoryRecord only for the facts that make the answer.
        record_factory=functools.partial(record_from_row, row) if is_fact else None,
    )


_REFERENCED = "last_referenced_at"

FACTS = Source(
    kind=ItemKind.FACT,
    table="memories",
    select_list=_select_list(
        ItemKind.FACT,
        {
            "item_id": "memory_id::text",
            "item_text": "content",
            "occurred_at": "recorded_at",
            **{
                name: name
                for name, _ in ROW_COLUMNS
                if name
                not in (
                    "kind",
                    "item_id",
                    "item_text",
                    "occurred_at",
                    "sender_id",
                    "sender_name",
                    _REFERENCED,
                )
            },
            "sender_id": "''",
            # Left out on the hot path (see storage.memories.HOT_COLUMNS).
            _REFERENCED: "NULL::timestamptz",
        },
    ),
    scope_sql=FACT_VISIBLE,
    current_sql=CURRENT,
    # Valid time: what held at that moment, superseded versions included if they held then.
    as_of_sql=(
        "valid_from <= {as_of} AND (invalid_at IS NULL OR invalid_at > {as_of})"
        f" AND {NOT_EXPIRED}"
    ),
    text_sql="content",
    tsv_sql="search_tsv",
    # Validity [valid_from, invalid_at) overlaps [since, until).
    since_sql="(invalid_at IS NULL OR invalid_at > {p})",
    until_sql="valid_from < {p}",
    ranged_sql=NOT_EXPIRED,
)

# Episodes and messages belong to one exact scope: never shared.
_OWN_SCOPE = {
    "tenant_id": "tenant_id",
    "user_id": "user_id",
    "persona_id": "persona_id",
    "agent_id": "agent_id",
    "shared_all_agents": "false",
    "shared_all_personas": "false",
}

EPISODES = Source(
    kind=ItemKind.EPISODE,
    table="episodes",
    select_list=_select_list(
        ItemKind.EPISODE,
        {
            "item_id": "episode_id::text",
            "item_text": "title || ': ' || summary",
            "session_id": "session_id",
            "occurred_at": "ended_at",
            **_OWN_SCOPE,
            "sender_id": "''",
            "role": "''",
            "pinned": "false",
        },
    ),
    scope_sql=_EXACT_SCOPE,
    # An episode expires with the last of its source messages (migration 0006).
    current_sql=NOT_EXPIRED,
    # An episode exists once its session ended.
    as_of_sql="ended_at <= {as_of}" + f" AND {NOT_EXPIRED}",
    text_sql="(title || ' ' || summary)",
    tsv_sql="search_tsv",
    # Ended at or after since, started before until.
    since_sql="ended_at >= {p}",
    until_sql="started_at < {p}",
)

MESSAGES = Source(
    kind=ItemKind.MESSAGE,
    table="messages",
    select_list=_select_list(
        ItemKind.MESSAGE,
        {
            "item_id": "message_id",
            "item_text": "text",
            "session_id": "session_id",
            "occurred_at": "sent_at",
            **_OWN_SCOPE,
            "sender_id": "sender_id",
            "sender_name": "sender_name",
            "role": "role",
            "pinned": "false",
        },
    ),
    scope_sql=_EXACT_SCOPE,
    current_sql=NOT_EXPIRED,
    as_of_sql="sent_at <= {as_of}" + f" AND {NOT_EXPIRED}",
    text_sql="text",
    since_sql="sent_at >= {p}",
    until_sql="sent_at < {p}",
    # The message's unit with its neighbours' (built by the workers, storage.messages.
    # index_session_context); the message alone until they have indexed it.
    tsv_sql="coalesce(context_tsv, search_tsv)",
    # The context index weighs the message's own words (A) over those of its neighbours at
    # distance 1 (B) and 2 (C); D is unused. ts_rank with length normalisation 1 scored best
    # on the LoCoMo dev split (R@10 74 alone, against 66 for ts_rank_cd over the same index).
    # B and C were chosen on the split, each dev conversation left out in turn (bench/
    # locomo_eval.py): hybrid R@10 80.4 in the split, 80.2 on the left-out conversation in
    # the mean, against 77.3 with the earlier 0.5 and 0.25. Listed D, C, B, A.
    rank_sql="ts_rank('{0.0, 0.55, 0.7, 1.0}', {tsv}, q.tsq, 1)",
)

SOURCES: dict[ItemKind, Source] = {s.kind: s for s in (FACTS, EPISODES, MESSAGES)}
# Deterministic order among equal scores, in every leg (output column names).
TIE_BREAK_SQL = "kind, session_id, item_id"
