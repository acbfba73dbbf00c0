"""Prefetch orchestration: version, cache, single-flight build under the budget, framing.

1. Read the user's content version (PostgreSQL) and, at the same time, the cached packet of
   this (user, request shape) from Redis. The version is read before any content, so a
   packet built after reading v holds data at least as new as v; the cached one is served
   only when it was built at the current version. Redis down or slow: build anyway and
   answer ``cache: BYPASSED``; the call's own deadline cut the cache short (Redis may be
   fine): ``cache: SKIPPED``.
2. Otherwise build once per (key, version) (single flight), as two legs on their own
   connections: "core" (the core blocks' text, pinned/core and persona facts) and
   "relevant" (hint embedding,
   topic ranking, episode walk, relevant facts). A leg not done when the budget runs out is
   cancelled and the packet is built from the rest, marked degraded and not cached; nor is
   a version 0 one (nothing stored, or an erased user).
3. Add the header naming the session (not part of the cached body).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

from memsvc.cache.keys import packet_key, user_index_key
from memsvc.cache.packets import CacheDeadline, CacheStatus, CacheUnavailable, PacketCache
from memsvc.concurrency.deadline import Budget
from memsvc.concurrency.fanout import LegRunner, late
from memsvc.concurrency.single_flight import SingleFlight
from memsvc.config import Settings, from_setting, service_config
from memsvc.embedding import EmbeddingError
from memsvc.embedding.base import EmbeddingTimeout
from memsvc.errors import ResourceExhausted
from memsvc.governance import trust
from memsvc.observability import metrics, tracing
from memsvc.overload.load import Load
from memsvc.prefetch import assembly, codec, expiry, packet, queries
from memsvc.prefetch.model import (
    CORE,
    EPISODES,
    HUMAN_BLOCK,
    PERSONA,
    PERSONA_BLOCK,
    RELEVANT,
    EdgeRow,
    FactCandidate,
    Packet,
    PrefetchQuery,
    SectionCount,
)
from memsvc.retrieval import (
    Hit,
    ItemKind,
    QueryEmbedder,
    ReferenceRecorder,
    Vector,
    cjk_patterns,
    dense_hits,
    keep_visible,
    lexical_hits,
    memory_visible,
    rrf,
)
from memsvc.storage import versions
from memsvc.storage.connection import Connection
from memsvc.storage.model import EpisodeRecord, MemoryRecord
from memsvc.storage.pool import acquire, statement_timeout
from memsvc.v1 import memory_pb2 as pb

log = logging.getLogger(__name__)

CORE_LEG = "core"
RELEVANT_LEG = "relevant"
# The hint's embedding may use at most this share of the budget; past it the walk goes on
# with full text only (degraded) so the SQL still has time.
EMBED_SHARE = 0.5
# Upper bound on topics / episode rows read per Prefetch (the walk keeps the best few).
MAX_TOPIC_ROWS = 500
MAX_EDGE_ROWS = 500


@dataclass(frozen=True)
class PrefetchConfig:
    rrf_k: int = field(metadata=from_setting("rrf_k"))
    half_life_days: float = field(metadata=from_setting("half_life_days"))
    topics: int = field(metadata=from_setting("prefetch_topics"))
    episodes: int = field(metadata=from_setting("prefetch_episodes"))
    facts: int = field(metadata=from_setting("prefetch_facts"))
    direct_facts: int = field(metadata=from_setting("prefetch_direct_facts"))
    exact_max_rows: int = field(metadata=from_setting("dense_exact_max_rows"))
    roles: tuple[str, ...] = field(metadata=from_setting("roles"))
    embed_timeout_s: float = field(metadata=from_setting("embed_timeout_ms"))
    acquire_timeout_s: float = field(metadata=from_setting("pg_acquire_timeout_ms"))
    redis_timeout_s: float = field(metadata=from_setting("redis_timeout_ms"))
    # A session not ended by Ingest counts as finished once its last message is this old.
    session_idle_s: float = field(default=1_800.0, metadata=from_setting("session_idle_s"))
    trust_policy: trust.TrustPolicy = field(default_factory=trust.TrustPolicy)

    @classmethod
    def from_settings(cls, settings: Settings) -> PrefetchConfig:
        """The fields marked from_setting, and the trust policy (derived)."""
        return service_config(
            settings, cls, trust_policy=trust.policy_from(settings.confidence_half_life_days)
        )


@dataclass
class PrefetchTimings:
    cache_ms: float = 0.0
    embed_ms: float = 0.0
    build_ms: float = 0.0
    total_ms: float = 0.0


@dataclass(frozen=True)
class PrefetchResult:
    """``text`` is the full packet text (header included); ``wire`` is the packet in its
    contract form with the body as its text, this call's own copy (from the cache on a hit)."""

    text: str
    wire: pb.PrefetchResponse
    cache: CacheStatus
    timings: PrefetchTimings


@dataclass
class _CoreParts:
    core: list[MemoryRecord]
    persona: list[tuple[MemoryRecord, float]]
    # The exact scope's core-block texts by block ("persona", "human").
    blocks: dict[str, str] = field(default_factory=dict)


@dataclass
class _RelevantParts:
    candidates: list[FactCandidate]
    episodes: list[EpisodeRecord]
    embed_missing: bool = False
    embed_ms: float = 0.0


@dataclass
class _Build:
    """One build's outcome, shared by every call that joined it: each decodes its own copy
    of ``encoded`` (one protobuf parse, in C), so the packet is converted to its wire form
    once, for the cache and the answers alike."""

    encoded: bytes  # the packet as a serialized PrefetchResponse (body without the header)
    from_cache: bool  # another build stored it meanwhile; this one did no work
    stored: bool | None  # None: not attempted (degraded, or cache unavailable)
    embed_ms: float
    cache_ms: float
    # Why a put failed: BYPASSED (Redis failed or slow) or SKIPPED (the deadline ran out).
    put_status: CacheStatus | None = None


class PrefetchService:
    def __init__(
        self,
        pool: asyncpg.Pool,
        embedder: QueryEmbedder,
        cache: PacketCache,
        runner: LegRunner,
        config: PrefetchConfig,
        *,
        load: Load | None = None,
        references: ReferenceRecorder | None = None,
    ) -> None:
        """``load``: the process's load (overload/load.py); None: an idle one."""
        self._references = references
        self._pool = pool
        self._embedder = embedder
        self._cache = cache
        self._runner = runner
        self._config = config
        self._load = load if load is not None else Load()
        self._flights: SingleFlight[str, _Build] = SingleFlight()
        #: Packets built from PostgreSQL so far (cache hits and joined flights build none).
        self.builds = 0
        #: Called with each hint-less query answered (the packet warmer records its shape).
        self.on_hintless: Callable[[PrefetchQuery], None] | None = None

    async def prefetch(self, query: PrefetchQuery, budget: Budget) -> PrefetchResult:
        self._load.admit_read()
        started = time.perf_counter()
        timings = PrefetchTimings()
        scope = query.scope
        key = packet_key(scope.tenant_id, scope.user_id, query.shape())
        # The cached packet is fetched while the version is read: a hit costs the slower of
        # the two round trips, not their sum.
        lookup = asyncio.create_task(self._lookup(key, budget))
        try:
            version = await self._current_version(query, budget)
        except BaseException:
            lookup.cancel()
            await asyncio.gather(lookup, return_exceptions=True)
            raise
        if version is None:
            # Out of time before anything could be read: nothing to say, never an error.
            lookup.cancel()
            await asyncio.gather(lookup, return_exceptions=True)
            timings.total_ms = (time.perf_counter() - started) * 1000
            nothing = codec.to_proto(_empty(0, degraded=True))
            return PrefetchResult("", nothing, CacheStatus.SKIPPED, timings)
        wire, status, timings.cache_ms = await lookup
        if wire is not None and not _servable(wire, version):
            wire, status = None, CacheStatus.MISS

        if wire is None:
            use_cache = status is CacheStatus.MISS
            build_started = time.perf_counter()
            try:
                result, _joined = await self._flights.do(
                    f"{key}:{version}",
                    lambda: self._build(query, version, key, budget, use_cache=use_cache),
                    join_timeout_s=budget.remaining(),
                )
                timings.embed_ms = result.embed_ms
                timings.cache_ms += result.cache_ms
                wire = codec.decode(result.encoded)
                if result.from_cache:
                    status = CacheStatus.HIT
                elif use_cache and result.stored is False:
                    status = result.put_status or CacheStatus.BYPASSED
            except TimeoutError:
                # Joined someone else's build and it outlasted this call's budget.
                wire = codec.to_proto(_empty(version, degraded=True))
            timings.build_ms = (time.perf_counter() - build_started) * 1000

        self._record_references(query, wire)
        if not query.hint and self.on_hintless is not None:
            self.on_hintless(query)
        text = ""
        if wire.text:
            text = f"{packet.header(query.session_id)}\n\n{wire.text}"
        timings.total_ms = (time.perf_counter() - started) * 1000
        _observe(timings, status, degraded=wire.degraded)
        return PrefetchResult(text=text, wire=wire, cache=status, timings=timings)

    async def warm(self, query: PrefetchQuery, version: int, budget: Budget) -> str:
        """Build and cache the packet of ``query`` at ``version`` unless it is cached already
        (or being built: this joins that build). "built" when this call stored it, "skipped"
        when it was there or another build had it, "failed" when it could not be stored
        (degraded, or the cache unavailable). No admission gate, no references recorded: no
        caller is waiting and nothing was shown."""
        key = packet_key(query.scope.tenant_id, query.scope.user_id, query.shape())
        result, joined = await self._flights.do(
            f"{key}:{version}",
            lambda: self._build(query, version, key, budget, use_cache=True),
            join_timeout_s=budget.remaining(),
        )
        if joined or result.from_cache:
            return "skipped"
        return "built" if result.stored else "failed"

    async def _current_version(self, query: PrefetchQuery, budget: Budget) -> int | None:
        """The user's content version; None when the budget ran out first. Every write bumps
        it in its own transaction, and it is read before any content: a packet built after
        reading v holds data at least as new as v."""
        scope = query.scope
        try:
            async with (
                asyncio.timeout(budget.remaining()),
                acquire(
                    self._pool, budget, timeout_s=self._config.acquire_timeout_s, busy_is_late=True
                ) as conn,
            ):
                return await versions.current_version(conn, scope.tenant_id, scope.user_id)
        except TimeoutError:
            if not budget.expired:
                raise ResourceExhausted(
                    "every database connection is busy; retry shortly"
                ) from None
            return None

    async def _lookup(
        self, key: str, budget: Budget
    ) -> tuple[pb.PrefetchResponse | None, CacheStatus, float]:
        """The cached packet under ``key`` (any version), the cache status, milliseconds."""
        started = time.perf_counter()
        wire: pb.PrefetchResponse | None = None
        status = CacheStatus.MISS
        with tracing.span("memsvc.prefetch.cache_get"):
            try:
                raw = await self._cache.get(key, budget_s=budget.remaining())
            except CacheDeadline:
                raw, status = None, CacheStatus.SKIPPED
            except CacheUnavailable:
                raw, status = None, CacheStatus.BYPASSED
            tracing.set_attributes(found=raw is not None)
        if raw is not None:
            try:
                wire = codec.decode(raw)
                status = CacheStatus.HIT
            except codec.CodecError as exc:
                log.warning("ignoring a cached packet: %s", exc)
        return wire, status, (time.perf_counter() - started) * 1000

    def _record_references(self, query: PrefetchQuery, wire: pb.PrefetchResponse) -> None:
        """The facts this answer shows (built or from the cache) were referenced now."""
        if self._references is None or not wire.facts:
            return
        ids = []
        for fact in wire.facts:
            with contextlib.suppress(ValueError):
                ids.append(uuid.UUID(fact.memory_id))
        self._references.record(query.scope.tenant_id, query.scope.user_id, ids)

    async def _build(
        self, query: PrefetchQuery, version: int, key: str, budget: Budget, *, use_cache: bool
    ) -> _Build:
        with tracing.span("memsvc.prefetch.build", version=version):
            return await self._build_packet(query, version, key, budget, use_cache=use_cache)

    async def _build_packet(
        self, query: PrefetchQuery, version: int, key: str, budget: Budget, *, use_cache: bool
    ) -> _Build:
        if use_cache:
            # This call's lookup may have missed just before a build it could not join (it
            # had ended) stored the packet: look once more before doing the work again.
            again, _status, lookup_ms = await self._lookup(key, budget)
            if again is not None and _servable(again, version):
                return _Build(
                    again.SerializeToString(),
                    from_cache=True,
                    stored=True,
                    embed_ms=0.0,
                    cache_ms=lookup_ms,
                )
        self.builds += 1
        legs: dict[str, Coroutine[Any, Any, Any]] = {
            CORE_LEG: self._core_leg(query, budget),
            RELEVANT_LEG: self._relevant_leg(query, budget),
        }
        results = await self._runner.run(legs, budget_s=budget.remaining())
        failures = [
            r.error
            for r in results.values()
            if r.error is not None and not late(r, (EmbeddingTimeout,))
        ]
        if failures and len(failures) == len(results):
            raise failures[0]  # the database is failing, not slow: UNAVAILABLE
        degraded = any(not r.ok for r in results.values())
        core: _CoreParts = results[CORE_LEG].value or _CoreParts([], [])
        relevant: _RelevantParts = results[RELEVANT_LEG].value or _RelevantParts([], [])
        degraded = degraded or relevant.embed_missing
        built = self._assemble(query, version, core, relevant, degraded=degraded)
        encoded = codec.encode(built)

        stored: bool | None = None
        put_status: CacheStatus | None = None
        cache_ms = 0.0
        # Version 0 is "nothing stored", and also what an erased user reads again: a packet
        # built then could hold what the erasure removed. It is cheap to build; never cache it.
        if use_cache and not degraded and version > 0:
            cache_started = time.perf_counter()
            with tracing.span("memsvc.prefetch.cache_put"):
                try:
                    await self._cache.put(
                        key,
                        user_index_key(query.scope.tenant_id, query.scope.user_id),
                        encoded,
                        budget_s=max(budget.remaining(), 0.001),
                        max_ttl_ms=expiry.max_ttl_ms(built, datetime.now(UTC)),
                    )
                    stored = True
                except CacheDeadline:
                    stored, put_status = False, CacheStatus.SKIPPED
                except CacheUnavailable:
                    stored, put_status = False, CacheStatus.BYPASSED
            cache_ms = (time.perf_counter() - cache_started) * 1000
        return _Build(
            encoded,
            from_cache=False,
            stored=stored,
            embed_ms=relevant.embed_ms,
            cache_ms=cache_ms,
            put_status=put_status,
        )

    async def _core_leg(self, query: PrefetchQuery, budget: Budget) -> _CoreParts:
        cfg = self._config
        async with acquire(
            self._pool, budget, timeout_s=self._config.acquire_timeout_s, busy_is_late=True
        ) as conn:
            blocks = await queries.block_texts(
                conn, query.scope, timeout_s=statement_timeout(budget)
            )
            core = await queries.core_facts(
                conn,
                query.scope,
                core_role=cfg.roles[0],
                limit=cfg.facts,
                timeout_s=statement_timeout(budget),
            )
            persona: list[tuple[MemoryRecord, float]] = []
            if query.scope.persona_id:
                persona = await queries.persona_facts(
                    conn, query.scope, limit=cfg.facts, timeout_s=statement_timeout(budget)
                )
        return _CoreParts(core, persona, blocks)

    async def _embed_hint(
        self, tenant_id: str, hint: str, budget: Budget, parts: _RelevantParts
    ) -> Vector | None:
        started = time.perf_counter()
        try:
            return await self._embedder.embed(
                tenant_id,
                hint,
                timeout_s=min(self._config.embed_timeout_s, budget.remaining() * EMBED_SHARE),
            )
        except EmbeddingError as exc:  # EmbeddingTimeout included
            log.info("prefetch continues without the hint's vector: %s", type(exc).__name__)
            parts.embed_missing = True
            return None
        finally:
            parts.embed_ms = (time.perf_counter() - started) * 1000

    async def _relevant_leg(self, query: PrefetchQuery, budget: Budget) -> _RelevantParts:
        cfg = self._config
        scope, hint = query.scope, query.hint
        parts = _RelevantParts([], [])
        vector = await self._embed_hint(scope.tenant_id, hint, budget, parts) if hint else None
        now = datetime.now(UTC)
        async with acquire(
            self._pool, budget, timeout_s=self._config.acquire_timeout_s, busy_is_late=True
        ) as conn:
            topic_rows = await queries.topics(
                conn,
                scope,
                hint=hint,
                vector=vector,
                model_id=self._embedder.model_id,
                patterns=cjk_patterns(hint),
                limit=MAX_TOPIC_ROWS,
                timeout_s=statement_timeout(budget),
            )
            ranked_topics = assembly.rank_topics(
                topic_rows,
                has_hint=bool(hint),
                now=now,
                half_life_days=cfg.half_life_days,
                rrf_k=cfg.rrf_k,
                limit=cfg.topics,
            )
            topic_scores = {t.topic_id: score for t, score in ranked_topics}
            edges: list[EdgeRow] = await queries.episodes(
                conn,
                scope,
                topic_ids=list(topic_scores),
                recent=cfg.episodes,
                limit=MAX_EDGE_ROWS,
                idle_s=cfg.session_idle_s,
                timeout_s=statement_timeout(budget),
            )
            episode_scores = assembly.score_episodes(
                edges, topic_scores, now=now, half_life_days=cfg.half_life_days
            )
            picked = assembly.pick_episodes(
                (e.episode for e in edges), episode_scores, limit=cfg.episodes
            )
            walked_ids = [e.episode_id for e in picked if episode_scores.get(e.episode_id)]
            walked = await queries.walk_facts(
                conn,
                scope,
                episode_ids=walked_ids,
                limit=cfg.facts * 2,
                timeout_s=statement_timeout(budget),
            )
            direct = await self._direct_facts(conn, query, vector, budget, now)
        parts.candidates = assembly.merge_candidates(walked, direct, episode_scores)
        parts.episodes = picked
        return parts

    async def _direct_facts(
        self,
        conn: Connection,
        query: PrefetchQuery,
        vector: Vector | None,
        budget: Budget,
        now: datetime,
    ) -> list[tuple[MemoryRecord, float]]:
        """Facts matching the hint (RRF of dense and lexical), or the most recent ones; each
        with a relevance in (0, 1] (recency decay without a hint)."""
        cfg = self._config
        scope = query.scope
        if not query.hint:
            recent = await queries.recent_facts(
                conn,
                scope,
                core_role=cfg.roles[0],
                limit=cfg.direct_facts,
                timeout_s=statement_timeout(budget),
            )
            return [(r, assembly.decay(r.recorded_at, now, cfg.half_life_days)) for r in recent]
        legs: dict[str, list[Hit]] = {}
        if vector is not None:
            legs["dense"] = await dense_hits(
                conn,
                scope,
                vector,
                (ItemKind.FACT,),
                model_id=self._embedder.model_id,
                limit=cfg.facts,
                exact_max_rows=cfg.exact_max_rows,
                as_of=None,
                budget=budget,
            )
        legs["lexical"] = await lexical_hits(
            conn,
            scope,
            query.hint,
            (ItemKind.FACT,),
            limit=cfg.facts,
            exact_max_rows=cfg.exact_max_rows,
            as_of=None,
            budget=budget,
        )
        fused = rrf({k: keep_visible(scope, v) for k, v in legs.items()}, k=cfg.rrf_k)
        top = max((f.fused_score for f in fused), default=0.0)
        # Pinned and core facts have their own section: the direct picks are the others.
        picks = [f for f in fused if not (f.hit.pinned or f.hit.role == cfg.roles[0])][
            : cfg.direct_facts
        ]
        return [(f.hit.memory, f.fused_score / top) for f in picks if f.hit.memory is not None]

    def _assemble(
        self,
        query: PrefetchQuery,
        version: int,
        core: _CoreParts,
        relevant: _RelevantParts,
        *,
        degraded: bool,
    ) -> Packet:
        cfg = self._config
        scope = query.scope
        now = datetime.now(UTC)

        def decorate(record: MemoryRecord) -> MemoryRecord:
            return trust.decorate(record, now, cfg.trust_policy)

        # Defense in depth: every fact re-checked against the caller's scope, as Recall does.
        persona_ranked = assembly.order_facts(
            (
                FactCandidate(decorate(r), w, 0.0)
                for r, w in core.persona
                if memory_visible(scope, r)
            ),
            cfg.roles,
        )
        persona_records = [c.record for c in persona_ranked]
        taken = {r.memory_id for r in persona_records}
        core_records = [
            r
            for r in trust.core_order(decorate(r) for r in core.core)
            if r.memory_id not in taken and memory_visible(scope, r)
        ]
        taken.update(r.memory_id for r in core_records)
        # Ordered without the effective confidence, so only the facts kept are decorated.
        relevant_records = [
            decorate(r)
            for r in [
                c.record
                for c in assembly.order_facts(relevant.candidates, cfg.roles)
                if c.record.memory_id not in taken and memory_visible(scope, c.record)
            ][: cfg.facts]
        ]
        episodes = sorted(
            (e for e in relevant.episodes if e.scope == scope),
            key=lambda e: (-e.ended_at.timestamp(), e.episode_id),
        )
        persona_block = packet.persona_block_section(
            scope.persona_id, core.blocks.get("persona", "")
        )
        human_block = packet.human_block_section(core.blocks.get("human", ""))
        sections = [
            persona_block,
            packet.persona_section(
                scope.persona_id,
                [packet.fact_line(r) for r in persona_records],
                after_block=bool(persona_block.lines),
            ),
            human_block,
            packet.core_section([packet.fact_line(r) for r in core_records]),
            packet.relevant_section([packet.fact_line(r) for r in relevant_records]),
            packet.episodes_section([packet.episode_line(e) for e in episodes]),
        ]
        rendered = packet.render(
            sections,
            limits=packet.Limits(query.chars, query.tokens),
            header_reserve=packet.header("x" * packet.MAX_SESSION_ECHO),
        )
        shown = rendered.shown
        facts = (
            persona_records[: shown[PERSONA]]
            + core_records[: shown[CORE]]
            + relevant_records[: shown[RELEVANT]]
        )
        return Packet(
            body=rendered.body,
            facts=tuple(facts),
            episodes=tuple(episodes[: shown[EPISODES]]),
            counts={
                PERSONA_BLOCK: SectionCount(
                    persona_block.shown_size(shown[PERSONA_BLOCK]), persona_block.total_size()
                ),
                HUMAN_BLOCK: SectionCount(
                    human_block.shown_size(shown[HUMAN_BLOCK]), human_block.total_size()
                ),
                PERSONA: SectionCount(shown[PERSONA], len(persona_records)),
                CORE: SectionCount(shown[CORE], len(core_records)),
                RELEVANT: SectionCount(shown[RELEVANT], len(relevant_records)),
                EPISODES: SectionCount(shown[EPISODES], len(episodes)),
            },
            withheld=rendered.withheld,
            version=version,
            degraded=degraded,
            built_at=datetime.now(UTC),
        )


def _servable(wire: pb.PrefetchResponse, version: int) -> bool:
    """A cached packet may answer a call that read ``version``: it was built at that version
    (not before the latest change), which is not 0 (never cached: a stored one predates an
    erasure), and it holds nothing that has expired since."""
    return (
        version > 0
        and wire.version == version
        and not expiry.holds_expired(wire, datetime.now(UTC))
    )


def _empty(version: int, *, degraded: bool) -> Packet:
    zero = SectionCount(0, 0)
    return Packet(
        body="",
        facts=(),
        episodes=(),
        counts={PERSONA: zero, CORE: zero, RELEVANT: zero, EPISODES: zero},
        withheld=(),
        version=version,
        degraded=degraded,
    )


def _observe(timings: PrefetchTimings, status: CacheStatus, *, degraded: bool) -> None:
    metrics.PREFETCH_CACHE.labels(status.value).inc()
    if degraded:
        metrics.PREFETCH_DEGRADED.inc()
    for stage, ms in (
        ("cache", timings.cache_ms),
        ("embed", timings.embed_ms),
        ("build", timings.build_ms),
        ("total", timings.total_ms),
    ):
        if ms > 0:
            metrics.PREFETCH_STAGE_SECONDS.labels(stage).observe(ms / 1000)
