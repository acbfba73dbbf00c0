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
from memsvc.retrieval.query import NO_FILTERS, Hit, ItemKind, RecallFilters
from memsvc.retrieval.sources import (
    SOURCES,
    TIE_BREAK_SQL,
    Source,
    count_cte,
    filter_args,
    ranged,
    to_hit,
)
from memsvc.storage.connection import Connection
from memsvc.storage.model import Scope
from memsvc.storage.pool import statement_timeout

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


@functools.lru_cache(maxsize=128)
def lexical_sql(
    kinds: tuple[ItemKind, ...],
    *,
    with_as_of: bool,
    with_cjk: bool,
    shape: tuple[bool, ...] = NO_FILTERS.shape,
    with_embedding: bool = False,
    idf: bool = False,
) -> str:
    """$1..$4 scope, $5 query text, $6 limit, $7 exact_max_rows, [$8 as_of], [the embedding
    model id], [the set filters' values, sources.filter_args], [then the ILIKE patterns]; all
    kinds in one statement.

    Like the dense leg, a small scope is searched row by row: the match condition is kept
    off the GIN index (``|| ''::tsvector``), so the plan starts from the scope's btree and
    tests only that user's rows, whatever the table's size. A common word's posting list
    grows with the whole table; the user's rows do not. A large scope may use the index.
    Filters are exact on both branches (a GIN match is not approximate), so the choice
    stays on the user's row count.

    The ILIKE fallback is in the statement only for a query with CJK text (``with_cjk``).
    Without it, PostgreSQL's generic plan for the prepared statement costs what a plan for
    the actual values does, so it settles on the generic one and stops planning each call
    (about 1 ms of planning per call, three times the execution, on the bench corpus);
    an unknown pattern array keeps the large-scope branch off the indexes in a generic
    plan, so the CJK variant is planned per call.

    Each row also carries ``coverage``, the share of the query's distinct lexemes its
    indexed text contains, as matched (a message: with its neighbours; relevance without an
    embedding), and with ``with_embedding`` its stored
    embedding when made by that model (relevance of a lexical-only hit in hybrid mode).

    ``idf``: a row's score is the sum over the query's lexemes of the lexeme's inverse
    document frequency in the scope times the row's rank for that lexeme alone (idf_cte),
    instead of one rank for the whole query, which weighs "the" and "knee" alike.
    """
    slot = 8 + with_as_of
    model = f"${slot}"
    slot += with_embedding
    first_filter = slot
    slot += len(filter_args_shape(shape))
    patterns = f"${slot}::text[]"
    ctes = ["q AS (SELECT replace(plainto_tsquery('english', $5)::text, ' & ', ' | ')::tsquery"
            " AS tsq, tsvector_to_array(to_tsvector('english', $5)) AS lexemes)"]  # fmt: skip
    branches: list[str] = []
    for kind in kinds:
        source = SOURCES[kind]
        tsv, text = source.tsv_sql, source.text_sql
        time_sql = source.time_sql("$8" if with_as_of else None, ranged=ranged(shape))
        filters = source.filter_sql(shape, first_filter)
        count = f"{kind.value}_rows"
        ctes.append(count_cte(source, count, "$7"))
        rank = source.rank()
        if idf:
            ctes.append(idf_cte(source, f"{kind.value}_idf", time_sql))
            # The row's tsvector is read once (`|| ''`: a detoasted copy), then ranked for
            # each lexeme: a long message's context is stored compressed, and each ts_rank
            # call on the column itself would decompress it again.
            term_rank = rank.replace(tsv, "x.t").replace("q.tsq", "i.lq")
            rank = (
                f"(SELECT coalesce(sum(i.idf * {term_rank}), 0)"
                f" FROM (SELECT {tsv} || ''::tsvector AS t OFFSET 0) AS x, {kind.value}_idf AS i)"
            )
        score = f"CASE WHEN {tsv} @@ q.tsq THEN {rank} ELSE 0 END"
        coverage = (
            "(SELECT count(*) FROM unnest(q.lexemes) AS l"
            f" WHERE {tsv} @@ quote_literal(l)::tsquery)::real"
            " / greatest(cardinality(q.lexemes), 1)"
        )
        if with_cjk:
            share = (
                f"(SELECT count(*) FROM unnest({patterns}) AS p WHERE {text} ILIKE p)::real"
                f" / greatest(cardinality({patterns}), 1)"
            )
            score += f" + {share}"
            coverage = f"greatest({coverage}, {share})"
        embedding = (
            f"CASE WHEN embedding_state = 'ok' AND embedding_model = {model} THEN embedding END"
            if with_embedding
            else "NULL::vector"
        )
        for matched, gate in (
            (f"({tsv} || ''::tsvector)", f"(SELECT n FROM {count}) <= $7"),
            (tsv, f"(SELECT n FROM {count}) > $7"),
        ):
            match = f"{matched} @@ q.tsq"
            if with_cjk:
                match = f"({match} OR {text} ILIKE ANY ({patterns}))"
            branches.append(
                f"(SELECT {source.select_list}, ({score}) AS lexical_score,"
                f" ({coverage}) AS coverage, {embedding} AS embedding"
                f" FROM {source.table}, q"
                f" WHERE {source.scope_sql} AND {time_sql}{filters} AND {gate} AND {match}"
                " ORDER BY lexical_score DESC, item_id LIMIT $6)"
            )
    return (
        "/* memsvc:recall:lexical */"
        f" WITH {', '.join(ctes)}"
        f" SELECT * FROM ({' UNION ALL '.join(branches)}) AS hits"
        f" ORDER BY lexical_score DESC, {TIE_BREAK_SQL} LIMIT $6"
    )


def idf_cte(source: Source, name: str, time_sql: str) -> str:
    """``name(lq, idf)``: each query lexeme (as a tsquery) with its BM25 inverse document
    frequency, ln(1 + (N - df + 0.5) / (df + 0.5)), among the scope's rows of the source.

    The statistics are the scope's own, never the table's: another tenant's or user's words
    do not move this user's ranking (and the LoCoMo protocol has one index per
    conversation). A document is the item's own text (``search_tsv``; a message without its
    neighbours). They are counted on at most ``$7`` (exact_max_rows) rows: all of a small
    scope's, a sample of a large one's, so the cost stays bounded whatever the user's size."""
    docs = f"{name}_docs"
    return (
        f"{docs} AS MATERIALIZED (SELECT search_tsv FROM {source.table}"
        f" WHERE {source.scope_sql} AND {time_sql} LIMIT $7),"
        # Each lexeme's tsquery is made once, not once per row it is tested on.
        f" {name} AS MATERIALIZED (SELECT t.lq,"
        f" ln(1 + ((SELECT count(*) FROM {docs}) - count(d.search_tsv) + 0.5)"
        f" / (count(d.search_tsv) + 0.5)) AS idf"
        f" FROM (SELECT DISTINCT quote_literal(l)::tsquery AS lq"
        f" FROM q CROSS JOIN unnest(q.lexemes) AS l) AS t"
        f" LEFT JOIN {docs} AS d ON d.search_tsv @@ t.lq GROUP BY t.lq)"
    )


def filter_args_shape(shape: tuple[bool, ...]) -> list[bool]:
    """One entry per parameter the set filters take."""
    return [present for present in shape if present]


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
    filters: RecallFilters = NO_FILTERS,
    embedding_model: str | None = None,
    idf: bool = False,
) -> list[Hit]:
    """The ``limit`` best text matches over all kinds, best first (score higher is better).

    ``embedding_model``: also fetch each hit's embedding made by that model (None: not).
    ``idf``: weigh each query word by its rarity in the scope (lexical_sql)."""
    args: list[object] = [
        *scope.key,
        text,
        limit,
        exact_max_rows,
    ]
    if as_of is not None:
        args.append(as_of)
    if embedding_model is not None:
        args.append(embedding_model)
    args.extend(filter_args(filters))
    patterns = cjk_patterns(text)
    if patterns:
        args.append(patterns)
    rows = await conn.fetch(
        lexical_sql(
            tuple(kinds),
            with_as_of=as_of is not None,
            with_cjk=bool(patterns),
            shape=filters.shape,
            with_embedding=embedding_model is not None,
            idf=idf,
        ),
        *args,
        timeout=statement_timeout(budget),
    )
    return [
        to_hit(
            row,
            float(row["lexical_score"]),
            coverage=float(row["coverage"]),
            embedding=None if row["embedding"] is None else row["embedding"].to_numpy(),
        )
        for row in rows
    ]
