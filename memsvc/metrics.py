"""Prometheus metrics, defined once per process (the default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

INGEST_JOBS = Counter(
    "memsvc_ingest_jobs_total", "Ingest jobs finished by workers, by result", ["result"]
)
INGEST_DEAD = Counter("memsvc_ingest_dead_total", "Ingest jobs given up after the last attempt")
EXTRACTION_OUTCOMES = Counter(
    "memsvc_extraction_outcomes_total", "What extraction did with candidate facts", ["kind"]
)
JOB_SECONDS = Histogram(
    "memsvc_ingest_job_seconds",
    "Time to process one ingest job",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
OUTBOX_DEPTH = Gauge("memsvc_outbox_depth", "Ingest jobs pending or processing")
OUTBOX_AGE = Gauge("memsvc_outbox_oldest_age_seconds", "Age of the oldest unfinished ingest job")
RECONCILED = Counter(
    "memsvc_reconciled_embeddings_total", "Rows re-embedded by the reconcile task", ["table"]
)
EMBED_FAILURES = Counter(
    "memsvc_embedding_failures_total", "Embedding calls that failed", ["where"]
)

# Read path.
_READ_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
RECALL_STAGE_SECONDS = Histogram(
    "memsvc_recall_stage_seconds",
    "Recall time per stage (embed, dense, lexical, fuse, total)",
    ["stage"],
    buckets=_READ_BUCKETS,
)
RECALL_MISSING_LEGS = Counter(
    "memsvc_recall_missing_legs_total", "Recall legs that did not make it in time", ["leg"]
)
PREFETCH_STAGE_SECONDS = Histogram(
    "memsvc_prefetch_stage_seconds",
    "Prefetch time per stage (cache, embed, build, total)",
    ["stage"],
    buckets=_READ_BUCKETS,
)
PREFETCH_CACHE = Counter(
    "memsvc_prefetch_cache_total", "Prefetch answers by cache status", ["status"]
)
READS_SHED = Counter(
    "memsvc_reads_shed_total", "Reads answered RESOURCE_EXHAUSTED at once (too many in flight)"
)
