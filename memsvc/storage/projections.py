"""The embedding projection of every tier: which rows lack a current vector, and writing one."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import asyncpg

from memsvc.storage.connection import Connection
from memsvc.storage.messages import UNIT_SQL


@dataclass(frozen=True)
class Tier:
    table: str
    key: str  # columns identifying a row within (tenant_id, user_id)
    text: str  # SQL expression of the embedded text

    @property
    def key_names(self) -> tuple[str, ...]:
        return ("tenant_id", "user_id", *(k.strip() for k in self.key.split(",")))


def projection(embedding: object | None, model_id: str) -> tuple[object | None, str, str]:
    """The (embedding, embedding_model, embedding_state) columns of a row being written: a row
    the embedder failed on is stored `missing`, for the reconciler to embed later."""
    if embedding is None:
        return None, "", "missing"
    return embedding, model_id, "ok"


TIERS = (
    Tier("memories", "memory_id", "content"),
    Tier("messages", "persona_id, agent_id, session_id, message_id", UNIT_SQL),
    Tier("episodes", "episode_id", "title || '. ' || summary"),
    Tier("topics", "topic_id", "name"),
)


async def mark_stale(conn: Connection, model_id: str) -> int:
    """After a model change, every vector of another model is stale (one UPDATE per tier)."""
    total = 0
    for tier in TIERS:
        status: str = await conn.execute(
            f"UPDATE {tier.table} SET embedding_state = 'stale'"
            " WHERE embedding_state = 'ok' AND embedding_model <> $1",
            model_id,
        )
        total += int(status.split()[-1])
    return total


async def unembedded(conn: Connection, tier: Tier, limit: int) -> list[asyncpg.Record]:
    """Up to `limit` rows of the tier whose vector is missing or stale: keys and text. Rows
    with no text to embed are left out: they stay unembedded, and were they returned, enough
    of them would fill every batch and starve the rows behind them."""
    rows: list[asyncpg.Record] = await conn.fetch(
        f"SELECT {', '.join(tier.key_names)}, {tier.text} AS text FROM {tier.table}"
        f" WHERE embedding_state <> 'ok' AND ({tier.text}) ~ '[^[:space:]]' LIMIT $1",
        limit,
    )
    return rows


async def write_vectors(
    conn: Connection,
    tier: Tier,
    model_id: str,
    rows: Sequence[asyncpg.Record],
    vectors: Iterable[object],
) -> None:
    """Store each row's vector; the text is re-checked so a row edited meanwhile is skipped."""
    names = tier.key_names
    where = " AND ".join(f"{k} = ${i + 3}" for i, k in enumerate(names))
    await conn.executemany(
        f"UPDATE {tier.table} SET embedding = $1, embedding_model = $2,"
        f" embedding_state = 'ok' WHERE {where} AND {tier.text} = ${len(names) + 3}",
        [
            (vec, model_id, *(r[k] for k in names), r["text"])
            for r, vec in zip(rows, vectors, strict=True)
        ],
    )
