"""Recall orchestration: both legs at once under the budget, then post-filter, RRF, ordering.

Each leg runs as its own task on its own pooled connection. When the budget runs out, a
leg still running is cancelled — asyncpg then sends the server a cancel request, so its
query really stops — and the answer is built from what finished, marked degraded with the
missing legs named. Running out of time is never an error here; only when every leg that
ran failed for another reason (database or embedder down) does the call fail.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import asyncpg
import numpy as np
import numpy.typing as npt

from memsvc.concurrency.deadline import Budget
from memsvc.concurrency.fanout import LegRunner, late
from memsvc.config import Settings, from_setting, service_config
from memsvc.embedding.base import EmbeddingTimeout
from memsvc.governance import trust
from memsvc.observability import metrics, tracing
from memsvc.overload.load import Load
from memsvc.retrieval import route_effects
from memsvc.retrieval.dense import dense_hits
from memsvc.retrieval.embed_cache import QueryEmbedder
from memsvc.retrieval.fusion import rrf
from memsvc.retrieval.leg_policy import lexical_suffices
from memsvc.retrieval.lexical import lexical_hits
from memsvc.retrieval.query import Hit, ItemKind, RecallQuery
from memsvc.retrieval.ranking import Ranked, RankWeights, final_order
from memsvc.retrieval.references import ReferenceRecorder
from memsvc.retrieval.relevance import relevance
from memsvc.retrieval.scope_filter import keep_visible
from memsvc.storage.pool import acquire

log = logging.getLogger(__name__)

DENSE = "dense"
LEXICAL = "lexical"
EMBED = "embed"
# The default minimum relevance is a gate on the answer: when a fact or message among its best
# RELEVANCE_GATE_ITEMS items reaches it, the answer is returned as ranked; otherwise each item
# needs its kind's minimum (a question about something never stored gets nothing). Per item,
# the same minimum dropped answers the lexical leg found by their words when the text embeds
# far from the question: LoCoMo dev split, messages without speaker names, hybrid R@10 70.7
# with no minimum, 64.9 with 0.2 per item, 70.7 with the gate (with names: 80.4, 80.2,
# 80.4); off-topic questions answered with nothing: 63% -> 69% without names, 80% -> 82%
# with them (measured with the gate of any kind; episodes no longer open it).
RELEVANCE_GATE_ITEMS = 10
# Candidates of the lexical leg when the dense leg was shed for overload: nothing is fused
# with them, so a few past the relevance gate's window do (a tenth of the decoding).
SHED_CANDIDATES = 3 * RELEVANCE_GATE_ITEMS


@dataclass(frozen=True)
class RecallConfig:
    rrf_k: int = field(metadata=from_setting("rrf_k"))
    # Per-leg RRF weights (score = weight / (k + rank)).
    leg_weights: Mapping[str, float]
    candidates: int = field(metadata=from_setting("recall_candidates"))
    exact_max_rows: int = field(metadata=from_setting("dense_exact_max_rows"))
    embed_timeout_s: float = field(metadata=from_setting("embed_timeout_ms"))
    acquire_timeout_s: float = field(metadata=from_setting("pg_acquire_timeout_ms"))
    roles: tuple[str, ...] = field(metadata=from_setting("roles"))
    half_life_days: float = field(metadata=from_setting("half_life_days"))
    # Budgets up to this long (voice) do not wait for the embedding and the dense leg when
    # the lexical leg suffices (leg_policy); 0: always wait.
    lexical_enough_below_s: float = field(
        default=0.0, metadata=from_setting("recall_lexical_enough_below_ms")
    )
    # On arrival, the query is embedded only when the embedder's queue is expected to clear
    # within this share of the budget; otherwise the answer comes from the lexical leg alone
    # (missing embed and dense, reason "overload"), at once instead of late.
    embed_admit_share: float = field(default=0.5, metadata=from_setting("recall_embed_admit_share"))
    # Legs still running after all but this share of the budget are stopped: the answer then
    # has that long to be fused, framed and sent, and on a saturated machine to wait for a
    # core on its way out and in the caller's process.
    answer_headroom: float = field(default=0.25, metadata=from_setting("recall_answer_headroom"))
    # Query routing: the route's effects on the ordering (off: reported, but neutral).
    routing: bool = field(default=True, metadata=from_setting("routing"))
    # The lexical leg weighs query words by their rarity in the scope (lexical.idf_cte).
    lexical_idf: bool = field(default=False, metadata=from_setting("lexical_idf"))
    trust_policy: trust.TrustPolicy = field(default_factory=trust.TrustPolicy)

    @classmethod
    def from_settings(cls, settings: Settings) -> RecallConfig:
        """The fields marked from_setting, and those derived from several settings."""
        return service_config(
            settings,
            cls,
            leg_weights={DENSE: settings.rrf_dense_weight, LEXICAL: settings.rrf_lexical_weight},
            trust_policy=trust.policy_from(settings.confidence_half_life_days),
        )


@dataclass
class RecallTimings:
    embed_ms: float = 0.0
    dense_ms: float = 0.0
    lexical_ms: float = 0.0
    fuse_ms: float = 0.0
    total_ms: float = 0.0


@dataclass(frozen=True)
class RecallResult:
    items: list[Ranked]
    degraded: bool
    missing_legs: tuple[str, ...]
    timings: RecallTimings
    route: str
    # Legs not used by choice (leg_policy): the lexical leg's best match sufficed.
    skipped_legs: tuple[str, ...] = ()


@dataclass
class _DenseProgress:
    """Where the dense leg got to, so a late leg can say whether the embedding was missing."""

    embedded: bool = False
    embed_ms: float = 0.0
    sql_started: float = 0.0
    # The query's vector once known (for the items' relevance).
    vector: npt.NDArray[np.float32] | None = None


class RecallService:
    """Hybrid retrieval for one caller at a time; shares the pool, embedder and leg runner."""

    # Weight of the newest lexical leg in the moving average behind floor_s().
    FLOOR_ALPHA = 0.1
    # Without new legs the average halves this often: a gate that refuses every read on it
    # would otherwise never see the load fall.
    FLOOR_HALF_LIFE_S = 0.1

    def __init__(
        self,
        pool: asyncpg.Pool,
        embedder: QueryEmbedder,
        runner: LegRunner,
        config: RecallConfig,
        *,
        load: Load | None = None,
        references: ReferenceRecorder | None = None,
    ) -> None:
        """``load``: the process's load (overload/load.py); None: an idle one."""
        self._pool = pool
        self._embedder = embedder
        self._runner = runner
        self._config = config
        self._load = load if load is not None else Load()
        self._references = references
        self._lexical_s = 0.0
        self._lexical_at = 0.0

    def floor_s(self) -> float:
        """About how long the cheapest answer (the lexical leg alone) takes now: the recent
        lexical legs, which wait for the pool, the database and the event loop like any
        read, plus the loop's current lateness. The read gate refuses a call only when even
        this does not fit its budget (0 before the first leg)."""
        lag_s = self._load.lag_s
        age_s = time.monotonic() - self._lexical_at
        decay: float = 0.5 ** (age_s / self.FLOOR_HALF_LIFE_S)
        return self._lexical_s * decay + lag_s

    def _machine_saturated(self, tenant_id: str, text: str) -> bool:
        """The load says the machine is saturated (Load.saturated), and ``text`` is not
        embedded yet: its ~10 ms of CPU would push every answer on the machine later (a
        cached vector costs none). A degraded answer comes before refusing anyone: calls
        then leave the queue faster than they arrive, where an embedding each keeps it."""
        return self._load.saturated() and self._embedder.cached(tenant_id, text) is None

    def _legs_budget_s(self, budget: Budget) -> float:
        """How long the legs may run: the budget less its headroom, and less twice the loop's
        current lag. On a lagging loop the timer that stops the legs fires that late, and the
        callbacks that send the answer run that late again; without this a saturated server
        answers a few tens of ms after the deadline it meant to keep."""
        lag_s = self._load.lag_s
        return max(0.0, budget.remaining() * (1.0 - self._config.answer_headroom) - 2 * lag_s)

    async def _dense(
        self, query: RecallQuery, budget: Budget, limit: int, progress: _DenseProgress
    ) -> list[Hit]:
        with tracing.span("memsvc.recall.dense"):
            return await self._dense_leg(query, budget, limit, progress)

    async def _dense_leg(
        self, query: RecallQuery, budget: Budget, limit: int, progress: _DenseProgress
    ) -> list[Hit]:
        vector = query.vector
        if vector is None:
            started = time.perf_counter()
            try:
                vector = await self._embedder.embed(
                    query.scope.tenant_id,
                    query.text,
                    timeout_s=budget.cap(self._config.embed_timeout_s),
                )
            finally:
                progress.embed_ms = (time.perf_counter() - started) * 1000
        progress.embedded = True
        progress.vector = vector
        progress.sql_started = time.perf_counter()
        async with acquire(
            self._pool, budget, timeout_s=self._config.acquire_timeout_s, busy_is_late=True
        ) as conn:
            return await dense_hits(
                conn,
                query.scope,
                vector,
                query.search_kinds,
                model_id=self._embedder.model_id,
                limit=limit,
                exact_max_rows=self._config.exact_max_rows,
                as_of=query.as_of,
                budget=budget,
                filters=query.filters,
            )

    async def _lexical(
        self, query: RecallQuery, budget: Budget, limit: int, *, with_vectors: bool
    ) -> list[Hit]:
        with tracing.span("memsvc.recall.lexical"):
            return await self._lexical_leg(query, budget, limit, with_vectors=with_vectors)

    async def _lexical_leg(
        self, query: RecallQuery, budget: Budget, limit: int, *, with_vectors: bool
    ) -> list[Hit]:
        async with acquire(
            self._pool, budget, timeout_s=self._config.acquire_timeout_s, busy_is_late=True
        ) as conn:
            return await lexical_hits(
                conn,
                query.scope,
                query.text,
                query.search_kinds,
                limit=limit,
                exact_max_rows=self._config.exact_max_rows,
                as_of=query.as_of,
                budget=budget,
                filters=query.filters,
                # Hybrid: the hits' embeddings, so a lexical-only hit gets a cosine relevance.
                embedding_model=self._embedder.model_id if with_vectors else None,
                idf=self._config.lexical_idf,
            )

    def record_references(self, query: RecallQuery, result: RecallResult) -> None:
        """Count the answer's memories as referenced (trust): done by :meth:`recall`, and by a
        caller that answers with a result computed ahead (``record_references=False``)."""
        if self._references is not None:
            scope = query.scope
            self._references.record(
                scope.tenant_id,
                scope.user_id,
                (r.memory.memory_id for r in result.items if r.memory is not None),
            )

    async def recall(
        self, query: RecallQuery, budget: Budget, *, record_references: bool = True
    ) -> RecallResult:
        """``record_references``: False for work ahead of a question not yet asked (a
        RecallStream's interims): only an answer the caller receives counts as a reference."""
        self._load.admit_read()
        started = time.perf_counter()
        timings = RecallTimings()
        limit = max(self._config.candidates, query.top_k)
        progress = _DenseProgress()
        legs: dict[str, Coroutine[Any, Any, list[Hit]]] = {}
        shed: tuple[str, ...] = ()
        # Fact-only filters leave no kind to search when facts were not asked for.
        if query.wants_dense and query.search_kinds:
            if query.vector is None and (
                self._machine_saturated(query.scope.tenant_id, query.text)
                or not self._embedder.admits(
                    query.scope.tenant_id,
                    query.text,
                    self._config.embed_admit_share * budget.remaining(),
                )
            ):
                # The embedder is busier than this budget allows, or the machine has no CPU
                # left for it: answer from the lexical leg alone now, rather than wait in its
                # queue (or for a core) and answer late.
                shed = (EMBED, DENSE)
            else:
                legs[DENSE] = self._dense(query, budget, limit, progress)
        if query.wants_lexical and query.search_kinds:
            # Shed, the answer has no query vector: the hits' vectors would go unused, and
            # fewer candidates do for one leg (it is the overloaded path: keep it cheap).
            legs[LEXICAL] = self._lexical(
                query,
                budget,
                max(SHED_CANDIDATES, query.top_k) if shed else limit,
                with_vectors=query.wants_dense and not shed,
            )
        # A voice-sized budget with a vector still to compute: the lexical leg may make it
        # unnecessary (then it is not used even if it finished first, so the same query
        # always gets the same answer).
        policy = (
            DENSE in legs
            and LEXICAL in legs
            and query.vector is None
            and self._config.lexical_enough_below_s > 0
            and budget.remaining() <= self._config.lexical_enough_below_s
        )
        results = await self._runner.run(
            legs, budget_s=self._legs_budget_s(budget), settle=_dense_unneeded if policy else None
        )
        skipped: tuple[str, ...] = ()
        lexical_result = results.get(LEXICAL)
        if (
            policy
            and lexical_result is not None
            and lexical_result.ok
            and lexical_suffices(lexical_result.value or [])
        ):
            skipped = (EMBED, DENSE) if not progress.embedded else (DENSE,)
            results = {name: r for name, r in results.items() if name != DENSE}

        missing: list[str] = list(shed)
        # missing leg -> late, failed or overload, for the metric
        reasons: dict[str, str] = dict.fromkeys(shed, "overload")
        failures: list[BaseException] = []
        ranked_lists: dict[str, list[Hit]] = {}
        for name, result in results.items():
            if name == DENSE:
                timings.embed_ms = progress.embed_ms
                if progress.embedded:
                    timings.dense_ms = result.elapsed_ms - (progress.sql_started - started) * 1000
            else:
                timings.lexical_ms = result.elapsed_ms
                # Finished legs only: one stopped at the budget (a slow database) still gave
                # an answer in time, degraded and empty, which is not a reason to refuse.
                if result.ok:
                    self._lexical_s += self.FLOOR_ALPHA * (
                        result.elapsed_ms / 1000 - self._lexical_s
                    )
                    self._lexical_at = time.monotonic()
            if result.ok:
                assert result.value is not None
                ranked_lists[name] = keep_visible(query.scope, result.value)
                continue
            reason = "late" if late(result, (EmbeddingTimeout,)) else "failed"
            if name == DENSE and not progress.embedded:
                missing.append(EMBED)
                reasons[EMBED] = reason
            missing.append(name)
            reasons[name] = reason
            if reason == "failed":
                assert result.error is not None
                failures.append(result.error)
                log.warning("recall %s leg failed: %s", name, type(result.error).__name__)
        if failures and not ranked_lists and len(failures) == len(results):
            # Nothing ran out of time: the backends are failing. Say so (UNAVAILABLE).
            raise failures[0]

        fuse_started = time.perf_counter()
        fused = rrf(ranked_lists, k=self._config.rrf_k, weights=self._config.leg_weights)
        plan = route_effects.plan(query.text, enabled=self._config.routing)
        ranked = final_order(
            fused,
            now=datetime.now(UTC),
            role_order=self._config.roles,
            plan=plan,
            weights=RankWeights(half_life_days=self._config.half_life_days),
            trust_policy=self._config.trust_policy,
            trust_now=query.as_of,
        )
        # A skipped dense leg leaves no vector either, even when the embedding finished: the
        # items' relevance is then their word coverage, whatever the timing.
        vector = progress.vector if progress.embedded and not skipped else None
        ranked = keep_relevant(query, ranked, vector)
        timings.fuse_ms = (time.perf_counter() - fuse_started) * 1000
        timings.total_ms = (time.perf_counter() - started) * 1000
        order = [EMBED, DENSE, LEXICAL]
        missing_sorted = tuple(sorted(set(missing), key=order.index))
        _observe(timings, {leg: reasons[leg] for leg in missing_sorted}, skipped)
        answer = RecallResult(
            items=ranked,
            degraded=bool(missing_sorted),
            missing_legs=missing_sorted,
            timings=timings,
            route=plan.route,
            skipped_legs=skipped,
        )
        if record_references:
            self.record_references(query, answer)
        return answer


def keep_relevant(
    query: RecallQuery, ranked: list[Ranked], vector: npt.NDArray[np.float32] | None
) -> list[Ranked]:
    """The answer's items with their relevance, cut to top_k by the minimum relevance: per
    item when the caller set one; as a gate on the whole answer by default."""
    if not query.relevance_gate:
        scored = (replace(r, relevance=relevance(r.fused, vector)) for r in ranked)
        return [r for r in scored if r.relevance >= query.minimum(r.fused.hit.kind)][: query.top_k]
    window = ranked[: max(query.top_k, RELEVANCE_GATE_ITEMS)]
    scored_window = [replace(r, relevance=relevance(r.fused, vector)) for r in window]
    gate = scored_window[:RELEVANCE_GATE_ITEMS]
    # Only a fact or a message opens the gate: an episode's minimum is lower (a summary sits
    # far from any one question), and a loosely related one must not bring back every
    # unrelated fact. Closed, each item still needs its own kind's minimum.
    if any(
        r.fused.hit.kind is not ItemKind.EPISODE and r.relevance >= query.min_relevance
        for r in gate
    ):
        return scored_window[: query.top_k]
    return [r for r in scored_window if r.relevance >= query.minimum(r.fused.hit.kind)][
        : query.top_k
    ]


def _dense_unneeded(leg: str, hits: list[Hit]) -> tuple[str, ...]:
    return (DENSE,) if leg == LEXICAL and lexical_suffices(hits) else ()


def _observe(
    timings: RecallTimings, missing: Mapping[str, str], skipped: tuple[str, ...] = ()
) -> None:
    for stage, ms in (
        (EMBED, timings.embed_ms),
        (DENSE, timings.dense_ms),
        (LEXICAL, timings.lexical_ms),
        ("fuse", timings.fuse_ms),
        ("total", timings.total_ms),
    ):
        if ms > 0:
            metrics.RECALL_STAGE_SECONDS.labels(stage).observe(ms / 1000)
    for leg, reason in missing.items():
        metrics.RECALL_MISSING_LEGS.labels(leg, reason).inc()
    if missing:
        metrics.RECALL_DEGRADED.inc()
    for leg in skipped:
        metrics.RECALL_SKIPPED_LEGS.labels(leg).inc()
