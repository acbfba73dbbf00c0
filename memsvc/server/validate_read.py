"""Validation of Recall, RecallStream and Prefetch requests: proto in, domain query out."""

from __future__ import annotations

import math
import unicodedata
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError

from memsvc.config import Settings
from memsvc.errors import InvalidArgument
from memsvc.prefetch.model import PrefetchQuery
from memsvc.retrieval.query import (
    DEFAULT_KINDS,
    NO_FILTERS,
    ORIGINS,
    ItemKind,
    Mode,
    RecallFilters,
    RecallQuery,
)
from memsvc.server import validate
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb

_KINDS = {
    pb.ITEM_TYPE_FACT: ItemKind.FACT,
    pb.ITEM_TYPE_EPISODE: ItemKind.EPISODE,
    pb.ITEM_TYPE_MESSAGE: ItemKind.MESSAGE,
}
_MODES = {
    pb.RECALL_MODE_UNSPECIFIED: Mode.HYBRID,
    pb.RECALL_MODE_HYBRID: Mode.HYBRID,
    pb.RECALL_MODE_DENSE: Mode.DENSE,
    pb.RECALL_MODE_LEXICAL: Mode.LEXICAL,
}


def query_text(value: str, field: str, settings: Settings) -> str:
    """Free text of a query or hint: trimmed, bounded, no control characters but breaks."""
    text = value.strip()
    if len(text) > settings.max_query_chars:
        raise InvalidArgument(f"{field}: at most {settings.max_query_chars} characters")
    if any(unicodedata.category(ch) in ("Cc", "Cs") and ch not in "\n\r\t" for ch in text):
        raise InvalidArgument(f"{field}: must not contain control characters")
    return text


def query_vector(values: list[float], settings: Settings) -> np.ndarray | None:
    if not values:
        return None
    if len(values) != settings.embedding_dim:
        raise InvalidArgument(
            f"query_vector: must have {settings.embedding_dim} dimensions, got {len(values)}"
        )
    if not all(math.isfinite(v) for v in values):
        raise InvalidArgument("query_vector: must contain finite numbers only")
    vector = np.asarray(values, dtype=np.float32)
    if not np.any(vector):
        raise InvalidArgument("query_vector: must not be all zeros (no direction to compare)")
    return vector


def recall(request: pb.RecallRequest, scope: Scope, settings: Settings) -> RecallQuery:
    text = query_text(request.query, "query", settings)
    vector = query_vector(list(request.query_vector), settings)
    if not text and vector is None:
        raise InvalidArgument("query: required unless query_vector is set")
    if not 0 <= request.top_k <= settings.recall_max_top_k:
        raise InvalidArgument(
            f"top_k: between 1 and {settings.recall_max_top_k} (0: default "
            f"{settings.recall_default_top_k})"
        )
    kinds: list[ItemKind] = []
    for i, raw in enumerate(request.types):
        kind = _KINDS.get(raw)
        if kind is None:
            raise InvalidArgument(f"types[{i}]: not an item type; FACT, EPISODE or MESSAGE")
        if kind not in kinds:
            kinds.append(kind)
    mode = _MODES.get(request.mode)
    if mode is None:
        raise InvalidArgument("mode: not a mode; HYBRID, DENSE or LEXICAL")
    if mode is Mode.LEXICAL and not text:
        raise InvalidArgument("query: LEXICAL mode needs a text query (a vector cannot match text)")
    return RecallQuery(
        scope=scope,
        text=text,
        vector=vector,
        top_k=request.top_k or settings.recall_default_top_k,
        kinds=tuple(kinds) or DEFAULT_KINDS,
        mode=mode,
        as_of=validate.timestamp(request.as_of, "as_of") if request.HasField("as_of") else None,
        filters=recall_filters(request.filters, settings)
        if request.HasField("filters")
        else NO_FILTERS,
        min_relevance=min_relevance(request.filters, settings),
        min_relevance_episode=(
            None if request.filters.HasField("min_score") else settings.recall_min_relevance_episode
        ),
        relevance_gate=not request.filters.HasField("min_score"),
    )


# RecallFilters limits (the proto's comments).
MAX_FILTER_VOCABULARY = 20
MAX_FILTER_ORIGINS = 10
MAX_FILTER_SESSIONS = 100


def _bounded(values: list[str], field: str, limit: int) -> list[str]:
    if len(values) > limit:
        raise InvalidArgument(f"{field}: at most {limit} entries")
    return values


def _closed(values: list[str], field: str, allowed: tuple[str, ...], limit: int) -> tuple[str, ...]:
    """Values of a closed vocabulary, case-insensitive, de-duplicated in order."""
    checked = [
        validate.vocabulary(v, f"{field}[{i}]", allowed, "") or _empty(f"{field}[{i}]")
        for i, v in enumerate(_bounded(values, field, limit))
    ]
    return tuple(dict.fromkeys(checked))


def _empty(field: str) -> str:
    raise InvalidArgument(f"{field}: must not be empty")


def recall_filters(filters: pb.RecallFilters, settings: Settings) -> RecallFilters:
    since = (
        validate.timestamp(filters.since, "filters.since") if filters.HasField("since") else None
    )
    until = (
        validate.timestamp(filters.until, "filters.until") if filters.HasField("until") else None
    )
    if since is not None and until is not None and not since < until:
        raise InvalidArgument("filters.since: must be before filters.until")
    sessions = validate.id_list(
        filters.session_ids, "filters.session_ids", settings, MAX_FILTER_SESSIONS
    )
    return RecallFilters(
        categories=_closed(
            list(filters.categories),
            "filters.categories",
            settings.categories,
            MAX_FILTER_VOCABULARY,
        ),
        roles=_closed(list(filters.roles), "filters.roles", settings.roles, MAX_FILTER_VOCABULARY),
        origins=_closed(list(filters.origins), "filters.origins", ORIGINS, MAX_FILTER_ORIGINS),
        session_ids=tuple(dict.fromkeys(sessions)),
        since=since,
        until=until,
    )


def min_relevance(filters: pb.RecallFilters, settings: Settings) -> float:
    """filters.min_score, or the server's calibrated default when unset; 0: no minimum."""
    if not filters.HasField("min_score"):
        return settings.recall_min_relevance
    value = filters.min_score
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise InvalidArgument("filters.min_score: between 0 and 1 (0: no minimum)")
    return float(value)


def prefetch(request: pb.PrefetchRequest, scope: Scope, settings: Settings) -> PrefetchQuery:
    chars = request.budget.chars
    if chars != 0 and not settings.packet_min_chars <= chars <= settings.packet_max_chars:
        raise InvalidArgument(
            f"budget.chars: between {settings.packet_min_chars} and {settings.packet_max_chars}"
            f" (0: default {settings.packet_default_chars})"
        )
    tokens = request.budget.tokens
    if tokens != 0 and not settings.packet_min_chars <= tokens <= settings.packet_max_chars:
        # Tokens are counted as UTF-8 bytes (never under-counted), hence the same floor.
        raise InvalidArgument(
            f"budget.tokens: between {settings.packet_min_chars} and {settings.packet_max_chars}"
            " (0: no token limit)"
        )
    return PrefetchQuery(
        scope=scope,
        session_id=validate.identifier(request.session_id, "session_id", settings, required=False),
        hint=" ".join(query_text(request.hint, "hint", settings).split()),
        chars=chars or settings.packet_default_chars,
        tokens=tokens,
    )


# RecallStream: the longest answer time a stream may ask of its finals (a minute, as the
# longest default read deadline would be absurd for a transcript).
MAX_FINAL_DEADLINE_MS = 60_000
# ... and the shortest: the server keeps MEMSVC_DEADLINE_MARGIN_MS of it back to answer, and
# even a degraded answer (the lexical leg alone) takes milliseconds; a voice turn asks ~200.
MIN_FINAL_DEADLINE_MS = 50


@dataclass(frozen=True)
class RecallStreamOpen:
    """What a RecallStream's first request settles for the whole stream."""

    # The Recall every transcript asks, less its text.
    template: pb.RecallRequest
    final_deadline_ms: int


def recall_stream_open(
    first: pb.RecallStreamRequest, scope: Scope, settings: Settings
) -> RecallStreamOpen:
    """The first request of a RecallStream, checked as Recall checks its request (its text
    may still be empty: an interim with no words yet)."""
    shortest = max(MIN_FINAL_DEADLINE_MS, settings.deadline_margin_ms + 1)
    if first.final_deadline_ms and not (
        shortest <= first.final_deadline_ms <= MAX_FINAL_DEADLINE_MS
    ):
        raise InvalidArgument(
            f"final_deadline_ms: 0 (the Recall default) or from {shortest} to"
            f" {MAX_FINAL_DEADLINE_MS}"
        )
    template = pb.RecallRequest(top_k=first.top_k, types=first.types, mode=first.mode)
    if first.HasField("scope"):
        template.scope.CopyFrom(first.scope)
    if first.HasField("as_of"):
        template.as_of.CopyFrom(first.as_of)
    if first.HasField("filters"):
        template.filters.CopyFrom(first.filters)
    # Every field but the text, now: a bad stream is refused before any work. A text that
    # is still empty is checked with each transcript, where it may not stay empty.
    recall_stream_query(template, first.query.strip() or "-", scope, settings)
    return RecallStreamOpen(
        template=template,
        final_deadline_ms=first.final_deadline_ms or settings.recall_default_deadline_ms,
    )


def recall_stream_next(request: pb.RecallStreamRequest) -> None:
    """A later request of a stream sets only its text (and ``final``)."""
    rest = pb.RecallStreamRequest()
    rest.CopyFrom(request)
    rest.ClearField("query")
    rest.ClearField("final")
    fields = rest.ListFields()
    if fields:
        raise InvalidArgument(
            f"{fields[0][0].name}: only the first request of a RecallStream may set it"
        )


def recall_stream_query(
    template: pb.RecallRequest, text: str, scope: Scope, settings: Settings
) -> RecallQuery:
    """One transcript of a stream as the Recall it asks, validated as Recall's request."""
    request = pb.RecallRequest()
    request.CopyFrom(template)
    request.query = text
    return recall(request, scope, settings)


async def recall_stream_read(
    requests: AsyncIterator[pb.RecallStreamRequest],
) -> pb.RecallStreamRequest | None:
    """The stream's next request (None at its end); bytes that are not one are refused."""
    try:
        return await anext(requests, None)
    except DecodeError:
        raise InvalidArgument("a stream message is not a valid RecallStreamRequest") from None
