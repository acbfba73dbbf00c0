"""The object graph of one memsvc process, built from settings and closed in reverse order."""

from __future__ import annotations

import asyncio
import os
from contextlib import AsyncExitStack
from typing import Self

import asyncpg

from memsvc.cache.client import CacheClient, CacheURLError
from memsvc.cache.invalidation import PacketInvalidator
from memsvc.cache.packets import PacketCache
from memsvc.cache.warm_shapes import MAX_SHAPES as WARM_MAX_SHAPES
from memsvc.cache.warm_shapes import WarmShapes
from memsvc.concurrency.fanout import LegRunner
from memsvc.config import ConfigError, Settings, service_config
from memsvc.embedding import Embedder
from memsvc.embedding.factory import build_embedder
from memsvc.embedding.fair import FairEmbedder
from memsvc.embedding.measured import MeasuredEmbedder
from memsvc.export.checks import RecordLimits
from memsvc.export.importer import ImportConfig, ImportService
from memsvc.export.service import ExportConfig, ExportService
from memsvc.extraction import parser_process
from memsvc.extraction.base import Extractor
from memsvc.extraction.factory import build_extractor
from memsvc.extraction.guardrails import Thresholds
from memsvc.governance import trust
from memsvc.governance.compaction import CoreCompactor, CoreLimits, CoreSummarizer
from memsvc.governance.expiry import ExpirySettings, ExpiryTask
from memsvc.governance.guard import PiiGuard
from memsvc.governance.pii import unknown_phone_regions
from memsvc.governance.policy import PolicyError, TenantPolicies, parse_pii_policy
from memsvc.ingest.pipeline import ExtractionPipeline, PipelineSettings
from memsvc.ingest.reconcile import mark_stale, reconcile_once
from memsvc.ingest.service import IngestService
from memsvc.ingest.worker import OutboxWorker, WorkerSettings
from memsvc.memories.batch import BatchService
from memsvc.memories.core_blocks import CoreBlockService
from memsvc.memories.service import MemoryService
from memsvc.memories.sessions import SessionService
from memsvc.memories.watch import ChangeStream, WatchConfig
from memsvc.observability import tracing
from memsvc.overload.core_queue import CoreQueue
from memsvc.overload.cpu_busy import CpuBusy
from memsvc.overload.load import Load, LoadLimits
from memsvc.overload.loop_lag import LoopLag
from memsvc.prefetch.service import PrefetchConfig, PrefetchService
from memsvc.prefetch.warmer import PacketWarmer, WarmConfig
from memsvc.retrieval.embed_cache import EmbeddingLRU, QueryEmbedder
from memsvc.retrieval.recall import RecallConfig, RecallService
from memsvc.retrieval.references import ReferenceRecorder
from memsvc.server.services import Services
from memsvc.storage import pool as pools
from memsvc.storage.notifications import ChangeListener
from memsvc.storage.pool import connect_and_migrate


def embedder_from_settings(settings: Settings, *, background: bool = False) -> Embedder:
    """The configured embedder; `background` ones (workers) run at a lower CPU priority."""
    return build_embedder(
        settings.embedder,
        intra_op_threads=settings.onnx_intra_op_threads,
        base_url=settings.openai_base_url,
        model=settings.openai_embedding_model,
        api_key=settings.openai_api_key or None,
        dimension=settings.embedding_dim,
        timeout_s=settings.embed_timeout_ms / 1000,
        background=background,
    )


def pii_defaults(settings: Settings) -> dict[str, str]:
    """The server's default PII policy, MEMSVC_PII_POLICY and MEMSVC_PII_PHONE_REGIONS checked.
    Their vocabularies are governance's, which config (the bottom layer) does not import: the
    `memsvc` command calls this before it starts anything, and Runtime.start before it
    connects."""
    try:
        policy = parse_pii_policy(settings.pii_policy)
    except PolicyError as exc:
        raise ConfigError(f"MEMSVC_PII_POLICY: {exc}") from None
    if unknown := unknown_phone_regions(settings.pii_phone_regions):
        raise ConfigError(
            f"MEMSVC_PII_PHONE_REGIONS: unknown region(s) {', '.join(unknown)}; expected "
            "ISO 3166 codes such as US, GB, DE"
        )
    return policy


def pipeline_settings(settings: Settings) -> PipelineSettings:
    return service_config(
        settings,
        PipelineSettings,
        thresholds=Thresholds(
            confidence_floor=settings.confidence_floor,
            dedup_upper=settings.dedup_upper,
            dedup_lower=settings.dedup_lower,
        ),
    )


def worker_settings(settings: Settings) -> WorkerSettings:
    return service_config(settings, WorkerSettings)


class Runtime:
    """Pool, cache client, embedder, extractor, services and (optionally) the outbox worker."""

    pool: asyncpg.Pool
    redis: CacheClient
    embedder: Embedder
    extractor: Extractor
    invalidator: PacketInvalidator
    policies: TenantPolicies
    guard: PiiGuard
    memories: MemoryService
    sessions: SessionService
    core_blocks: CoreBlockService
    ingest: IngestService
    recall: RecallService
    prefetch: PrefetchService
    # The process's load signals and rules (overload/): Recall and Prefetch read them, the
    # serving app hands them to the read gate and points the core queue at its server.
    load: Load
    # How long calls wait in gRPC's core for a handler (the load's ``queue``).
    core_queue: CoreQueue
    export: ExportService
    changes: ChangeStream
    listener: ChangeListener
    warmer: PacketWarmer | None
    batch: BatchService
    importer: ImportService
    pipeline: ExtractionPipeline
    pipeline_embedder: Embedder
    trust_policy: trust.TrustPolicy
    references: ReferenceRecorder
    worker: OutboxWorker | None
    expiry: ExpiryTask

    def __init__(
        self,
        settings: Settings,
        *,
        embedder: Embedder | None = None,
        extractor: Extractor | None = None,
        with_worker: bool | None = None,
    ) -> None:
        self.settings = settings
        self._given_embedder = embedder
        self._given_extractor = extractor
        self._with_worker = settings.run_workers if with_worker is None else with_worker
        self._stack = AsyncExitStack()
        self.worker = None
        self.core_queue = CoreQueue()
        self.load = Load(LoadLimits.from_settings(settings), queue=self.core_queue)

    async def start(self) -> None:
        settings = self.settings
        if settings.pg_dsn is None or settings.redis_url is None:
            raise ValueError("pg_dsn and redis_url must be set before starting")
        default_pii = pii_defaults(settings)
        try:
            await self._build(settings, default_pii)
        except BaseException:
            await self._stack.aclose()
            raise

    async def _build(self, settings: Settings, default_pii: dict[str, str]) -> None:
        """Parts, then the services over them, then the background work over the services."""
        # Traces when the standard OTEL_* variables ask for them; before the pool, whose
        # connections then report their statements. Flushed when the runtime closes.
        if not tracing.enabled() and tracing.configure(os.environ):
            self._stack.callback(tracing.shutdown)
        await self._connect(settings)
        await self._build_plugins(settings)
        self._build_governance(settings, default_pii)
        self._build_trust(settings)
        self._build_calls(settings)
        self._build_read_path(settings)
        await self._build_background(settings)

    async def _connect(self, settings: Settings) -> None:
        assert settings.pg_dsn is not None and settings.redis_url is not None
        self.pool = await connect_and_migrate(settings)
        self._stack.push_async_callback(pools.close, self.pool)
        # One server or a cluster, as the URL and the server say (cache/client.py).
        try:
            self.redis = CacheClient(settings.redis_url, timeout_s=settings.redis_timeout_ms / 1000)
        except CacheURLError as exc:
            raise ConfigError(f"MEMSVC_REDIS_URL: {exc}") from None
        self._stack.push_async_callback(self.redis.aclose)

    async def _build_plugins(self, settings: Settings) -> None:
        """The embedder and the extractor: given ones are the caller's to close."""
        if self._given_embedder is not None:
            self.embedder = self._given_embedder
        else:
            self.embedder = await asyncio.to_thread(embedder_from_settings, settings)
            self._stack.push_async_callback(self.embedder.aclose)
        if self.embedder.dimension != settings.embedding_dim:
            raise ValueError(
                f"the embedder produces {self.embedder.dimension} dimensions but "
                f"MEMSVC_EMBEDDING_DIM is {settings.embedding_dim}"
            )
        if self._given_extractor is not None:
            self.extractor = self._given_extractor
        else:
            parser_process.configure(settings.parser_processes)
            self.extractor = build_extractor(settings)
            self._stack.push_async_callback(self.extractor.aclose)

    def _build_governance(self, settings: Settings, default_pii: dict[str, str]) -> None:
        self.invalidator = PacketInvalidator(self.redis, timeout_s=settings.redis_timeout_ms / 1000)
        self.policies = TenantPolicies(
            self.pool,
            default_pii=default_pii,
            default_message_ttl_s=settings.message_ttl_s,
            cache_s=settings.tenant_settings_cache_s,
        )
        self.guard = PiiGuard(
            self.policies, phone_regions=settings.pii_phone_regions, core_role=settings.roles[0]
        )

    def _build_calls(self, settings: Settings) -> None:
        """The services of the explicit writes, Ingest and export."""
        acquire_timeout_s = settings.pg_acquire_timeout_ms / 1000
        write_embedder = MeasuredEmbedder(self.embedder, "write")
        self.memories = MemoryService(
            self.pool,
            write_embedder,
            self.invalidator,
            acquire_timeout_s=acquire_timeout_s,
            embed_timeout_s=settings.embed_timeout_ms / 1000,
            guard=self.guard,
            trust_policy=self.trust_policy,
            compactor=self._compactor(
                settings, write_embedder, embed_timeout_s=settings.embed_timeout_ms / 1000
            ),
            references=self.references,
        )
        self.core_blocks = CoreBlockService(
            self.pool,
            self.invalidator,
            self._compactor(
                settings, write_embedder, embed_timeout_s=settings.embed_timeout_ms / 1000
            ),
            acquire_timeout_s=acquire_timeout_s,
            guard=self.guard,
            trust_policy=self.trust_policy,
        )
        self.sessions = SessionService(
            self.pool, self.invalidator, acquire_timeout_s=acquire_timeout_s
        )
        self.ingest = IngestService(
            self.pool, acquire_timeout_s=acquire_timeout_s, policies=self.policies, guard=self.guard
        )
        # Batch and import (issue 15): the write paths of many records at once.
        self.batch = BatchService(
            self.pool,
            write_embedder,
            self.invalidator,
            acquire_timeout_s=acquire_timeout_s,
            # Up to 100 texts in one embedder call: a batch's bound (the call's deadline caps it).
            embed_timeout_s=settings.worker_embed_timeout_s,
            guard=self.guard,
            trust_policy=self.trust_policy,
            compactor=self._compactor(
                settings, write_embedder, embed_timeout_s=settings.embed_timeout_ms / 1000
            ),
        )
        self.importer = ImportService(
            self.pool,
            MeasuredEmbedder(self.embedder, "import"),
            self.invalidator,
            self.guard,
            service_config(
                settings,
                ImportConfig,
                limits=RecordLimits(
                    max_content_chars=settings.max_content_chars,
                    max_message_chars=settings.max_message_chars,
                ),
            ),
        )
        self.export = ExportService(
            self.pool,
            service_config(settings, ExportConfig),
        )
        # The change stream (WatchMemories); its LISTEN connection opens with the first
        # stream and closes before the pool.
        assert settings.pg_dsn is not None
        # The process's one LISTEN connection: the change stream's, the packet warmer's, the
        # outbox worker's and the API keys' revocations.
        self.listener = ChangeListener(
            settings.pg_dsn,
            connect_timeout_s=acquire_timeout_s,
            command_timeout_s=settings.pg_command_timeout_ms / 1000,
        )
        self._stack.push_async_callback(self.listener.stop)
        self.changes = ChangeStream(
            self.pool,
            self.listener,
            service_config(settings, WatchConfig),
        )

    async def _build_background(self, settings: Settings) -> None:
        """The extraction pipeline, and (with workers) the outbox worker and expiry loop."""
        assert settings.pg_dsn is not None
        self.pipeline = ExtractionPipeline(
            self.pool,
            MeasuredEmbedder(await self._background_embedder(settings), "extraction"),
            self.extractor,
            self.invalidator,
            pipeline_settings(settings),
            guard=self.guard,
            compactor=self._compactor(
                settings, self.pipeline_embedder, embed_timeout_s=settings.worker_embed_timeout_s
            ),
        )
        if self._with_worker:
            await mark_stale(
                self.pool,
                self.embedder.model_id,
                acquire_timeout_s=settings.worker_acquire_timeout_ms / 1000,
            )
            worker = OutboxWorker(
                self.pool,
                self.pipeline,
                worker_settings(settings),
                listener=self.listener,
                periodic=lambda: reconcile_once(
                    self.pool,
                    MeasuredEmbedder(self.pipeline_embedder, "reconcile"),
                    embed_timeout_s=settings.worker_embed_timeout_s,
                    acquire_timeout_s=settings.worker_acquire_timeout_ms / 1000,
                ),
            )
            await worker.start()
            self._stack.push_async_callback(worker.stop, settings.shutdown_grace_s)
            self.worker = worker
        # Built always (run_once works in any process); its loop runs beside the workers.
        self.expiry = ExpiryTask(
            self.pool,
            self.invalidator,
            service_config(settings, ExpirySettings),
        )
        if self._with_worker:
            self.expiry.start()
            self._stack.push_async_callback(self.expiry.stop)

    def _build_trust(self, settings: Settings) -> None:
        """Confidence decay and last_referenced_at: the policy, and the recorder whose task
        flushes references in the background (stopped, with a last flush, before the pool
        closes)."""
        self.trust_policy = trust.policy_from(settings.confidence_half_life_days)
        self.references = ReferenceRecorder(
            self.pool,
            interval_s=settings.references_flush_interval_ms / 1000,
            max_pending=settings.references_max_pending,
            statement_timeout_s=settings.pg_command_timeout_ms / 1000,
            min_interval_s=settings.references_min_interval_s,
        )
        self.references.start()
        self._stack.push_async_callback(self.references.stop)

    def _compactor(
        self, settings: Settings, embedder: Embedder, *, embed_timeout_s: float
    ) -> CoreCompactor:
        """The core-memory limit; with a model that can summarize (openai), compaction
        folds demoted items into one core fact."""
        extractor = self.extractor
        return CoreCompactor(
            CoreLimits(
                human_chars=settings.human_block_max_chars,
                persona_chars=settings.persona_block_max_chars,
                core_role=settings.roles[0],
            ),
            self.trust_policy,
            embedder=embedder,
            summarizer=extractor if isinstance(extractor, CoreSummarizer) else None,
            summarize_timeout_s=settings.core_compaction_timeout_ms / 1000,
            embed_timeout_s=embed_timeout_s,
        )

    def _build_read_path(self, settings: Settings) -> None:
        """Recall and Prefetch share the query-embedding LRU and the leg runner."""
        query_embedder = QueryEmbedder(
            MeasuredEmbedder(self.embedder, "query"), EmbeddingLRU(settings.query_embed_cache_size)
        )
        runner = LegRunner()
        # Cancelled legs give their connections back before the pool closes.
        self._stack.push_async_callback(runner.aclose)
        loop_lag = LoopLag()
        loop_lag.start()
        self._stack.callback(loop_lag.stop)
        cpu = None
        if settings.reads_max_cpu_busy > 0:
            cpu = CpuBusy()
            cpu.start()
            self._stack.callback(cpu.stop)
        self.load = Load(
            LoadLimits.from_settings(settings), loop_lag=loop_lag, cpu=cpu, queue=self.core_queue
        )
        self.recall = RecallService(
            self.pool,
            query_embedder,
            runner,
            RecallConfig.from_settings(settings),
            load=self.load,
            references=self.references,
        )
        self.prefetch = PrefetchService(
            self.pool,
            query_embedder,
            PacketCache(
                self.redis,
                timeout_s=settings.redis_timeout_ms / 1000,
                ttl_s=settings.packet_ttl_s,
                retry_after_s=settings.cache_retry_after_ms / 1000,
            ),
            runner,
            PrefetchConfig.from_settings(settings),
            load=self.load,
            references=self.references,
        )
        self.warmer = None
        if settings.prefetch_warm:
            self.warmer = PacketWarmer(
                self.pool,
                self.prefetch,
                WarmShapes(
                    self.redis,
                    timeout_s=settings.redis_timeout_ms / 1000,
                    ttl_s=settings.prefetch_warm_ttl_s,
                    max_shapes=WARM_MAX_SHAPES,
                ),
                self.listener,
                service_config(settings, WarmConfig),
            )
            # Started by the serving process (server/app.py), not by a worker-only one.
            self._stack.push_async_callback(self.warmer.stop)

    async def _background_embedder(self, settings: Settings) -> Embedder:
        """Workers embed in batches: with the local model and a worker in this process they
        get their own, lower-priority inference thread, so a Recall's query embedding never
        queues behind an extraction batch."""
        embedder = self.embedder
        if self._with_worker and self._given_embedder is None and settings.embedder == "onnx":
            background = await asyncio.to_thread(embedder_from_settings, settings, background=True)
            self._stack.push_async_callback(background.aclose)
            # Its one inference thread takes texts tenant by tenant, not call by call.
            embedder = FairEmbedder(background)
        self.pipeline_embedder = embedder
        return embedder

    @property
    def services(self) -> Services:
        """The services a gRPC servicer serves."""
        return Services(
            memories=self.memories,
            ingest=self.ingest,
            recall=self.recall,
            prefetch=self.prefetch,
            export=self.export,
            batch=self.batch,
            importer=self.importer,
            sessions=self.sessions,
            core_blocks=self.core_blocks,
            changes=self.changes,
        )

    async def close(self) -> None:
        await self._stack.aclose()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
