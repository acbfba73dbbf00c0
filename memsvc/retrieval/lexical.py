"""The lexical leg: full text with any-term semantics, plus an ILIKE fallback for CJK text.

Any-term: a natural-language question ANDed word by word ("what does she drink in the
morning") matches almost nothing, so the query's lexemes (stemmed and stop-worded by
plainto_tsquery, the same 'english' configuration the stored tsvectors use) are ORed, and
ts_rank_cd orders rows by how many of them they contain and how close together.

CJK: the 'english' parser keeps a run of Chinese or Japanese characters as one "word", so
"咖啡" never matches "我喜欢喝咖啡". For such runs the leg also matches character bigrams
(unigrams for a lone character) with ILIKE, scored by the share of bigrams found. The scope
predicate is in the same WHERE, so the planner starts from the scope's btree and the ILIKE
only ever scans one user's rows.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Sequence
from datetime import datetime

from memsvc.concurrency.deadline import Budget
from memsvc.retrieval.query import Hit, ItemKind
from memsvc.retrieval.sources import SOURCES, TIE_BREAK_SQL, statement_timeout, to_hit
from memsvc.storage.connection import Connection
from memsvc.storage.model import Scope

MAX_PATTERNS = 32

# Scripts the 'english' text-search parser does not split into words.
_UNSEGMENTED_PREFIXES = ("CJK", "HIRAGANA", "KATAKANA", "HANGUL")


def _unsegmented(ch: str) -> bool:
    name = unicodedata.name(ch, "")
    return name.startswith(_UNSEGMENTED_PREFIXES)


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def cjk_patterns(text: str, *, limit: int = MAX_PATTERNS) -> list[str]:
    """ILIKE patterns for the query's CJK runs: every character bigram, or the lone
    character; de-duplicated, in order, at most ``limit``. Empty for other text."""
    runs: list[str] = []
    current: list[str] = []
    for ch in text:
        if _unsegmented(ch):
            current.append(ch)
        elif current:
            runs.append("".join(current))
            current = []
    if current:
        runs.append("".join(current))
    grams: list[str] = []
    for run in runs:
        if len(run) == 1:
            grams.append(run)
        else:
            grams.extend(run[i : i + 2] for i in range(len(run) - 1))
    unique = list(dict.fromkeys(grams))[:limit]
    return [f"%{_like_escape(g)}%" for g in unique]


@functools.lru_cache(maxsize=64)
def lexical_sql(kinds: tuple[ItemKind, ...], *, with_as_of: bool, with_cjk: bool) -> str:
    """$1..$4 scope, $5 query text, $6 limit, $7 exact_max_rows, [$8 as_of], [then the ILIKE
    patterns]; all kinds in one statement.

    Like the dense leg, a small scope is searched row by row: the match condition is kept
    off the GIN index (``|| ''::tsvector``), so the plan starts from the scope's btree and
    tests only that user's rows, whatever the table's size. A common word's posting list
    grows with the whole table; the user's rows do not. A large scope may use the index.

    The ILIKE fallback is in the statement only for a query with CJK text (``with_cjk``).
    Without it, PostgreSQL's generic plan for the prepared statement costs what a plan for
    the actual values does, so it settles on the generic one and stops planning each call
    (about 1 ms of planning per call, three times the execution, on the bench corpus);
    an unknown pattern array keeps the large-scope branch off the indexes in a generic
    plan, so the CJK variant is planned per call.
    """
    params = 7 + with_as_of
    patterns = f"${params + 1}::text[]"
    ctes = ["q AS (SELECT replace(plainto_tsquery('english', $5)::text, ' & ', ' | ')::tsquery"
            " AS tsq)"]  # fmt: skip
    branches: list[str] = []
    for kind in kinds:
        source = SOURCES[kind]
        tsv, text = source.tsv_sql, source.text_sql
        time_sql = source.time_sql("$8" if with_as_of else None)
        count = f"{kind.value}_rows"
        ctes.append(
            f"{count} AS (SELECT count(*) AS n FROM (SELECT 1 FROM {source.table}"
            " WHERE tenant_id = $1 AND user_id = $2 LIMIT $7 + 1) AS capped)"
        )
        score = f"CASE WHEN {tsv} @@ q.tsq THEN {source.rank()} ELSE 0 END"
        if with_cjk:
            score += (
                f" + (SELECT count(*) FROM unnest({patterns}) AS p WHERE {text} ILIKE p)::real"
                f" / greatest(cardinality({patterns}), 1)"
            )
        for matched, gate in (
            (f"({tsv} || ''::tsvector)", f"(SELECT n FROM {count}) <= $7"),
            (tsv, f"(SELECT n FROM {count}) > $7"),
        ):
            match = f"{matched} @@ q.tsq"
            if with_cjk:
                match = f"({match} OR {text} ILIKE ANY ({patterns}))"
            branches.append(
                f"(SELECT {source.select_list}, ({score}) AS lexical_score"
                f" FROM {source.table}, q"
                f" WHERE {source.scope_sql} AND {time_sql} AND {gate} AND {match}"
                " ORDER BY lexical_score DESC, item_id LIMIT $6)"
            )
    return (
        "/* memsvc:recall:lexical */"
        f" WITH {', '.join(ctes)}"
        f" SELECT * FROM ({' UNION ALL '.join(branches)}) AS hits"
        f" ORDER BY lexical_score DESC, {TIE_BREAK_SQL} LIMIT $6"
    )


async def lexical_hits(
    conn: Connection,
    scope: Scope,
    text: str,
    kinds: Sequence[ItemKind],
    *,
    limit: int,
    exact_max_rows: int,
    as_of: datetime | None,
    budget: Budget,
) -> list[Hit]:
    """The ``limit`` best text matches over all kinds, best first (score higher is better)."""
    args: list[object] = [
        *scope.key,
        text,
        limit,
        exact_max_rows,
    ]
    if as_of is not None:
        args.append(as_of)
    patterns = cjk_patterns(text)
    if patterns:
        args.append(patterns)
    rows = await conn.fetch(
        lexical_sql(tuple(kinds), with_as_of=as_of is not None, with_cjk=bool(patterns)),
        *args,
        timeout=statement_timeout(budget),
    )
    return [to_hit(row, float(row["lexical_score"])) for row in rows]
