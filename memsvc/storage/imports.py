"""SQL of ImportMemories: rows of every kind written many at a time, skipping those present.

Each insert is one statement over unnest()ed columns (a few thousand rows at a time) with
ON CONFLICT DO NOTHING, so a row whose key is already stored (an earlier import of the same
record) is skipped and the statement returns the keys it did write. Vectors travel as one
flat real[] and each row takes its slice (no per-row round trip).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import numpy as np

from memsvc.storage.connection import Connection

# Rows per statement: each statement stays well within MEMSVC_PG_COMMAND_TIMEOUT_MS (every
# row also enters the vector and text indexes) and the protocol's limits.
CHUNK_ROWS = 500


@dataclass(frozen=True)
class Column:
    """One inserted column: its name, the SQL type of its unnest()ed array, its values, and
    how a row's value becomes the stored one ({v}: the unnested value)."""

    name: str
    sql_type: str
    values: Sequence[Any]
    expr: str = "{v}"


def json_array_column(name: str, values: Sequence[str]) -> Column:
    """A text[] column whose rows are JSON arrays (ragged arrays cannot be unnested)."""
    return Column(name, "text", values, "ARRAY(SELECT jsonb_array_elements_text({v}::jsonb))")


async def column_exists(conn: Connection, table: str, column: str) -> bool:
    found: bool = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1)"
        " AND attname = $2 AND attnum > 0 AND NOT attisdropped)",
        table,
        column,
    )
    return found


async def insert_rows(
    conn: Connection,
    table: str,
    columns: Sequence[Column],
    *,
    returning: str,
    vectors: Sequence[np.ndarray | None] | None = None,
    embedding_model: str = "",
    dimension: int = 0,
) -> list[asyncpg.Record]:
    """Insert the rows (columns of equal length) skipping conflicts; the `returning`
    expression of each row written. With `vectors`, also the embedding projection."""
    count = len(columns[0].values) if columns else 0
    out: list[asyncpg.Record] = []
    for start in range(0, count, CHUNK_ROWS):
        end = min(start + CHUNK_ROWS, count)
        out.extend(
            await _insert_chunk(
                conn,
                table,
                [Column(c.name, c.sql_type, c.values[start:end], c.expr) for c in columns],
                returning=returning,
                vectors=vectors[start:end] if vectors is not None else None,
                embedding_model=embedding_model,
                dimension=dimension,
            )
        )
    return out


async def _insert_chunk(
    conn: Connection,
    table: str,
    columns: Sequence[Column],
    *,
    returning: str,
    vectors: Sequence[np.ndarray | None] | None,
    embedding_model: str,
    dimension: int,
) -> list[asyncpg.Record]:
    args: list[Any] = [list(c.values) for c in columns]
    params = [f"${i + 1}::{c.sql_type}[]" for i, c in enumerate(columns)]
    names = [f"c{i}" for i in range(len(columns))]
    selects = [c.expr.format(v=f"r.{n}") for c, n in zip(columns, names, strict=True)]
    targets = [c.name for c in columns]
    if vectors is not None:
        flat, positions = flatten(vectors)
        args += [positions, flat, dimension, embedding_model]
        k = len(args)
        params.append(f"${k - 3}::int[]")
        names.append("vec")
        selects += [
            f"CASE WHEN r.vec >= 0 THEN (${k - 2}::real[])"
            f"[r.vec * ${k - 1} + 1 : (r.vec + 1) * ${k - 1}]::vector END",
            f"CASE WHEN r.vec >= 0 THEN ${k}::text ELSE '' END",
            "CASE WHEN r.vec >= 0 THEN 'ok' ELSE 'missing' END",
        ]
        targets += ["embedding", "embedding_model", "embedding_state"]
    statement = (
        f"INSERT INTO {table} ({', '.join(targets)})"
        f" SELECT {', '.join(selects)}"
        f" FROM unnest({', '.join(params)}) AS r({', '.join(names)})"
        f" ON CONFLICT DO NOTHING RETURNING {returning}"
    )
    rows: list[asyncpg.Record] = await conn.fetch(statement, *args)
    return rows


def flatten(vectors: Sequence[np.ndarray | None]) -> tuple[list[float], list[int]]:
    """The vectors as one flat list and each row's position in it (-1: no vector)."""
    present = [v for v in vectors if v is not None]
    flat = np.concatenate(present).astype(np.float32).tolist() if present else []
    positions: list[int] = []
    at = 0
    for v in vectors:
        positions.append(-1 if v is None else at)
        at += v is not None
    return flat, positions


async def existing_ids(
    conn: Connection,
    table: str,
    id_column: str,
    tenant_id: str,
    user_id: str,
    ids: Sequence[uuid.UUID],
) -> set[uuid.UUID]:
    """Which of the ids the user already has in the table."""
    if not ids:
        return set()
    rows = await conn.fetch(
        f"SELECT {id_column} AS id FROM {table} WHERE tenant_id = $1 AND user_id = $2"
        f" AND {id_column} = ANY($3::uuid[])",
        tenant_id,
        user_id,
        list(ids),
    )
    return {r["id"] for r in rows}


async def existing_messages(
    conn: Connection, tenant_id: str, user_id: str, keys: Sequence[tuple[str, str, str, str]]
) -> set[tuple[str, str, str, str]]:
    """Which (persona, agent, session, message id) the user already has."""
    if not keys:
        return set()
    rows = await conn.fetch(
        "SELECT m.persona_id, m.agent_id, m.session_id, m.message_id FROM messages m"
        " JOIN unnest($3::text[], $4::text[], $5::text[], $6::text[]) AS k(p, a, s, i)"
        " ON m.persona_id = k.p AND m.agent_id = k.a AND m.session_id = k.s"
        " AND m.message_id = k.i WHERE m.tenant_id = $1 AND m.user_id = $2",
        tenant_id,
        user_id,
        [k[0] for k in keys],
        [k[1] for k in keys],
        [k[2] for k in keys],
        [k[3] for k in keys],
    )
    return {(r["persona_id"], r["agent_id"], r["session_id"], r["message_id"]) for r in rows}


async def link(
    conn: Connection,
    table: str,
    tenant_id: str,
    user_id: str,
    columns: tuple[str, str],
    pairs: Sequence[tuple[uuid.UUID, uuid.UUID]],
    targets: tuple[tuple[str, str], tuple[str, str]],
) -> None:
    """Link rows (episode -> memory, topic -> episode) when both ends are stored (an end
    skipped by the import, e.g. a memory that collided with one already there, is left out)."""
    if not pairs:
        return
    (left_table, left_id), (right_table, right_id) = targets
    a, b = columns
    await conn.execute(
        f"INSERT INTO {table} (tenant_id, user_id, {a}, {b})"
        " SELECT $1, $2, p.a, p.b FROM unnest($3::uuid[], $4::uuid[]) AS p(a, b)"
        f" WHERE EXISTS (SELECT 1 FROM {left_table} l WHERE l.tenant_id = $1"
        f" AND l.user_id = $2 AND l.{left_id} = p.a)"
        f" AND EXISTS (SELECT 1 FROM {right_table} r WHERE r.tenant_id = $1"
        f" AND r.user_id = $2 AND r.{right_id} = p.b)"
        " ON CONFLICT DO NOTHING",
        tenant_id,
        user_id,
        [p[0] for p in pairs],
        [p[1] for p in pairs],
    )


async def memory_owners(
    conn: Connection, tenant_id: str, ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, tuple[str, str, str]]:
    """The (user, persona, agent) holding each of the ids in the tenant, where one does.
    Every user's: on Citus a statement over every shard (imports are rare; an id is only
    ever looked for by user elsewhere)."""
    if not ids:
        return {}
    rows = await conn.fetch(
        "SELECT memory_id, user_id, persona_id, agent_id FROM memories"
        " WHERE tenant_id = $1 AND memory_id = ANY($2::uuid[])",
        tenant_id,
        list(ids),
    )
    return {r["memory_id"]: (r["user_id"], r["persona_id"], r["agent_id"]) for r in rows}
