"""The dense leg: cosine distance (pgvector) over each requested item kind, exact for small
scopes.

Why an exact path: an approximate index answers "the nearest rows of the whole table", and
the scope filter runs after it. For a user with 50 memories among millions, the rows the
HNSW scan visits (ef_search of them) are almost all someone else's, so the filter leaves few
or none. pgvector 0.8's iterative scans keep scanning, but only up to hnsw.max_scan_tuples
and still approximately. So a scope with at most ``exact_max_rows`` rows (counted on the
btree, capped) is ranked by computing every row's distance — exact, and cheap at that size
(about 0.5 ms for 1,000 rows, 10 ms for 5,000 on the 2-core reference box). Only a larger
scope uses the HNSW index with iterative scan (relaxed order, re-sorted here), which is
approximate. Both branches are in one statement: a one-time filter on the count decides
which one runs, so the choice costs no extra round trip.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime

import numpy as np
import numpy.typing as npt

from memsvc.concurrency.deadline import Budget
from memsvc.retrieval.query import Hit, ItemKind
from memsvc.retrieval.sources import SOURCES, TIE_BREAK_SQL, statement_timeout, to_hit
from memsvc.storage.connection import Connection
from memsvc.storage.model import Scope


@functools.lru_cache(maxsize=32)
def dense_sql(kinds: tuple[ItemKind, ...], *, with_as_of: bool) -> str:
    """$1..$4 scope, $5 query vector, $6 model id, $7 exact_max_rows, $8 limit, [$9 as_of].

    Per kind: a capped count of the user's rows, then the exact branch or the index branch
    (a one-time filter on the count runs exactly one of them); all kinds in one statement.
    """
    ctes: list[str] = []
    branches: list[str] = []
    for kind in kinds:
        source = SOURCES[kind]
        count = f"{kind.value}_rows"
        ctes.append(
            f"{count} AS (SELECT count(*) AS n FROM (SELECT 1 FROM {source.table}"
            " WHERE tenant_id = $1 AND user_id = $2 LIMIT $7 + 1) AS capped)"
        )
        where = (
            f"{source.scope_sql} AND {source.time_sql('$9' if with_as_of else None)}"
            " AND embedding_state = 'ok' AND embedding_model = $6"
        )
        select = f"SELECT {source.select_list}, (embedding <=> $5) AS distance FROM {source.table}"
        branches.append(
            f"({select} WHERE {where} AND (SELECT n FROM {count}) <= $7"
            # "+ 0": an expression the HNSW index cannot serve, so this branch always
            # computes every scope row's distance (the exact path).
            " ORDER BY (embedding <=> $5) + 0, item_id LIMIT $8)"
        )
        branches.append(
            f"({select} WHERE {where} AND (SELECT n FROM {count}) > $7"
            " ORDER BY embedding <=> $5 LIMIT $8)"
        )
    return (
        "/* memsvc:recall:dense */"
        f" WITH {', '.join(ctes)}"
        f" SELECT * FROM ({' UNION ALL '.join(branches)}) AS hits"
        f" ORDER BY distance, {TIE_BREAK_SQL} LIMIT $8"
    )


async def dense_hits(
    conn: Connection,
    scope: Scope,
    vector: npt.NDArray[np.float32],
    kinds: Sequence[ItemKind],
    *,
    model_id: str,
    limit: int,
    exact_max_rows: int,
    as_of: datetime | None,
    budget: Budget,
) -> list[Hit]:
    """The ``limit`` nearest items over all kinds, nearest first (score = cosine distance)."""
    args: list[object] = [
        *scope.key,
        vector,
        model_id,
        exact_max_rows,
        limit,
    ]
    if as_of is not None:
        args.append(as_of)
    rows = await conn.fetch(
        dense_sql(tuple(kinds), with_as_of=as_of is not None),
        *args,
        timeout=statement_timeout(budget),
    )
    return [to_hit(row, float(row["distance"])) for row in rows]
