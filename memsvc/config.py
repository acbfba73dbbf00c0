"""Settings: the environment and CLI flags, read once into a frozen object passed explicitly."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memsvc.governance.pii import unknown_phone_regions
from memsvc.governance.policy import PolicyError, parse_pii_policy

DEFAULT_CATEGORIES = ("preference", "profile", "relationship", "goal", "event", "context")
DEFAULT_ROLES = ("core", "context", "detail", "temporal", "causal")


class ConfigError(ValueError):
    """A setting has a value memsvc cannot use."""


def parse_bool(name: str, raw: str) -> bool:
    """Strict boolean parsing: 'false' is false, and a typo is an error, not 'true'."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}: expected true/false, got {raw!r}")


def _parse_int(name: str, raw: str, *, minimum: int = 0) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name}: must be >= {minimum}, got {value}")
    return value


def _parse_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected a number, got {raw!r}") from None
    if value != value or value < 0:
        raise ConfigError(f"{name}: must be a non-negative number, got {raw!r}")
    return value


def _parse_port(name: str, raw: str) -> int | None:
    """A TCP port; 0 picks a free one; "off" disables the listener."""
    if raw.strip().lower() == "off":
        return None
    port = _parse_int(name, raw)
    if port > 65535:
        raise ConfigError(f"{name}: a port is at most 65535, got {port}")
    return port


def _parse_half_lives(raw: str) -> tuple[tuple[str, float], ...]:
    """ "preference=180,event=30" (categories are checked against the vocabulary later)."""
    name = "MEMSVC_CONFIDENCE_HALF_LIFE_DAYS"
    pairs: dict[str, float] = {}
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        category, sep, value = (x.strip() for x in part.partition("="))
        if not sep or not category:
            raise ConfigError(f"{name}: expected category=days, got {part!r}")
        try:
            days = float(value)
        except ValueError:
            raise ConfigError(f"{name}: {category}: expected a number, got {value!r}") from None
        if not 0 < days < float("inf"):
            raise ConfigError(f"{name}: {category} must be a positive number of days")
        pairs[category] = days
    return tuple(pairs.items())


def _parse_csv(raw: str) -> tuple[str, ...]:
    return tuple(part.strip().lower() for part in raw.split(",") if part.strip())


@dataclass(frozen=True)
class Settings:
    """Everything memsvc can be configured with; units are in the names."""

    grpc_host: str = "127.0.0.1"
    grpc_port: int = 50051
    # None means "start the embedded servers" (memsvc dev) or "required" (memsvc serve).
    pg_dsn: str | None = field(default=None, repr=False)
    redis_url: str | None = field(default=None, repr=False)
    data_dir: Path = Path(".memsvc")

    auth_enabled: bool = True
    # Tenant used when authentication is off (memsvc dev only).
    default_tenant: str = "dev"

    # Every connection opened at start-up: one opened under load costs that moment about
    # 8 ms to connect and 8 ms more on its first queries (a new backend's cold caches).
    pg_pool_min: int = 20
    pg_pool_max: int = 20
    pg_command_timeout_ms: int = 5_000
    pg_acquire_timeout_ms: int = 1_000
    redis_timeout_ms: int = 50

    embedder: str = "onnx"
    embedding_dim: int = 384
    onnx_intra_op_threads: int = 1
    openai_base_url: str = "https://api.openai.com"
    openai_embedding_model: str = "text-embedding-3-small"
    openai_api_key: str = field(default="", repr=False)
    embed_timeout_ms: int = 2_000

    categories: tuple[str, ...] = DEFAULT_CATEGORIES
    roles: tuple[str, ...] = DEFAULT_ROLES
    max_content_chars: int = 2_000
    max_id_chars: int = 128
    max_reason_chars: int = 500
    max_source_ids: int = 100
    max_forget_ids: int = 1_000
    max_page_size: int = 500
    default_page_size: int = 50

    # Write path: Ingest limits, extraction and the workers.
    max_messages_per_ingest: int = 200
    max_message_chars: int = 8_000
    max_goals: int = 20
    extractor: str = "rules"
    openai_chat_base_url: str = "https://api.openai.com"
    openai_chat_model: str = "gpt-4o-mini"
    openai_chat_api_key: str = field(default="", repr=False)
    extractor_timeout_ms: int = 20_000
    # Only USER-role senders whose id matches accrue memories (bots, system ids excluded).
    user_id_pattern: str = r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}"
    confidence_floor: float = 0.5
    dedup_upper: float = 0.92
    dedup_lower: float = 0.75
    max_facts_per_episode: int = 50
    daily_fact_quota: int = 200
    run_workers: bool = True
    worker_concurrency: int = 2
    worker_lease_s: float = 120.0
    worker_job_timeout_s: float = 90.0
    worker_max_attempts: int = 5
    worker_backoff_base_s: float = 2.0
    worker_sweep_interval_s: float = 15.0
    reconcile_interval_s: float = 60.0
    # Workers embed in batches at low priority: a busy machine must not turn that into
    # unembedded messages (the online embed_timeout_ms is for one query).
    worker_embed_timeout_s: float = 30.0

    # Read path: Recall and Prefetch. No deadline on the call -> these defaults.
    recall_default_deadline_ms: int = 800
    prefetch_default_deadline_ms: int = 200
    recall_default_top_k: int = 10
    recall_max_top_k: int = 100
    max_query_chars: int = 2_000
    # Candidates each leg returns before fusion (at least top_k).
    recall_candidates: int = 50
    # Reciprocal Rank Fusion constant (score = 1 / (k + rank)).
    # Measured on the LoCoMo dev split (turn-level R@10, bench/locomo_eval.py): plain RRF at
    # k=60 fused below the lexical leg alone (67.8 vs 75.2); k=10 with the dense leg at half
    # weight gives 77.4, on a plateau (k 5-20, dense weight 0.3-0.5: 76.2-77.5) rather than
    # an edge (k=60 beats lexical only for dense weight <= 0.2, and falls below at 0.3).
    rrf_k: int = 10
    rrf_dense_weight: float = 0.5
    rrf_lexical_weight: float = 1.0
    # Query routing: a temporal query favours items from the dates it names and, when it
    # asks "when", items that say when (retrieval/route_effects). Off: the route is still
    # reported but changes nothing. On raised LoCoMo dev R@10 77.4 -> 78.1 (no category lower).
    routing: bool = True
    # A user with at most this many rows in a table gets the exact dense path (every row's
    # distance, no approximate index); above it, HNSW with pgvector's iterative scan.
    dense_exact_max_rows: int = 2_000
    # Query embeddings kept in the in-process LRU.
    query_embed_cache_size: int = 4_096
    # Reads (Recall + Prefetch) running at once; beyond it a read is shed at once
    # with RESOURCE_EXHAUSTED instead of queueing past its deadline.
    reads_max_in_flight: int = 32
    # ...and a read expected (from recent reads' latency and the reads ahead of it) to take
    # more than this share of its budget is shed the same way.
    reads_queue_share: float = 0.4
    # ...and while the event loop runs this late (a saturated CPU) new reads are refused the
    # same way (0: off).
    reads_max_loop_lag_ms: int = 20
    # Prefetch packets: cache lifetime, character budget and the walk's limits.
    packet_ttl_s: int = 600
    packet_default_chars: int = 4_000
    packet_max_chars: int = 32_000
    # Room for the framing, the longest session echo and a withheld note.
    packet_min_chars: int = 600
    half_life_days: float = 30.0
    # Trust over time (memsvc.governance.trust): confidence half-life in days per category,
    # over the defaults (preference 180, profile 365, relationship 365, goal 90, event 30,
    # context 60); a category without one uses context's.
    confidence_half_life_days: tuple[tuple[str, float], ...] = ()
    # Reads record the memories they return; a background task writes last_referenced_at in
    # one batched UPDATE every interval. Beyond max_pending ids a record is dropped (counted).
    references_flush_interval_ms: int = 1_000
    references_max_pending: int = 100_000
    # An id referenced again within this many seconds is not written again.
    references_min_interval_s: float = 60.0
    # Core memory (pinned + core-role facts of one scope): at most this many characters of
    # content for the human block (no persona) and a persona block; 0 means no limit. A write
    # that overflows compacts the block (memsvc.memories.compaction).
    core_human_max_chars: int = 2_000
    core_persona_max_chars: int = 2_000
    # With the openai extractor, how long the summarizing call may take before compaction
    # falls back to demotion.
    core_compaction_timeout_ms: int = 5_000
    prefetch_topics: int = 8
    prefetch_episodes: int = 8
    prefetch_facts: int = 40
    # Facts taken directly (best hint matches, or most recent without a hint) besides the
    # walk's; few, because the section orders by role before relevance.
    prefetch_direct_facts: int = 10
    # After a cache failure, skip Redis for this long (answers say BYPASSED).
    cache_retry_after_ms: int = 1_000
    # TEST ONLY, never read from the environment: a server-side pg_sleep run before the SQL
    # of a read stage ("dense", "lexical", "prefetch_core", "prefetch_relevant"), so tests
    # can slow a leg for real. Empty in every real configuration.
    debug_stage_delays_ms: tuple[tuple[str, int], ...] = ()

    # Observability: Prometheus text on http://metrics_host:metrics_port/metrics (None: off;
    # 0: any free port, read back from the server), and the log line format (text or json).
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = 9464
    log_format: str = "text"

    # Transport security. Certificate paths are read at start; plaintext on an address that is
    # not loopback is refused unless allow_plaintext (TLS terminated in front of memsvc).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    tls_require_client_cert: bool = False
    allow_plaintext: bool = False

    # Per-tenant admission after authentication, so one tenant cannot starve another: a token
    # bucket (rate 0: off; burst 0: one second's worth) and a cap on calls in flight (0: off).
    tenant_rate_per_s: float = 0.0
    tenant_burst: int = 0
    tenant_max_in_flight: int = 0
    # Largest serialized request answered INVALID_ARGUMENT with its size; gRPC itself drops
    # anything over twice this before memsvc reads it (RESOURCE_EXHAUSTED).
    max_request_bytes: int = 4 * 1024 * 1024
    # ExportMemories: rows per cursor batch; streams at once per process (each holds one
    # connection and one snapshot while it streams); deadline of a call that sets none.
    export_batch_rows: int = 500
    export_max_in_flight: int = 2
    export_default_deadline_s: int = 600

    # Governance defaults; a tenant overrides them with `memsvc tenants set`.
    # PII screening: a default action then per-kind ones ("redact,email=store").
    pii_policy: str = "redact"
    # Regions whose national phone formats the PII screen knows; +international always.
    pii_phone_regions: tuple[str, ...] = ("US", "GB")
    # Stored messages (the conversation history) expire after this many days; 0: never.
    message_ttl_days: int = 90
    # Retention: a SESSION memory is deleted when its session ends, or after this at the
    # latest; the expiry task runs every interval (jittered) in each worker process and
    # deletes at most `expiry_batch` rows per statement.
    session_retention_s: int = 86_400
    expiry_interval_s: float = 60.0
    expiry_batch: int = 500
    # How long a process trusts its copy of a tenant's settings.
    tenant_settings_cache_s: float = 5.0

    # Used when a write RPC arrives without a deadline: writes are bounded too.
    default_write_deadline_ms: int = 5_000
    # Kept back from a call's deadline to serialize and send the answer.
    deadline_margin_ms: int = 10
    shutdown_grace_s: float = 10.0

    @property
    def message_ttl_s(self) -> int:
        return self.message_ttl_days * 86_400

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields replaced (CLI flags win over the environment)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read MEMSVC_* variables; unknown values fail loudly at start-up."""
        values: dict[str, Any] = {}

        def get(name: str) -> str | None:
            raw = env.get(f"MEMSVC_{name}")
            return raw if raw not in (None, "") else None

        str_fields = {
            "GRPC_HOST": "grpc_host",
            "PG_DSN": "pg_dsn",
            "REDIS_URL": "redis_url",
            "DEFAULT_TENANT": "default_tenant",
            "EMBEDDER": "embedder",
            "OPENAI_BASE_URL": "openai_base_url",
            "OPENAI_EMBEDDING_MODEL": "openai_embedding_model",
            "OPENAI_API_KEY": "openai_api_key",
            "EXTRACTOR": "extractor",
            "OPENAI_CHAT_BASE_URL": "openai_chat_base_url",
            "OPENAI_CHAT_MODEL": "openai_chat_model",
            "OPENAI_CHAT_API_KEY": "openai_chat_api_key",
            "USER_ID_PATTERN": "user_id_pattern",
            "METRICS_HOST": "metrics_host",
            "LOG_FORMAT": "log_format",
            "PII_POLICY": "pii_policy",
        }
        for env_name, attr in str_fields.items():
            raw = get(env_name)
            if raw is not None:
                values[attr] = raw
        int_fields = {
            "GRPC_PORT": "grpc_port",
            "PG_POOL_MIN": "pg_pool_min",
            "PG_POOL_MAX": "pg_pool_max",
            "PG_COMMAND_TIMEOUT_MS": "pg_command_timeout_ms",
            "PG_ACQUIRE_TIMEOUT_MS": "pg_acquire_timeout_ms",
            "REDIS_TIMEOUT_MS": "redis_timeout_ms",
            "EMBEDDING_DIM": "embedding_dim",
            "ONNX_INTRA_OP_THREADS": "onnx_intra_op_threads",
            "EMBED_TIMEOUT_MS": "embed_timeout_ms",
            "MAX_CONTENT_CHARS": "max_content_chars",
            "MAX_PAGE_SIZE": "max_page_size",
            "DEADLINE_MARGIN_MS": "deadline_margin_ms",
            "RECALL_DEFAULT_DEADLINE_MS": "recall_default_deadline_ms",
            "PREFETCH_DEFAULT_DEADLINE_MS": "prefetch_default_deadline_ms",
            "RECALL_CANDIDATES": "recall_candidates",
            "RRF_K": "rrf_k",
            "DENSE_EXACT_MAX_ROWS": "dense_exact_max_rows",
            "QUERY_EMBED_CACHE_SIZE": "query_embed_cache_size",
            "READS_MAX_IN_FLIGHT": "reads_max_in_flight",
            "READS_MAX_LOOP_LAG_MS": "reads_max_loop_lag_ms",
            "PACKET_TTL_S": "packet_ttl_s",
            "PACKET_DEFAULT_CHARS": "packet_default_chars",
            "PREFETCH_TOPICS": "prefetch_topics",
            "PREFETCH_EPISODES": "prefetch_episodes",
            "PREFETCH_FACTS": "prefetch_facts",
            "PREFETCH_DIRECT_FACTS": "prefetch_direct_facts",
            "CACHE_RETRY_AFTER_MS": "cache_retry_after_ms",
            "MAX_MESSAGES_PER_INGEST": "max_messages_per_ingest",
            "MAX_MESSAGE_CHARS": "max_message_chars",
            "EXTRACTOR_TIMEOUT_MS": "extractor_timeout_ms",
            "MAX_FACTS_PER_EPISODE": "max_facts_per_episode",
            "DAILY_FACT_QUOTA": "daily_fact_quota",
            "WORKER_CONCURRENCY": "worker_concurrency",
            "WORKER_MAX_ATTEMPTS": "worker_max_attempts",
            "TENANT_BURST": "tenant_burst",
            "TENANT_MAX_IN_FLIGHT": "tenant_max_in_flight",
            "EXPORT_BATCH_ROWS": "export_batch_rows",
            "EXPORT_MAX_IN_FLIGHT": "export_max_in_flight",
            "EXPORT_DEFAULT_DEADLINE_S": "export_default_deadline_s",
            "MAX_REQUEST_BYTES": "max_request_bytes",
            "REFERENCES_FLUSH_INTERVAL_MS": "references_flush_interval_ms",
            "REFERENCES_MAX_PENDING": "references_max_pending",
            "CORE_HUMAN_MAX_CHARS": "core_human_max_chars",
            "CORE_PERSONA_MAX_CHARS": "core_persona_max_chars",
            "CORE_COMPACTION_TIMEOUT_MS": "core_compaction_timeout_ms",
            "MESSAGE_TTL_DAYS": "message_ttl_days",
            "SESSION_RETENTION_S": "session_retention_s",
            "EXPIRY_BATCH": "expiry_batch",
        }
        for env_name, attr in int_fields.items():
            raw = get(env_name)
            if raw is not None:
                values[attr] = _parse_int(f"MEMSVC_{env_name}", raw)
        float_fields = {
            "CONFIDENCE_FLOOR": "confidence_floor",
            "DEDUP_UPPER": "dedup_upper",
            "DEDUP_LOWER": "dedup_lower",
            "RRF_DENSE_WEIGHT": "rrf_dense_weight",
            "RRF_LEXICAL_WEIGHT": "rrf_lexical_weight",
            "WORKER_LEASE_S": "worker_lease_s",
            "WORKER_JOB_TIMEOUT_S": "worker_job_timeout_s",
            "WORKER_BACKOFF_BASE_S": "worker_backoff_base_s",
            "WORKER_SWEEP_INTERVAL_S": "worker_sweep_interval_s",
            "RECONCILE_INTERVAL_S": "reconcile_interval_s",
            "WORKER_EMBED_TIMEOUT_S": "worker_embed_timeout_s",
            "HALF_LIFE_DAYS": "half_life_days",
            "TENANT_RATE_PER_S": "tenant_rate_per_s",
            "TENANT_SETTINGS_CACHE_S": "tenant_settings_cache_s",
            "EXPIRY_INTERVAL_S": "expiry_interval_s",
            "READS_QUEUE_SHARE": "reads_queue_share",
            "REFERENCES_MIN_INTERVAL_S": "references_min_interval_s",
        }
        for env_name, attr in float_fields.items():
            raw = get(env_name)
            if raw is not None:
                values[attr] = _parse_float(f"MEMSVC_{env_name}", raw)
        if (raw := get("RUN_WORKERS")) is not None:
            values["run_workers"] = parse_bool("MEMSVC_RUN_WORKERS", raw)
        if (raw := get("AUTH_ENABLED")) is not None:
            values["auth_enabled"] = parse_bool("MEMSVC_AUTH_ENABLED", raw)
        if (raw := get("ROUTING")) is not None:
            values["routing"] = parse_bool("MEMSVC_ROUTING", raw)
        for env_name, attr in (
            ("TLS_CERT_FILE", "tls_cert_file"),
            ("TLS_KEY_FILE", "tls_key_file"),
            ("TLS_CLIENT_CA_FILE", "tls_client_ca_file"),
        ):
            if (raw := get(env_name)) is not None:
                values[attr] = Path(raw)
        for env_name, attr in (
            ("TLS_REQUIRE_CLIENT_CERT", "tls_require_client_cert"),
            ("ALLOW_PLAINTEXT", "allow_plaintext"),
        ):
            if (raw := get(env_name)) is not None:
                values[attr] = parse_bool(f"MEMSVC_{env_name}", raw)
        if (raw := get("METRICS_PORT")) is not None:
            values["metrics_port"] = _parse_port("MEMSVC_METRICS_PORT", raw)
        if (raw := get("DATA_DIR")) is not None:
            values["data_dir"] = Path(raw)
        if (raw := get("SHUTDOWN_GRACE_S")) is not None:
            values["shutdown_grace_s"] = float(_parse_int("MEMSVC_SHUTDOWN_GRACE_S", raw))
        if (raw := get("CATEGORIES")) is not None:
            values["categories"] = _parse_csv(raw)
        if (raw := get("ROLES")) is not None:
            values["roles"] = _parse_csv(raw)
        if (raw := get("PII_PHONE_REGIONS")) is not None:
            values["pii_phone_regions"] = tuple(r.upper() for r in _parse_csv(raw))
        if (raw := get("CONFIDENCE_HALF_LIFE_DAYS")) is not None:
            values["confidence_half_life_days"] = _parse_half_lives(raw)
        if "pg_pool_max" in values and "pg_pool_min" not in values:
            # A smaller pool asked for without a minimum: still all opened at start-up.
            values["pg_pool_min"] = min(cls.pg_pool_min, values["pg_pool_max"])
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Reject combinations that cannot work, with a message naming the setting."""
        if not self.categories:
            raise ConfigError("MEMSVC_CATEGORIES: at least one category is required")
        if not self.roles:
            raise ConfigError("MEMSVC_ROLES: at least one role is required")
        if "context" not in self.categories or "context" not in self.roles:
            raise ConfigError("the category and role vocabularies must include 'context'")
        if self.embedder not in ("onnx", "openai"):
            raise ConfigError(f"MEMSVC_EMBEDDER: expected onnx or openai, got {self.embedder!r}")
        if self.extractor not in ("rules", "openai"):
            raise ConfigError(f"MEMSVC_EXTRACTOR: expected rules or openai, got {self.extractor!r}")
        if not 0 <= self.dedup_lower <= self.dedup_upper <= 1:
            raise ConfigError("MEMSVC_DEDUP_LOWER <= MEMSVC_DEDUP_UPPER, both within 0..1")
        if self.worker_job_timeout_s >= self.worker_lease_s:
            raise ConfigError("MEMSVC_WORKER_JOB_TIMEOUT_S must be shorter than the lease")
        try:
            re.compile(self.user_id_pattern)
        except re.error as exc:
            raise ConfigError(f"MEMSVC_USER_ID_PATTERN: not a regular expression ({exc})") from None
        if self.pg_pool_min > self.pg_pool_max:
            raise ConfigError("MEMSVC_PG_POOL_MIN must not exceed MEMSVC_PG_POOL_MAX")
        if self.rrf_k < 1:
            raise ConfigError("MEMSVC_RRF_K must be at least 1")
        if self.half_life_days <= 0:
            raise ConfigError("MEMSVC_HALF_LIFE_DAYS must be positive")
        for category, days in self.confidence_half_life_days:
            if category not in self.categories:
                raise ConfigError(
                    f"MEMSVC_CONFIDENCE_HALF_LIFE_DAYS: unknown category {category!r} "
                    f"(categories: {', '.join(self.categories)})"
                )
            if not 0 < days < float("inf"):
                raise ConfigError(
                    f"MEMSVC_CONFIDENCE_HALF_LIFE_DAYS: {category} must be a positive number "
                    "of days"
                )
        if not 0 < self.reads_queue_share <= 1:
            raise ConfigError(
                f"MEMSVC_READS_QUEUE_SHARE must be in (0, 1], got {self.reads_queue_share}"
            )
        if self.references_flush_interval_ms < 10 or self.references_max_pending < 1:
            raise ConfigError(
                "MEMSVC_REFERENCES_FLUSH_INTERVAL_MS must be at least 10 and "
                "MEMSVC_REFERENCES_MAX_PENDING at least 1"
            )
        if not self.packet_min_chars <= self.packet_default_chars <= self.packet_max_chars:
            raise ConfigError(
                f"MEMSVC_PACKET_DEFAULT_CHARS must be within {self.packet_min_chars}.."
                f"{self.packet_max_chars}"
            )
        try:
            parse_pii_policy(self.pii_policy)
        except PolicyError as exc:
            raise ConfigError(f"MEMSVC_PII_POLICY: {exc}") from None
        if unknown := unknown_phone_regions(self.pii_phone_regions):
            raise ConfigError(
                f"MEMSVC_PII_PHONE_REGIONS: unknown region(s) {', '.join(unknown)}; expected "
                "ISO 3166 codes such as US, GB, DE"
            )
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"MEMSVC_LOG_FORMAT: expected text or json, got {self.log_format!r}")
        if self.max_request_bytes < 1024:
            raise ConfigError("MEMSVC_MAX_REQUEST_BYTES must be at least 1024")
        if self.session_retention_s < 1 or self.expiry_batch < 1:
            raise ConfigError(
                "MEMSVC_SESSION_RETENTION_S and MEMSVC_EXPIRY_BATCH must be at least 1"
            )
        if self.expiry_interval_s <= 0:
            raise ConfigError("MEMSVC_EXPIRY_INTERVAL_S must be positive")
        for name in ("export_batch_rows", "export_max_in_flight", "export_default_deadline_s"):
            if getattr(self, name) < 1:
                raise ConfigError(f"MEMSVC_{name.upper()} must be at least 1")
        for name in ("recall_default_deadline_ms", "prefetch_default_deadline_ms"):
            if getattr(self, name) <= self.deadline_margin_ms:
                raise ConfigError(f"MEMSVC_{name.upper()} must exceed MEMSVC_DEADLINE_MARGIN_MS")
