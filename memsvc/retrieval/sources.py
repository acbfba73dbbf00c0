"""Where each item kind lives: its table, scope and time predicates, text, and row -> Hit.

Every predicate takes the scope as $1..$4 (tenant, user, persona, agent), so the legs can
compose them. Facts honour explicit sharing (storage.memories.VISIBLE); episodes and messages
have no sharing and match all three scope fields exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from memsvc.deadline import Budget
from memsvc.memories.model import Scope
from memsvc.retrieval.query import Hit, ItemKind
from memsvc.storage.memories import COLUMNS as FACT_COLUMNS
from memsvc.storage.memories import VISIBLE as FACT_VISIBLE
from memsvc.storage.memories import record_from_row

# asyncpg rejects a zero timeout; the leg runner cancels at the budget anyway.
_MIN_STATEMENT_TIMEOUT_S = 0.001


def statement_timeout(budget: Budget) -> float:
    """asyncpg's per-statement timeout from the shrinking budget (belt and braces)."""
    return max(budget.remaining(), _MIN_STATEMENT_TIMEOUT_S)


_EXACT_SCOPE = "tenant_id = $1 AND user_id = $2 AND persona_id = $3 AND agent_id = $4"
_NOT_EXPIRED = "(expires_at IS NULL OR expires_at > now())"


@dataclass(frozen=True)
class Source:
    """One item kind as the legs see it. ``{as_of}`` in ``as_of_sql`` is a parameter slot."""

    kind: ItemKind
    table: str
    columns: str
    scope_sql: str
    current_sql: str
    as_of_sql: str
    # Text the ILIKE fallback searches, and the stored tsvector the full-text search uses.
    text_sql: str
    tsv_sql: str
    # Deterministic tie-break among equal scores (output column names).
    order_sql: str
    to_hit: Callable[[asyncpg.Record, float], Hit]

    def time_sql(self, as_of_param: str | None) -> str:
        if as_of_param is None:
            return self.current_sql
        return self.as_of_sql.format(as_of=as_of_param)


def _scope_of(row: asyncpg.Record) -> Scope:
    return Scope(row["tenant_id"], row["user_id"], row["persona_id"], row["agent_id"])


def _fact_hit(row: asyncpg.Record, score: float) -> Hit:
    record = record_from_row(row)
    return Hit(
        kind=ItemKind.FACT,
        id=str(record.memory_id),
        text=record.content,
        session_id=record.session_id,
        occurred_at=record.recorded_at,
        scope=record.scope,
        shared_all_agents=record.sharing.all_agents,
        shared_all_personas=record.sharing.all_personas,
        score=score,
        memory=record,
    )


def _episode_hit(row: asyncpg.Record, score: float) -> Hit:
    return Hit(
        kind=ItemKind.EPISODE,
        id=str(row["episode_id"]),
        text=f"{row['title']}: {row['summary']}",
        session_id=row["session_id"],
        occurred_at=row["ended_at"],
        scope=_scope_of(row),
        shared_all_agents=False,
        shared_all_personas=False,
        score=score,
    )


def _message_hit(row: asyncpg.Record, score: float) -> Hit:
    return Hit(
        kind=ItemKind.MESSAGE,
        id=row["message_id"],
        text=row["text"],
        session_id=row["session_id"],
        occurred_at=row["sent_at"],
        scope=_scope_of(row),
        shared_all_agents=False,
        shared_all_personas=False,
        score=score,
        sender_id=row["sender_id"],
        role=row["role"],
    )


FACTS = Source(
    kind=ItemKind.FACT,
    table="memories",
    columns=FACT_COLUMNS,
    scope_sql=FACT_VISIBLE,
    current_sql=f"invalid_at IS NULL AND {_NOT_EXPIRED}",
    # Valid time: what held at that moment, superseded versions included if they held then.
    as_of_sql=(
        "valid_from <= {as_of} AND (invalid_at IS NULL OR invalid_at > {as_of})"
        f" AND {_NOT_EXPIRED}"
    ),
    text_sql="content",
    tsv_sql="search_tsv",
    order_sql="memory_id",
    to_hit=_fact_hit,
)

EPISODES = Source(
    kind=ItemKind.EPISODE,
    table="episodes",
    columns=(
        "tenant_id, user_id, persona_id, agent_id, episode_id, session_id, title, summary, ended_at"
    ),
    scope_sql=_EXACT_SCOPE,
    current_sql="true",
    # An episode exists once its session ended.
    as_of_sql="ended_at <= {as_of}",
    text_sql="(title || ' ' || summary)",
    tsv_sql="search_tsv",
    order_sql="episode_id",
    to_hit=_episode_hit,
)

MESSAGES = Source(
    kind=ItemKind.MESSAGE,
    table="messages",
    columns=(
        "tenant_id, user_id, persona_id, agent_id, session_id, message_id, sender_id, role,"
        " text, sent_at"
    ),
    scope_sql=_EXACT_SCOPE,
    current_sql=_NOT_EXPIRED,
    as_of_sql="sent_at <= {as_of}" + f" AND {_NOT_EXPIRED}",
    text_sql="text",
    # The message with its neighbours and date (built by the workers, migration 0004); the
    # message alone until they have indexed it.
    tsv_sql="coalesce(context_tsv, search_tsv)",
    order_sql="session_id, message_id",
    to_hit=_message_hit,
)

SOURCES: dict[ItemKind, Source] = {s.kind: s for s in (FACTS, EPISODES, MESSAGES)}
