"""Prometheus metrics, defined once per process (the default registry).

Labels carry names from closed sets (RPC methods, status codes, legs, stages, models) and
never a tenant, user or any request text: cardinality stays bounded and nothing private is
exported. docs/operations/observability.md lists them.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

INGEST_JOBS = Counter(
    "memsvc_ingest_jobs_total", "Ingest jobs finished by workers, by result", ["result"]
)
INGEST_DEAD = Counter(
    "memsvc_ingest_dead_total",
    "Ingest jobs given up: after the last attempt, or at once on a permanent failure",
)
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

# gRPC edge: the server interceptor sees every call, unauthenticated and malformed ones too.
_RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
RPC_STARTED = Counter(
    "memsvc_grpc_server_started_total", "Calls started", ["grpc_service", "grpc_method"]
)
RPC_HANDLED = Counter(
    "memsvc_grpc_server_handled_total",
    "Calls finished, by the status code the caller received",
    ["grpc_service", "grpc_method", "grpc_code"],
)
RPC_SECONDS = Histogram(
    "memsvc_grpc_server_handling_seconds",
    "Time from the handler's start to its final status",
    ["grpc_service", "grpc_method"],
    buckets=_RPC_BUCKETS,
)
RPC_IN_FLIGHT = Gauge(
    "memsvc_grpc_server_in_flight", "Calls being handled now", ["grpc_service", "grpc_method"]
)
TENANT_LIMITED = Counter(
    "memsvc_tenant_limited_total",
    "Calls refused RESOURCE_EXHAUSTED by a per-tenant limit (rate or in_flight)",
    ["limit"],
)
# Authentication (issue 31): database lookups of keys the directory did not answer, and
# calls refused UNAUTHENTICATED, by reason (missing, malformed, unknown, revoked_or_unknown).
AUTH_LOOKUPS = Counter(
    "memsvc_auth_lookups_total",
    "API key lookups that went to the database (the key directory could not answer)",
)
AUTH_FAILURES = Counter(
    "memsvc_auth_failures_total", "Calls refused UNAUTHENTICATED, by reason", ["reason"]
)

# Embedding, by model and by who asked: query (Recall, Prefetch), write (Remember, Correct),
# extraction (workers), reconcile (re-embedding).
EMBED_SECONDS = Histogram(
    "memsvc_embedding_seconds",
    "Latency of one embedding call (a batch of texts)",
    ["model", "where"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
EMBED_TEXTS = Counter("memsvc_embedding_texts_total", "Texts embedded", ["model", "where"])
EMBED_FAILURES = Counter(
    "memsvc_embedding_failures_total",
    "Embedding calls that failed (error: timeout or failed)",
    ["model", "where", "error"],
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
    "memsvc_recall_missing_legs_total",
    "Recall legs missing from an answer (reason: late, failed, or overload: not started)",
    ["leg", "reason"],
)
RECALL_DEGRADED = Counter("memsvc_recall_degraded_total", "Recall answers marked degraded")
RECALL_SKIPPED_LEGS = Counter(
    "memsvc_recall_skipped_legs_total",
    "Recall legs not used by choice: the lexical leg's best match held every word of the "
    "query under a voice-sized deadline (embed: not even computed)",
    ["leg"],
)
RECALL_AHEAD = Counter(
    "memsvc_recall_ahead_total",
    "RecallStream work ahead: finals answered from an answer computed ahead (ready), from "
    "one still running (awaited) or afresh (missed); attempts cancelled by a newer interim; "
    "interims beyond the stream's rate, not worked ahead (over_rate)",
    ["outcome"],
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
PREFETCH_DEGRADED = Counter("memsvc_prefetch_degraded_total", "Prefetch answers marked degraded")
PREFETCH_WARM = Counter(
    "memsvc_prefetch_warm_total",
    "Background rebuilds of a packet after a change, by result (built; skipped: already"
    " cached, another process had it, or the server was busy; failed)",
    ["result"],
)
CORE_QUEUE_WAIT = Gauge(
    "memsvc_core_queue_wait_seconds",
    "How long the oldest call queued in gRPC's core for a handler has waited, at the last"
    " sample (overload/core_queue.py; Recall degrades and reads are refused on it)",
)
READS_SHED = Counter(
    "memsvc_reads_shed_total", "Reads answered RESOURCE_EXHAUSTED at once (too many in flight)"
)

# ExportMemories.
EXPORT_RECORDS = Counter(
    "memsvc_export_records_total", "Records streamed by ExportMemories, by type", ["type"]
)
EXPORT_BATCHES = Counter(
    "memsvc_export_batches_total", "Cursor batches ExportMemories read from PostgreSQL"
)
EXPORTS_IN_FLIGHT = Gauge("memsvc_exports_in_flight", "ExportMemories streams running now")
# Change stream (issue 15).
WATCH_STREAMS = Gauge("memsvc_watch_streams", "WatchMemories streams open now")
WATCH_CHANGES = Counter(
    "memsvc_watch_changes_total",
    "MemoryChange messages sent by WatchMemories, by kind (heartbeat included)",
    ["kind"],
)
WATCH_LISTENER_RECONNECTS = Counter(
    "memsvc_watch_listener_reconnects_total",
    "Times the change stream's LISTEN connection was (re)opened after a failure",
)
# Batch and import (issue 15).
REMEMBER_BATCH_ITEMS = Counter(
    "memsvc_remember_batch_items_total",
    "RememberBatch items, by outcome (stored, reinforced, failed)",
    ["outcome"],
)
IMPORT_RECORDS = Counter(
    "memsvc_import_records_total",
    "Records read by ImportMemories, by type and outcome (imported, skipped)",
    ["type", "outcome"],
)

# PII screening on the write paths (path: remember, correct, extraction; action: store,
# redact, reject); labels are closed sets, never the text.
PII_SCREENED = Counter(
    "memsvc_pii_screened_total",
    "Personal data found in text about to be stored, by kind, action taken and write path",
    ["kind", "action", "path"],
)

# Trust over time and the core-memory limit.
REFERENCES_FLUSHED = Counter(
    "memsvc_references_flushed_total", "Memory ids whose last_referenced_at a flush wrote"
)
REFERENCES_DROPPED = Counter(
    "memsvc_references_dropped_total",
    "Memory ids not recorded as referenced (buffer full, or the flush failed)",
    ["reason"],
)
CORE_DEMOTED = Counter(
    "memsvc_core_demoted_total",
    "Core memories demoted to ordinary facts to keep a core block within its limit",
    ["path"],
)
CORE_COMPACTIONS = Counter(
    "memsvc_core_compactions_total",
    "Core-block compactions, by how (demote, summarize, or fallback after a model failure)",
    ["mode"],
)

# Retention: rows the expiry task (or a session's end) deleted.
EXPIRED = Counter(
    "memsvc_expired_total",
    "Rows deleted because their retention ended (memory, episode, topic, message)",
    ["kind"],
)

# The process itself: pauses of the cyclic garbage collector (they stop the event loop).
GC_PAUSE_SECONDS = Histogram(
    "memsvc_gc_pause_seconds",
    "Pause of one garbage collection, by generation",
    ["generation"],
    buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
)
