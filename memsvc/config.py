"""Settings: the environment and CLI flags, read once into a frozen object passed explicitly."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CATEGORIES = ("preference", "profile", "relationship", "goal", "event", "context")
DEFAULT_ROLES = ("core", "context", "detail", "temporal", "causal")
ENV_PREFIX = "MEMSVC_"
# Background work (workers, reconcile, expiry) waits this long for a pooled connection; the
# default of MEMSVC_WORKER_ACQUIRE_TIMEOUT_MS and of the settings objects built without one.
WORKER_ACQUIRE_TIMEOUT_S = 10.0
# Serving processes of one `memsvc serve`: each holds its own pools, so more than a machine's
# cores only adds PostgreSQL connections and memory.
MAX_PROCESSES = 64

# Hand-written for now: pydantic-settings (pydantic is already installed, through spaCy)
# would replace these parsers and the per-field variable derivation; kept until Settings,
# a frozen dataclass every layer takes, moves to it in one change with its tests.
# Reads one variable's text: (variable name for the error message, raw value) -> value.
Parse = Callable[[str, str], Any]


class ConfigError(ValueError):
    """A setting has a value memsvc cannot use."""


def env_name(field_name: str) -> str:
    """The environment variable of a Settings field: MEMSVC_ and the name in capitals."""
    return ENV_PREFIX + field_name.upper()


def parse_bool(name: str, raw: str) -> bool:
    """Strict boolean parsing: 'false' is false, and a typo is an error, not 'true'."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}: expected true/false/1/0/yes/no/on/off, got {raw!r}")


_INTEGER = re.compile(r"-?[0-9]+")


def _parse_int(name: str, raw: str) -> int:
    # Stricter than int(): no "1_000", no "+5", no "٣" (Unicode digits).
    if not _INTEGER.fullmatch(raw.strip()):
        raise ConfigError(f"{name}: expected an integer, got {raw!r}")
    value = int(raw)
    if value < 0:
        raise ConfigError(f"{name}: must be >= 0, got {value}")
    return value


def _parse_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected a number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name}: must be a finite non-negative number, got {raw!r}")
    return value


def _parse_str(name: str, raw: str) -> str:
    return raw


def _parse_path(name: str, raw: str) -> Path:
    return Path(raw)


def _parse_port(name: str, raw: str) -> int:
    """A TCP port; 0 picks a free one."""
    port = _parse_int(name, raw)
    if port > 65535:
        raise ConfigError(f"{name}: a port is at most 65535, got {port}")
    return port


def _parse_port_or_off(name: str, raw: str) -> int | None:
    """A TCP port, or "off": no listener."""
    return None if raw.strip().lower() == "off" else _parse_port(name, raw)


def _parse_words(name: str, raw: str) -> tuple[str, ...]:
    """Comma-separated, lower-cased: a vocabulary ("preference, Goal" -> preference, goal)."""
    return tuple(part.strip().lower() for part in raw.split(",") if part.strip())


def _parse_region_codes(name: str, raw: str) -> tuple[str, ...]:
    """Comma-separated ISO 3166 codes, upper-cased (checked where the PII screen is built)."""
    return tuple(word.upper() for word in _parse_words(name, raw))


def _parse_half_lives(name: str, raw: str) -> tuple[tuple[str, float], ...]:
    """ "preference=180,event=30" (categories are checked against the vocabulary later)."""
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
        if not 0 < days < math.inf:
            raise ConfigError(f"{name}: {category} must be a positive number of days")
        pairs[category] = days
    return tuple(pairs.items())


# How a field's annotation is read from the environment, unless the field names its own.
_PARSERS: dict[object, Parse] = {
    str: _parse_str,
    str | None: _parse_str,
    int: _parse_int,
    float: _parse_float,
    bool: parse_bool,
    Path: _parse_path,
    Path | None: _parse_path,
    tuple[str, ...]: _parse_words,
}


# (lower, upper): a lower value left unset follows an upper one set below it, so a smaller
# pool is still all opened at start-up, and a smaller page or top_k limit is still a valid one.
_FOLLOWS = (
    ("pg_pool_min", "pg_pool_max"),
    ("default_page_size", "max_page_size"),
    ("recall_default_top_k", "recall_max_top_k"),
    ("packet_default_chars", "packet_max_chars"),
)


def setting(default: Any, help: str, *, parse: Parse | None = None, secret: bool = False) -> Any:
    """A Settings field: its default, its description (docs/reference/configuration.md) and, for
    a value its type alone does not say how to read, its parser. A secret stays out of repr."""
    return field(default=default, repr=not secret, metadata={"help": help, "parse": parse})


@dataclass(frozen=True)
class Settings:
    """Everything memsvc can be configured with; units are in the names. Each field is set by
    the environment variable env_name(field) (MEMSVC_GRPC_PORT sets grpc_port)."""

    grpc_host: str = setting("127.0.0.1", "gRPC bind address")
    grpc_port: int = setting(50051, "gRPC port (`0`: any free port)", parse=_parse_port)
    # None means "start the embedded servers" (memsvc dev) or "required" (memsvc serve).
    pg_dsn: str | None = setting(
        None,
        "PostgreSQL with pgvector and pg_trgm; embedded in `memsvc dev`, required by "
        "`memsvc serve`",
        secret=True,
    )
    redis_url: str | None = setting(
        None,
        "Redis-protocol server for the packet cache; embedded in `memsvc dev`, required by "
        "`memsvc serve`",
        secret=True,
    )
    # RUF009: setting() is dataclasses.field() with a description, not a shared default.
    data_dir: Path = setting(Path(".memsvc"), "data folder of `memsvc dev`")  # noqa: RUF009

    auth_enabled: bool = setting(
        True,
        "require an API key per call (`memsvc dev`: off unless this is set or `--auth` is given)",
    )
    default_tenant: str = setting("dev", "tenant of every call when authentication is off")
    auth_unknown_lookups_per_s: float = setting(
        20.0,
        "database lookups per second, per process, of keys its key directory does not know "
        "(past it such a key is refused without one; `0`: no limit)",
    )
    auth_unknown_cache_size: int = setting(
        10_000, "unknown keys remembered per process (5 s each), apart from the known ones"
    )

    # Every connection opened at start-up: one opened under load costs that moment about
    # 8 ms to connect and 8 ms more on its first queries (a new backend's cold caches).
    pg_pool_min: int = setting(
        20,
        "connections opened at start-up (follows a smaller `MEMSVC_PG_POOL_MAX` when unset): "
        "one opened under load costs that moment about 16 ms",
    )
    pg_pool_max: int = setting(20, "largest connection pool")
    pg_command_timeout_ms: int = setting(5_000, "bound on any single statement")
    pg_acquire_timeout_ms: int = setting(
        1_000, "wait for a free connection before `RESOURCE_EXHAUSTED`"
    )
    redis_timeout_ms: int = setting(
        50, "bound on any cache operation (cache failures never fail a call)"
    )

    embedder: str = setting(
        "onnx",
        "`onnx` (all-MiniLM-L6-v2, int8 products, offline) or `openai` (any `/v1/embeddings`)",
    )
    embedding_dim: int = setting(384, "vector dimension; fixed per database")
    onnx_intra_op_threads: int = setting(1, "onnxruntime threads per inference")
    openai_base_url: str = setting("https://api.openai.com", "the `openai` embedder's endpoint")
    openai_embedding_model: str = setting("text-embedding-3-small", "the `openai` embedder's model")
    openai_api_key: str = setting("", "the `openai` embedder's API key", secret=True)
    embed_timeout_ms: int = setting(2_000, "bound on one embedding call")

    categories: tuple[str, ...] = setting(
        DEFAULT_CATEGORIES, "closed category vocabulary (must include `context`)"
    )
    roles: tuple[str, ...] = setting(
        DEFAULT_ROLES,
        "closed role vocabulary (must include `context`; the first is the core role)",
    )
    max_content_chars: int = setting(2_000, "longest memory text")
    max_id_chars: int = setting(128, "longest id (user, agent, session, memory, message…)")
    max_reason_chars: int = setting(500, "longest reason of a Correct")
    max_source_ids: int = setting(100, "source message ids per memory")
    max_forget_ids: int = setting(1_000, "memory ids per Forget call")
    max_page_size: int = setting(500, "largest ListMemories page")
    default_page_size: int = setting(50, "ListMemories page when the request sets none")

    # Write path: Ingest limits, extraction and the workers.
    max_messages_per_ingest: int = setting(200, "messages per Ingest call")
    max_message_chars: int = setting(8_000, "longest Ingest message")
    max_ingest_chars: int = setting(
        64_000,
        "characters of all the messages of one Ingest, the size budget of its extraction job "
        "(parsed well inside `MEMSVC_WORKER_JOB_TIMEOUT_S` on a busy core); beyond, "
        "`INVALID_ARGUMENT`: split the messages over several Ingests",
    )
    max_goals: int = setting(20, "goals per Ingest call")
    extractor: str = setting("rules", "`rules` (offline, deterministic) or `openai`")
    openai_chat_base_url: str = setting(
        "https://api.openai.com", "the `openai` extractor's endpoint"
    )
    openai_chat_model: str = setting("gpt-4o-mini", "the `openai` extractor's model")
    openai_chat_api_key: str = setting("", "the `openai` extractor's API key", secret=True)
    extractor_timeout_ms: int = setting(20_000, "bound on one extractor call")
    # Only USER-role senders whose id matches accrue memories (bots, system ids excluded).
    user_id_pattern: str = setting(
        r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}",
        "sender ids that accrue memories (a regular expression)",
    )
    confidence_floor: float = setting(0.5, "extracted candidates below are dropped")
    dedup_upper: float = setting(
        0.92, "cosine at or above which a candidate is a stored fact said again (reinforced)"
    )
    dedup_lower: float = setting(
        0.75, "cosine below which a candidate is a new fact; between the two, the extractor decides"
    )
    max_facts_per_episode: int = setting(50, "extracted facts per speaker and job")
    daily_fact_quota: int = setting(200, "new extracted memories per user per day")
    processes: int = setting(
        1,
        "serving processes on the gRPC port (`serve`/`dev --processes`): each has its own "
        "pools and embedder; the first also runs the workers and the packet warmer",
    )
    run_workers: bool = setting(True, "run extraction workers inside `serve`/`dev`")
    worker_concurrency: int = setting(2, "extraction jobs at once per process")
    worker_max_jobs_per_tenant: int = setting(
        2,
        "extraction jobs one tenant may have running at once over every worker; due jobs are "
        "claimed tenant by tenant, fewest running first (`0`: no cap)",
    )
    worker_reserved_slots: int = setting(
        1,
        "slots of each worker (of `MEMSVC_WORKER_CONCURRENCY`, all but one at most) kept for "
        "tenants with no job running, so another tenant's job starts at once however busy one "
        "tenant keeps the workers (`0`: none)",
    )
    worker_lease_s: float = setting(120.0, "lease of a job a worker took")
    worker_job_timeout_s: float = setting(90.0, "bound on one job (shorter than the lease)")
    worker_max_attempts: int = setting(5, "attempts before a job is `dead`")
    worker_acquire_timeout_ms: int = setting(
        int(WORKER_ACQUIRE_TIMEOUT_S * 1000),
        "how long background work (workers, reconcile, expiry) waits for a pooled connection;"
        " longer than a call's, so a busy pool does not use up a job's attempt",
    )
    worker_backoff_base_s: float = setting(2.0, "base of the retry backoff (exponential, jittered)")
    worker_sweep_interval_s: float = setting(15.0, "how often workers look for due jobs")
    reconcile_interval_s: float = setting(
        60.0, "how often workers re-embed stale rows and report the outbox depth"
    )
    # Workers embed in batches at low priority: a busy machine must not turn that into
    # unembedded messages (the online embed_timeout_ms is for one query).
    worker_embed_timeout_s: float = setting(30.0, "bound on one background embedding batch")

    # Read path: Recall and Prefetch. No deadline on the call -> these defaults.
    recall_default_deadline_ms: int = setting(800, "Recall budget when the call has no deadline")
    prefetch_default_deadline_ms: int = setting(
        200, "Prefetch budget when the call has no deadline"
    )
    recall_default_top_k: int = setting(10, "Recall results when the request sets no `top_k`")
    recall_max_top_k: int = setting(100, "largest `top_k` of a Recall")
    # Calibrated on the LoCoMo dev split with all-MiniLM-L6-v2 (bench/locomo_eval.py
    # --min-scores, hybrid, messages): 0.2 keeps R@10 at 77.8 (77.9 without a minimum; 0.25:
    # 77.1, 0.3: 76.6) and 80% of unrelated questions get no items (0.25: 93%, 0.3: 96%); 1% of
    # evidence items score below 0.23. Another embedding model has another cosine scale.
    recall_min_relevance: float = setting(
        0.2,
        "Recall's default minimum relevance (cosine similarity to the query, 0..1), when "
        "`filters.min_score` is unset: an answer whose 10 best items hold a fact or message "
        "reaching it comes back as ranked, otherwise each item needs its kind's minimum, so an "
        "unrelated question gets no items; 0: no minimum",
    )
    recall_min_relevance_episode: float = setting(
        0.05,
        "the same default for episodes (summaries of a whole conversation sit further from "
        "any one question than a fact does); a caller's `min_score` applies to every kind",
    )
    # Measured on the LoCoMo dev split (bench/locomo_eval.py --deadline-ms 200): the lexical
    # leg's best match held every word of 34% of the questions; answering those from the
    # lexical leg alone moved hybrid R@10 from 80.4 to 80.2 (per conversation -2.1..+0.9).
    recall_embed_admit_share: float = setting(
        0.5,
        "on arrival, a Recall whose query embedding is expected to wait in the embedder's "
        "queue longer than this share of its budget answers from the lexical leg alone "
        "(`degraded`, missing `embed` and `dense`) instead of late",
    )
    recall_answer_headroom: float = setting(
        0.25,
        "share of a Recall's budget its legs leave unused: a leg still running then is "
        "stopped, so the answer has time to leave and reach the caller on a saturated machine "
        "(where a serving process can be off its core for tens of ms)",
    )
    recall_lexical_enough_below_ms: int = setting(
        400,
        "Recall deadlines up to this long (voice) do not wait for the query embedding and "
        "the dense leg when the lexical leg's best match holds every word of the query "
        "(the answer lists them in `skipped_legs`); 0: always wait for both legs",
    )
    max_query_chars: int = setting(2_000, "longest Recall query or Prefetch hint")
    # A transcriber sends an interim every 100-300 ms; each costs a Recall's CPU ahead.
    recall_stream_interims_per_s: float = setting(
        10.0,
        "interim transcripts one RecallStream may send per second (bursts of one second's "
        "worth) that are worked ahead; beyond, an interim is not worked ahead (counted in "
        '`memsvc_recall_ahead_total{outcome="over_rate"}`; the final is still answered)',
    )
    recall_candidates: int = setting(50, "candidates per leg before fusion (at least `top_k`)")
    # Measured on the LoCoMo dev split (turn-level R@10, bench/locomo_eval.py): plain RRF at
    # k=60 fused below the lexical leg alone (67.8 vs 75.2); k=10 with the dense leg at half
    # weight gives 77.4, on a plateau (k 5-20, dense weight 0.3-0.5: 76.2-77.5) rather than
    # an edge (k=60 beats lexical only for dense weight <= 0.2, and falls below at 0.3).
    # Re-checked with speaker units (bench/locomo_loo.py, each dev conversation left out in
    # turn): these defaults 80.4, left-one-out mean 80.3, per conversation 75.9..84.6.
    rrf_k: int = setting(10, "Reciprocal Rank Fusion constant (score = weight / (k + rank))")
    rrf_dense_weight: float = setting(0.5, "fusion weight of the dense leg")
    rrf_lexical_weight: float = setting(1.0, "fusion weight of the lexical leg")
    # On raised LoCoMo dev R@10 77.4 -> 78.1 (no category lower).
    routing: bool = setting(
        True,
        "query routing: a temporal query favours items from the dates it names and, asking "
        '"when", items that say when (off: the route is reported, neutral)',
    )
    # The lexical leg alone on the development sets, the same rows and context index either
    # way (a scratch A/B calling the leg's SQL, 2026-12-07, this 2-core machine under load):
    # LoCoMo R@10 without names 68.6 -> 76.6, with names 76.3 -> 77.5; RealMem session R@10
    # (no names) 50.6 -> 54.9. Its cost, the leg alone: LoCoMo p50 9.6 -> 16.4 ms, p99 17.4
    # -> 30.8 ms; RealMem (long assistant turns, 1,400 messages a user) p50 51 -> 130 ms.
    # A full BM25F over the same weighted index (tf saturation, length normalisation) scored
    # 76.0 / 76.4 / 56.1 but needs the positions unnested per row in SQL (10x slower);
    # pg_textsearch's `<@>` scored LoCoMo with names 75.2-77.3 at 7x the per-row cost, with
    # table-wide statistics. Off by default until it is as fast: on RealMem-sized scopes the
    # leg's p99 (511 ms) passes a voice turn's 200 ms budget, and issue 30 holds Recall's
    # p50/p99 to today's.
    lexical_idf: bool = setting(
        False,
        "lexical leg: weigh each query word by its inverse document frequency among the "
        "scope's own rows (BM25's IDF; better ranking, 1.7-2.6x the leg's time); off: one "
        "ts_rank for the whole query",
    )
    dense_exact_max_rows: int = setting(
        2_000,
        "a user with at most this many rows in a table gets exact nearest neighbours; above, "
        "HNSW with iterative scan",
    )
    query_embed_cache_size: int = setting(
        4_096,
        "query embeddings kept in the in-process LRU (keyed by tenant: a tenant never hits"
        " another's entry, whose speed would tell it the text was asked)",
    )
    reads_max_in_flight: int = setting(
        32, "concurrent Recall + Prefetch per process; beyond, `RESOURCE_EXHAUSTED` at once"
    )
    reads_queue_share: float = setting(
        0.4,
        "a read expected to take more than this share of its budget, given the reads ahead "
        "of it and how long recent reads took, gets `RESOURCE_EXHAUSTED` at once",
    )
    reads_max_loop_lag_ms: int = setting(
        20,
        "while the event loop stays this late (a saturated CPU), new reads get "
        "`RESOURCE_EXHAUSTED` at once (`0`: off)",
    )
    reads_degrade_queue_ms: int = setting(
        20,
        "while the oldest call waiting in gRPC's queue for a handler has waited longer than "
        "this (the serving loop is saturated), Recall answers without embedding its query "
        "(`degraded`, the cheapest answer), so the queue drains before anyone is refused "
        "(`0`: off; see docs/read-path.md, overload)",
    )
    reads_max_queue_ms: int = setting(
        100,
        "while the oldest call waiting in gRPC's queue for a handler has waited longer than "
        "this, reads get `RESOURCE_EXHAUSTED` at once: the calls that waited that long are "
        "refused at a fraction of an answer's cost until the queue is short again, so none "
        "waits past its deadline there (`0`: off; see docs/read-path.md, overload)",
    )
    reads_max_cpu_busy: float = setting(
        0.9,
        "while the machine's CPUs (all of them, whoever uses them) are busier than this "
        "share, Recall answers without its query embedding (`degraded`) and each process "
        "admits fewer reads at a time (`RESOURCE_EXHAUSTED`), so answers leave in time "
        "(`0`: off)",
    )
    packet_ttl_s: int = setting(600, "lifetime of a cached Prefetch packet")
    # Packet warming (prefetch/warmer.py): after a change, rebuild the hint-less packets the
    # user asked for lately, so the next call setup is a cache hit.
    prefetch_warm: bool = setting(
        True,
        "after a write changes a user's memories, rebuild their recently requested hint-less "
        "Prefetch packets in the background (off: the next Prefetch builds it)",
    )
    prefetch_warm_delay_ms: int = setting(
        100, "warming waits this long after a user's last change (a burst rebuilds once)"
    )
    prefetch_warm_ttl_s: int = setting(
        86_400, "a hint-less packet shape requested within this long is kept warm"
    )
    prefetch_warm_budget_ms: int = setting(2_000, "time budget of one background rebuild")
    prefetch_warm_concurrency: int = setting(2, "background rebuilds at once per process")
    packet_default_chars: int = setting(
        4_000, "packet budget when the request sets none (within the min..max below)"
    )
    packet_max_chars: int = setting(32_000, "largest packet budget a request may ask for")
    # Room for the framing, the longest session echo and a withheld note.
    packet_min_chars: int = setting(600, "smallest packet budget a request may ask for")
    half_life_days: float = setting(
        30.0, "recency half-life of the Prefetch walk and of Recall's ordering"
    )
    confidence_half_life_days: tuple[tuple[str, float], ...] = setting(
        (),
        "confidence half-life per category, `category=days,…`, over preference=180, "
        "profile=365, relationship=365, goal=90, event=30, context=60 (an unlisted custom "
        "category uses `context`'s)",
        parse=_parse_half_lives,
    )
    references_flush_interval_ms: int = setting(
        1_000, "`last_referenced_at`: how often the batched upsert runs"
    )
    references_max_pending: int = setting(
        100_000, "`last_referenced_at`: ids waiting for the upsert (beyond: dropped, counted)"
    )
    references_min_interval_s: float = setting(
        60.0, "`last_referenced_at`: an id referenced again within this long is not written again"
    )
    human_block_max_chars: int = setting(
        2_000,
        "human core block limit in characters, its written text and its core facts together "
        "(`0`: none; a tenant may override it: `memsvc tenants set --human-block-chars`)",
    )
    persona_block_max_chars: int = setting(
        2_000,
        "persona core block limit in characters (`0`: none; a tenant may override it: "
        "`memsvc tenants set --persona-block-chars`)",
    )
    core_compaction_timeout_ms: int = setting(
        5_000,
        "with the `openai` extractor, bound on the summarizing call before compaction falls "
        "back to demotion",
    )
    prefetch_topics: int = setting(8, "topics the Prefetch walk visits")
    prefetch_episodes: int = setting(8, "episodes the Prefetch walk visits")
    session_idle_s: int = setting(
        1_800,
        "a session not ended by Ingest `end_of_session` counts as finished once its last "
        "message is this old; until then Prefetch lists none of its episodes as an earlier "
        "conversation",
    )
    prefetch_facts: int = setting(40, "facts the Prefetch walk collects")
    # Few, because the section orders by role before relevance.
    prefetch_direct_facts: int = setting(
        10, "facts Prefetch takes directly (best hint matches, or most recent without a hint)"
    )
    cache_retry_after_ms: int = setting(
        1_000, "after a cache failure, skip Redis this long (answers say `BYPASSED`)"
    )
    metrics_host: str = setting("127.0.0.1", "address of Prometheus `/metrics`")
    metrics_port: int | None = setting(
        9464,
        "port of Prometheus `/metrics`; `off` disables it, `0` takes any free port",
        parse=_parse_port_or_off,
    )
    log_format: str = setting("text", "`text` or `json` (one object per line); also `--log-format`")

    # Certificate paths are read at start.
    tls_cert_file: Path | None = setting(None, "PEM server certificate (chain): serve TLS")  # noqa: RUF009
    tls_key_file: Path | None = setting(None, "PEM key of the server certificate")  # noqa: RUF009
    tls_client_ca_file: Path | None = setting(  # noqa: RUF009
        None, "mutual TLS: clients need a certificate from this CA (with the next)"
    )
    tls_require_client_cert: bool = setting(False, "mutual TLS: require a client certificate")
    # For TLS terminated in front of memsvc (a mesh, a load balancer).
    allow_plaintext: bool = setting(False, "allow plaintext on an address that is not loopback")

    # Per-tenant admission after authentication, so one tenant cannot starve another.
    # On by default, at values one small tenant never meets (a 2-core process answers a few
    # hundred calls a second in all): they stop a flood, the shares below divide the pools.
    tenant_rate_per_s: float = setting(
        1000.0, "per-tenant token bucket per process: calls per second (`0`: off)"
    )
    tenant_burst: int = setting(0, "per-tenant token bucket: burst (`0`: one second's worth)")
    tenant_max_in_flight: int = setting(128, "per-tenant calls in flight per process (`0`: off)")
    reads_max_in_flight_per_tenant: int = setting(
        16,
        "Recall + Prefetch one tenant may have in flight per process, its share of "
        "`MEMSVC_READS_MAX_IN_FLIGHT` (`0`: no own cap)",
    )
    pg_pool_max_per_tenant: int = setting(
        10,
        "pooled connections one tenant's calls may hold at once per process, its share of "
        "`MEMSVC_PG_POOL_MAX`; past it they wait for their own (`0`: no own cap)",
    )
    stream_stall_s: float = setting(
        30.0,
        "a server stream (ExportMemories, WatchMemories) whose caller accepts no message for "
        "this long is cut off with `DEADLINE_EXCEEDED` saying so (`0`: never)",
    )
    # gRPC itself drops anything over twice this before memsvc reads it (RESOURCE_EXHAUSTED).
    max_request_bytes: int = setting(
        4 * 1024 * 1024, "largest request answered; beyond, `INVALID_ARGUMENT` with its size"
    )
    export_batch_rows: int = setting(500, "rows ExportMemories reads per cursor batch")
    export_max_in_flight: int = setting(
        4,
        "exports streaming at once per process (each holds a connection and a snapshot); "
        "beyond, `RESOURCE_EXHAUSTED` with a retry hint",
    )
    export_max_in_flight_per_tenant: int = setting(
        1, "exports one tenant may stream at once per process (`0`: no own cap)"
    )
    export_default_deadline_s: int = setting(
        600, "deadline of an ExportMemories call that sets none"
    )
    export_max_deadline_s: int = setting(
        900, "longest an ExportMemories call may run, whatever deadline it sets"
    )
    # Batch and import (issue 15).
    import_max_lines: int = setting(
        100_000,
        "lines one ImportMemories call may send (summary lines included); more: "
        "`RESOURCE_EXHAUSTED`, nothing written",
    )
    import_max_bytes: int = setting(
        256 * 1024 * 1024,
        "bytes of lines one ImportMemories call may send (it holds them until all are "
        "checked); more: `RESOURCE_EXHAUSTED`, nothing written",
    )
    import_default_deadline_s: int = setting(
        600, "deadline of an ImportMemories call that sets none"
    )
    import_max_deadline_s: int = setting(
        900, "longest an ImportMemories call may run, whatever deadline it sets"
    )
    import_max_in_flight: int = setting(
        4,
        "imports running at once per process (each holds its lines in memory); beyond, "
        "`RESOURCE_EXHAUSTED` with a retry hint",
    )
    import_max_in_flight_per_tenant: int = setting(
        1, "imports one tenant may run at once per process (`0`: no own cap)"
    )
    import_embed_batch: int = setting(
        128, "texts per embedder call when ImportMemories re-embeds what it imports"
    )
    # Change stream (issue 15).
    watch_max_streams: int = setting(
        1000, "WatchMemories streams open at once per process; beyond, `RESOURCE_EXHAUSTED`"
    )
    watch_max_streams_per_tenant: int = setting(
        100, "WatchMemories streams one tenant may hold open per process (`0`: no own cap)"
    )
    watch_max_stream_s: float = setting(
        3600.0,
        "a WatchMemories stream ends after this long with `UNAVAILABLE` saying so (resume "
        "after the last position; memsvc.client does) (`0`: never)",
    )
    watch_poll_s: float = setting(
        2.0, "a WatchMemories stream also polls this often (covers a missed notification)"
    )
    watch_heartbeat_s: float = setting(
        15.0, "an idle WatchMemories stream sends a HEARTBEAT with its position this often"
    )
    changes_retention_s: float = setting(
        7 * 86400.0,
        "how long the change stream keeps its entries (WatchMemories resumes within it; "
        "older positions: `OUT_OF_RANGE`)",
    )

    # Governance defaults; a tenant overrides them with `memsvc tenants set`.
    pii_policy: str = setting(
        "redact",
        "personal data in memories and stored messages: a default action (`store`, `redact`, "
        "`reject`; a message is never refused: `reject` redacts it), then per "
        "kind (`redact,email=store`); kinds: `card_number`, `government_id`, `bank_account`, "
        "`password`, `secret`, `one_time_code`, `email`, `phone`; per tenant: "
        "`memsvc tenants set --pii`",
    )
    pii_phone_regions: tuple[str, ...] = setting(
        ("US", "GB"),
        "regions whose national phone number formats the PII screen recognizes (ISO 3166 "
        "codes); international `+` numbers are recognized everywhere",
        parse=_parse_region_codes,
    )
    message_ttl_days: int = setting(
        90,
        "stored messages (the conversation history) are deleted this long after Ingest "
        "(`0`: never); per tenant: `memsvc tenants set --message-ttl-days`",
    )
    session_retention_s: int = setting(
        86_400,
        "a SESSION memory is deleted when its session ends, or this long after the write at "
        "the latest",
    )
    expiry_interval_s: float = setting(
        60.0, "how often each worker process runs the expiry task (jittered ±20%)"
    )
    expiry_batch: int = setting(
        500, "rows the expiry task deletes per statement (one short transaction each)"
    )
    tenant_settings_cache_s: float = setting(
        5.0, "how long a process trusts its copy of a tenant's settings"
    )

    default_write_deadline_ms: int = setting(5_000, "budget of a write call that has no deadline")
    deadline_margin_ms: int = setting(10, "kept back from a call's deadline to answer")
    shutdown_grace_s: float = setting(10.0, "in-flight grace on SIGTERM")

    @property
    def message_ttl_s(self) -> int:
        return self.message_ttl_days * 86_400

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields replaced (CLI flags win over the environment)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read the MEMSVC_* variables (an empty one is unset); bad values fail loudly."""
        values: dict[str, Any] = {}
        for spec in ENV_SETTINGS:
            raw = env.get(spec.variable, "")
            if raw.strip():
                values[spec.field] = spec.parse(spec.variable, raw)
        for lower, upper in _FOLLOWS:
            if upper in values and lower not in values:
                values[lower] = min(getattr(cls, lower), values[upper])
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Reject combinations that cannot work, with a message naming the setting.
        MEMSVC_PII_POLICY and MEMSVC_PII_PHONE_REGIONS are governance's vocabularies,
        checked where the PII screen is built (memsvc.server.runtime.pii_defaults)."""
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
        if self.worker_acquire_timeout_ms < 1:
            raise ConfigError("MEMSVC_WORKER_ACQUIRE_TIMEOUT_MS must be at least 1")
        try:
            re.compile(self.user_id_pattern)
        except re.error as exc:
            raise ConfigError(f"MEMSVC_USER_ID_PATTERN: not a regular expression ({exc})") from None
        if not 1 <= self.processes <= MAX_PROCESSES:
            raise ConfigError(f"MEMSVC_PROCESSES must be within 1..{MAX_PROCESSES}")
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
            if not 0 < days < math.inf:
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
        if not 1 <= self.packet_min_chars <= self.packet_default_chars <= self.packet_max_chars:
            raise ConfigError(
                f"MEMSVC_PACKET_DEFAULT_CHARS must be within {self.packet_min_chars}.."
                f"{self.packet_max_chars} (MEMSVC_PACKET_MIN_CHARS..MEMSVC_PACKET_MAX_CHARS)"
            )
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"MEMSVC_LOG_FORMAT: expected text or json, got {self.log_format!r}")
        if self.max_request_bytes < 1024:
            raise ConfigError("MEMSVC_MAX_REQUEST_BYTES must be at least 1024")
        if self.session_retention_s < 1 or self.expiry_batch < 1 or self.session_idle_s < 1:
            raise ConfigError(
                "MEMSVC_SESSION_RETENTION_S, MEMSVC_EXPIRY_BATCH and MEMSVC_SESSION_IDLE_S "
                "must be at least 1"
            )
        if self.expiry_interval_s <= 0:
            raise ConfigError("MEMSVC_EXPIRY_INTERVAL_S must be positive")
        for name in (
            "export_batch_rows",
            "export_max_in_flight",
            "export_default_deadline_s",
            "import_max_lines",
            "import_max_bytes",
            "import_default_deadline_s",
            "import_embed_batch",
            "export_max_deadline_s",
            "import_max_deadline_s",
            "import_max_in_flight",
            # Request limits: 0 would refuse every request that has the field.
            "max_content_chars",
            "max_id_chars",
            "max_reason_chars",
            "max_source_ids",
            "max_forget_ids",
            "max_goals",
            "max_query_chars",
            "max_messages_per_ingest",
            "max_message_chars",
            "max_ingest_chars",
            "default_write_deadline_ms",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{env_name(name)} must be at least 1")
        if not 1 <= self.default_page_size <= self.max_page_size:
            raise ConfigError("MEMSVC_DEFAULT_PAGE_SIZE must be within 1..MEMSVC_MAX_PAGE_SIZE")
        if not 0 < self.recall_embed_admit_share <= 1:
            raise ConfigError("MEMSVC_RECALL_EMBED_ADMIT_SHARE must be in (0, 1]")
        if self.reads_max_queue_ms < 0:
            raise ConfigError("MEMSVC_READS_MAX_QUEUE_MS must be at least 0")
        if self.reads_degrade_queue_ms < 0:
            raise ConfigError("MEMSVC_READS_DEGRADE_QUEUE_MS must be at least 0")
        if 0 < self.reads_max_queue_ms <= self.reads_degrade_queue_ms:
            raise ConfigError(
                "MEMSVC_READS_DEGRADE_QUEUE_MS must be below MEMSVC_READS_MAX_QUEUE_MS "
                "(a degraded answer comes before a refusal), or one of them 0"
            )
        if not 0 <= self.reads_max_cpu_busy <= 1:
            raise ConfigError("MEMSVC_READS_MAX_CPU_BUSY must be in [0, 1]")
        if not 0 <= self.recall_answer_headroom <= 0.5:
            raise ConfigError("MEMSVC_RECALL_ANSWER_HEADROOM must be within 0..0.5")
        if self.recall_stream_interims_per_s <= 0:
            raise ConfigError("MEMSVC_RECALL_STREAM_INTERIMS_PER_S must be above 0")
        if self.recall_lexical_enough_below_ms < 0:
            raise ConfigError("MEMSVC_RECALL_LEXICAL_ENOUGH_BELOW_MS must be at least 0")
        if not 0.0 <= self.recall_min_relevance <= 1.0:
            raise ConfigError("MEMSVC_RECALL_MIN_RELEVANCE must be within 0..1")
        if not 0.0 <= self.recall_min_relevance_episode <= 1.0:
            raise ConfigError("MEMSVC_RECALL_MIN_RELEVANCE_EPISODE must be within 0..1")
        if not 1 <= self.recall_default_top_k <= self.recall_max_top_k:
            raise ConfigError(
                "MEMSVC_RECALL_DEFAULT_TOP_K must be within 1..MEMSVC_RECALL_MAX_TOP_K"
            )
        for name in (
            "recall_default_deadline_ms",
            "prefetch_default_deadline_ms",
            "default_write_deadline_ms",
        ):
            if getattr(self, name) <= self.deadline_margin_ms:
                raise ConfigError(f"{env_name(name)} must exceed MEMSVC_DEADLINE_MARGIN_MS")


@dataclass(frozen=True)
class EnvSetting:
    """One Settings field as the environment sets it."""

    field: str
    variable: str
    help: str
    parse: Parse


def _env_settings() -> tuple[EnvSetting, ...]:
    hints = typing.get_type_hints(Settings)
    found = []
    for f in dataclasses.fields(Settings):
        parse = f.metadata.get("parse") or _PARSERS.get(hints[f.name])
        help_text = f.metadata.get("help")
        # A field added without setting(), or of a type with no parser, fails every import.
        if parse is None or not help_text:
            raise TypeError(f"Settings.{f.name}: needs setting(default, help[, parse=...])")
        found.append(EnvSetting(f.name, env_name(f.name), help_text, parse))
    return tuple(found)


# Every field, in declaration order: what from_env reads and docs/reference/configuration.md lists.
ENV_SETTINGS = _env_settings()
