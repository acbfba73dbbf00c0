"""Settings: the environment and CLI flags, read once into a frozen object passed explicitly."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, TypeVar

from annotated_types import Ge, Gt, Le
from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

DEFAULT_CATEGORIES = ("preference", "profile", "relationship", "goal", "event", "context")
DEFAULT_ROLES = ("core", "context", "detail", "temporal", "causal")
ENV_PREFIX = "MEMSVC_"
# Background work (workers, reconcile, expiry) waits this long for a pooled connection; the
# default of MEMSVC_WORKER_ACQUIRE_TIMEOUT_MS and of the settings objects built without one.
WORKER_ACQUIRE_TIMEOUT_S = 10.0
# Serving processes of one `memsvc serve`: each holds its own pools, so more than a machine's
# cores only adds PostgreSQL connections and memory.
MAX_PROCESSES = 64

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


def _from_text(parse: Parse) -> BeforeValidator:
    """Reads a variable's text with ``parse`` (a value given as itself passes as it is)."""

    def read(value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return value
        assert info.field_name is not None
        return parse(env_name(info.field_name), value)

    return BeforeValidator(read)


# The types of the fields, as the environment writes them: stricter than pydantic's own
# reading ("1_000", "+5", "ture" and "nan" are errors, not values), with messages naming the
# variable. A value given as itself (Settings(grpc_port=0)) is checked by pydantic.
Flag = Annotated[bool, _from_text(parse_bool)]
Integer = Annotated[int, _from_text(_parse_int)]
# A limit or a count where 0 would refuse everything or do nothing.
Positive = Annotated[int, Field(ge=1), _from_text(_parse_int)]
Number = Annotated[float, Field(allow_inf_nan=False), _from_text(_parse_float)]
Port = Annotated[int, Field(ge=0, le=65535), _from_text(_parse_port)]
PortOrOff = Annotated[int | None, Field(ge=0, le=65535), _from_text(_parse_port_or_off)]
Words = Annotated[tuple[str, ...], _from_text(_parse_words)]
RegionCodes = Annotated[tuple[str, ...], _from_text(_parse_region_codes)]
HalfLives = Annotated[tuple[tuple[str, float], ...], _from_text(_parse_half_lives)]


# (lower, upper): a lower value left unset follows an upper one set below it, so a smaller
# pool is still all opened at start-up, and a smaller page or top_k limit is still a valid one.
_FOLLOWS = (
    ("pg_pool_min", "pg_pool_max"),
    ("default_page_size", "max_page_size"),
    ("recall_default_top_k", "recall_max_top_k"),
    ("packet_default_chars", "packet_max_chars"),
)


def setting(
    default: Any,
    help: str,
    *,
    secret: bool = False,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    rule: str | None = None,
) -> Any:
    """A Settings field: its default, its description (docs/reference/configuration.md) and
    its bounds. A bound broken reads "MEMSVC_X must be at least 1" (or within a..b, in (a, b],
    positive), or ``rule`` ("{value}": the value). A secret stays out of repr."""
    return Field(
        default,
        description=help,
        repr=not secret,
        ge=ge,
        gt=gt,
        le=le,
        json_schema_extra=None if rule is None else {"rule": rule},
    )


class _Variables(EnvSettingsSource):
    """The MEMSVC_* variables of a given mapping (the command's os.environ, a test's dict),
    read by pydantic-settings with Settings' prefix."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._given = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k if self.case_sensitive else k.lower(): v for k, v in self._given.items()}


class Settings(BaseSettings):
    """Everything memsvc can be configured with; units are in the names. Each field is set by
    the environment variable env_name(field) (MEMSVC_GRPC_PORT sets grpc_port), read by
    Settings.from_env; Settings(...) takes its values from the call alone."""

    model_config = SettingsConfigDict(
        frozen=True,
        env_prefix=ENV_PREFIX,
        # A list is comma-separated text (Words), not JSON.
        enable_decoding=False,
    )

    grpc_host: str = setting("127.0.0.1", "gRPC bind address")
    grpc_port: Port = setting(50051, "gRPC port (`0`: any free port)")
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
    data_dir: Path = setting(Path(".memsvc"), "data folder of `memsvc dev`")

    auth_enabled: Flag = setting(
        True,
        "require an API key per call (`memsvc dev`: off unless this is set or `--auth` is given)",
    )
    default_tenant: str = setting("dev", "tenant of every call when authentication is off")
    auth_unknown_lookups_per_s: Number = setting(
        20.0,
        "database lookups per second, per process, of keys its key directory does not know "
        "(past it such a key is refused without one; `0`: no limit)",
    )
    auth_unknown_cache_size: Integer = setting(
        10_000, "unknown keys remembered per process (5 s each), apart from the known ones"
    )

    # Every connection opened at start-up: one opened under load costs that moment about
    # 8 ms to connect and 8 ms more on its first queries (a new backend's cold caches).
    pg_pool_min: Integer = setting(
        20,
        "connections opened at start-up (follows a smaller `MEMSVC_PG_POOL_MAX` when unset): "
        "one opened under load costs that moment about 16 ms",
    )
    pg_pool_max: Integer = setting(20, "largest connection pool")
    pg_command_timeout_ms: Integer = setting(5_000, "bound on any single statement")
    pg_acquire_timeout_ms: Integer = setting(
        1_000, "wait for a free connection before `RESOURCE_EXHAUSTED`"
    )
    redis_timeout_ms: Integer = setting(
        50, "bound on any cache operation (cache failures never fail a call)"
    )

    embedder: Literal["onnx", "openai"] = setting(
        "onnx",
        "`onnx` (all-MiniLM-L6-v2, int8 products, offline) or `openai` (any `/v1/embeddings`)",
    )
    embedding_dim: Integer = setting(384, "vector dimension; fixed per database")
    onnx_intra_op_threads: Integer = setting(1, "onnxruntime threads per inference")
    openai_base_url: str = setting("https://api.openai.com", "the `openai` embedder's endpoint")
    openai_embedding_model: str = setting("text-embedding-3-small", "the `openai` embedder's model")
    openai_api_key: str = setting("", "the `openai` embedder's API key", secret=True)
    embed_timeout_ms: Integer = setting(2_000, "bound on one embedding call")

    categories: Words = setting(
        DEFAULT_CATEGORIES, "closed category vocabulary (must include `context`)"
    )
    roles: Words = setting(
        DEFAULT_ROLES,
        "closed role vocabulary (must include `context`; the first is the core role)",
    )
    max_content_chars: Positive = setting(2_000, "longest memory text")
    max_id_chars: Positive = setting(128, "longest id (user, agent, session, memory, message…)")
    max_reason_chars: Positive = setting(500, "longest reason of a Correct")
    max_source_ids: Positive = setting(100, "source message ids per memory")
    max_forget_ids: Positive = setting(1_000, "memory ids per Forget call")
    max_page_size: Integer = setting(500, "largest ListMemories page")
    default_page_size: Integer = setting(50, "ListMemories page when the request sets none")

    # Write path: Ingest limits, extraction and the workers.
    max_messages_per_ingest: Positive = setting(200, "messages per Ingest call")
    max_message_chars: Positive = setting(8_000, "longest Ingest message")
    max_ingest_chars: Positive = setting(
        64_000,
        "characters of all the messages of one Ingest, the size budget of its extraction job "
        "(parsed well inside `MEMSVC_WORKER_JOB_TIMEOUT_S` on a busy core); beyond, "
        "`INVALID_ARGUMENT`: split the messages over several Ingests",
    )
    max_goals: Positive = setting(20, "goals per Ingest call")
    extractor: Literal["rules", "openai"] = setting(
        "rules", "`rules` (offline, deterministic) or `openai`"
    )
    openai_chat_base_url: str = setting(
        "https://api.openai.com", "the `openai` extractor's endpoint"
    )
    openai_chat_model: str = setting("gpt-4o-mini", "the `openai` extractor's model")
    openai_chat_api_key: str = setting("", "the `openai` extractor's API key", secret=True)
    extractor_timeout_ms: Integer = setting(20_000, "bound on one extractor call")
    # Only USER-role senders whose id matches accrue memories (bots, system ids excluded).
    user_id_pattern: str = setting(
        r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}",
        "sender ids that accrue memories (a regular expression)",
    )
    confidence_floor: Number = setting(0.5, "extracted candidates below are dropped")
    dedup_upper: Number = setting(
        0.92, "cosine at or above which a candidate is a stored fact said again (reinforced)"
    )
    dedup_lower: Number = setting(
        0.75, "cosine below which a candidate is a new fact; between the two, the extractor decides"
    )
    max_facts_per_episode: Integer = setting(50, "extracted facts per speaker and job")
    daily_fact_quota: Integer = setting(200, "new extracted memories per user per day")
    processes: Integer = setting(
        1,
        "serving processes on the gRPC port (`serve`/`dev --processes`): each has its own "
        "pools and embedder; the first also runs the workers and the packet warmer",
        ge=1,
        le=MAX_PROCESSES,
    )
    run_workers: Flag = setting(True, "run extraction workers inside `serve`/`dev`")
    # 3: one tenant's backlog runs two jobs at once (MEMSVC_WORKER_MAX_JOBS_PER_TENANT) and
    # the reserved slot stays free for another tenant's. With 2, one tenant's jobs ran one at
    # a time, and extraction throughput fell to half (bench/ingest.py).
    worker_concurrency: Integer = setting(
        3,
        "extraction jobs at once per process (one tenant's at most "
        "`MEMSVC_WORKER_MAX_JOBS_PER_TENANT`; the reserved slots wait for other tenants)",
    )
    worker_max_jobs_per_tenant: Integer = setting(
        2,
        "extraction jobs one tenant may have running at once over every worker; due jobs are "
        "claimed tenant by tenant, fewest running first (`0`: no cap)",
    )
    worker_reserved_slots: Integer = setting(
        1,
        "slots of each worker (of `MEMSVC_WORKER_CONCURRENCY`, all but one at most) kept for "
        "tenants with no job running, so another tenant's job starts at once however busy one "
        "tenant keeps the workers (`0`: none)",
    )
    parser_processes: Integer = setting(
        2,
        "processes parsing for the rules extractor, per serving or worker process; waiting "
        "parses are served tenant by tenant (fewest in hand first), then user by user, so "
        "another tenant's parse starts as soon as one is free",
        ge=1,
        le=64,
    )
    worker_lease_s: Number = setting(120.0, "lease of a job a worker took")
    worker_job_timeout_s: Number = setting(90.0, "bound on one job (shorter than the lease)")
    worker_max_attempts: Integer = setting(5, "attempts before a job is `dead`")
    worker_acquire_timeout_ms: Positive = setting(
        int(WORKER_ACQUIRE_TIMEOUT_S * 1000),
        "how long background work (workers, reconcile, expiry) waits for a pooled connection;"
        " longer than a call's, so a busy pool does not use up a job's attempt",
    )
    worker_backoff_base_s: Number = setting(
        2.0, "base of the retry backoff (exponential, jittered)"
    )
    worker_sweep_interval_s: Number = setting(15.0, "how often workers look for due jobs")
    reconcile_interval_s: Number = setting(
        60.0, "how often workers re-embed stale rows and report the outbox depth"
    )
    # Workers embed in batches at low priority: a busy machine must not turn that into
    # unembedded messages (the online embed_timeout_ms is for one query).
    worker_embed_timeout_s: Number = setting(30.0, "bound on one background embedding batch")

    # Read path: Recall and Prefetch. No deadline on the call -> these defaults.
    recall_default_deadline_ms: Integer = setting(
        800, "Recall budget when the call has no deadline"
    )
    prefetch_default_deadline_ms: Integer = setting(
        200, "Prefetch budget when the call has no deadline"
    )
    recall_default_top_k: Integer = setting(10, "Recall results when the request sets no `top_k`")
    recall_max_top_k: Integer = setting(100, "largest `top_k` of a Recall")
    # Calibrated on the LoCoMo dev split with all-MiniLM-L6-v2 (bench/locomo_eval.py
    # --min-scores, hybrid, messages): 0.2 keeps R@10 at 77.8 (77.9 without a minimum; 0.25:
    # 77.1, 0.3: 76.6) and 80% of unrelated questions get no items (0.25: 93%, 0.3: 96%); 1% of
    # evidence items score below 0.23. Another embedding model has another cosine scale.
    recall_min_relevance: Number = setting(
        0.2,
        "Recall's default minimum relevance (cosine similarity to the query, 0..1), when "
        "`filters.min_score` is unset: an answer whose 10 best items hold a fact or message "
        "reaching it comes back as ranked, otherwise each item needs its kind's minimum, so an "
        "unrelated question gets no items; 0: no minimum",
        ge=0,
        le=1,
    )
    recall_min_relevance_episode: Number = setting(
        0.05,
        "the same default for episodes (summaries of a whole conversation sit further from "
        "any one question than a fact does); a caller's `min_score` applies to every kind",
        ge=0,
        le=1,
    )
    # Measured on the LoCoMo dev split (bench/locomo_eval.py --deadline-ms 200): the lexical
    # leg's best match held every word of 34% of the questions; answering those from the
    # lexical leg alone moved hybrid R@10 from 80.4 to 80.2 (per conversation -2.1..+0.9).
    recall_embed_admit_share: Number = setting(
        0.5,
        "on arrival, a Recall whose query embedding is expected to wait in the embedder's "
        "queue longer than this share of its budget answers from the lexical leg alone "
        "(`degraded`, missing `embed` and `dense`) instead of late",
        gt=0,
        le=1,
    )
    recall_answer_headroom: Number = setting(
        0.25,
        "share of a Recall's budget its legs leave unused: a leg still running then is "
        "stopped, so the answer has time to leave and reach the caller on a saturated machine "
        "(where a serving process can be off its core for tens of ms)",
        ge=0,
        le=0.5,
    )
    recall_lexical_enough_below_ms: Integer = setting(
        400,
        "Recall deadlines up to this long (voice) do not wait for the query embedding and "
        "the dense leg when the lexical leg's best match holds every word of the query "
        "(the answer lists them in `skipped_legs`); 0: always wait for both legs",
        ge=0,
    )
    max_query_chars: Positive = setting(2_000, "longest Recall query or Prefetch hint")
    # A transcriber sends an interim every 100-300 ms; each costs a Recall's CPU ahead.
    recall_stream_interims_per_s: Number = setting(
        10.0,
        "interim transcripts one RecallStream may send per second (bursts of one second's "
        "worth) that are worked ahead; beyond, an interim is not worked ahead (counted in "
        '`memsvc_recall_ahead_total{outcome="over_rate"}`; the final is still answered)',
        gt=0,
        rule="must be above 0",
    )
    recall_candidates: Integer = setting(50, "candidates per leg before fusion (at least `top_k`)")
    # Measured on the LoCoMo dev split (turn-level R@10, bench/locomo_eval.py): plain RRF at
    # k=60 fused below the lexical leg alone (67.8 vs 75.2); k=10 with the dense leg at half
    # weight gives 77.4, on a plateau (k 5-20, dense weight 0.3-0.5: 76.2-77.5) rather than
    # an edge (k=60 beats lexical only for dense weight <= 0.2, and falls below at 0.3).
    # Re-checked with speaker units (bench/locomo_loo.py, each dev conversation left out in
    # turn): these defaults 80.4, left-one-out mean 80.3, per conversation 75.9..84.6.
    rrf_k: Positive = setting(10, "Reciprocal Rank Fusion constant (score = weight / (k + rank))")
    rrf_dense_weight: Number = setting(0.5, "fusion weight of the dense leg")
    rrf_lexical_weight: Number = setting(1.0, "fusion weight of the lexical leg")
    # On raised LoCoMo dev R@10 77.4 -> 78.1 (no category lower).
    routing: Flag = setting(
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
    lexical_idf: Flag = setting(
        False,
        "lexical leg: weigh each query word by its inverse document frequency among the "
        "scope's own rows (BM25's IDF; better ranking, 1.7-2.6x the leg's time); off: one "
        "ts_rank for the whole query",
    )
    dense_exact_max_rows: Integer = setting(
        2_000,
        "a user with at most this many rows in a table gets exact nearest neighbours; above, "
        "HNSW with iterative scan",
    )
    query_embed_cache_size: Integer = setting(
        4_096,
        "query embeddings kept in the in-process LRU (keyed by tenant: a tenant never hits"
        " another's entry, whose speed would tell it the text was asked)",
    )
    reads_max_in_flight: Integer = setting(
        32, "concurrent Recall + Prefetch per process; beyond, `RESOURCE_EXHAUSTED` at once"
    )
    reads_queue_share: Number = setting(
        0.4,
        "a read expected to take more than this share of its budget, given the reads ahead "
        "of it and how long recent reads took, gets `RESOURCE_EXHAUSTED` at once",
        gt=0,
        le=1,
        rule="must be in (0, 1], got {value}",
    )
    reads_max_loop_lag_ms: Integer = setting(
        20,
        "while the event loop stays this late (a saturated CPU), new reads get "
        "`RESOURCE_EXHAUSTED` at once (`0`: off)",
    )
    reads_degrade_queue_ms: Integer = setting(
        20,
        "while the oldest call waiting in gRPC's queue for a handler has waited longer than "
        "this (the serving loop is saturated), Recall answers without embedding its query "
        "(`degraded`, the cheapest answer), so the queue drains before anyone is refused "
        "(`0`: off; see docs/read-path.md, overload)",
        ge=0,
    )
    reads_max_queue_ms: Integer = setting(
        100,
        "while the oldest call waiting in gRPC's queue for a handler has waited longer than "
        "this, reads get `RESOURCE_EXHAUSTED` at once: the calls that waited that long are "
        "refused at a fraction of an answer's cost until the queue is short again, so none "
        "waits past its deadline there (`0`: off; see docs/read-path.md, overload)",
        ge=0,
    )
    reads_max_cpu_busy: Number = setting(
        0.9,
        "while the machine's CPUs (all of them, whoever uses them) are busier than this "
        "share, Recall answers without its query embedding (`degraded`) and each process "
        "admits fewer reads at a time (`RESOURCE_EXHAUSTED`), so answers leave in time "
        "(`0`: off)",
        ge=0,
        le=1,
        rule="must be in [0, 1]",
    )
    packet_ttl_s: Integer = setting(600, "lifetime of a cached Prefetch packet")
    # Packet warming (prefetch/warmer.py): after a change, rebuild the hint-less packets the
    # user asked for lately, so the next call setup is a cache hit.
    prefetch_warm: Flag = setting(
        True,
        "after a write changes a user's memories, rebuild their recently requested hint-less "
        "Prefetch packets in the background (off: the next Prefetch builds it)",
    )
    prefetch_warm_delay_ms: Integer = setting(
        100, "warming waits this long after a user's last change (a burst rebuilds once)"
    )
    prefetch_warm_ttl_s: Integer = setting(
        86_400, "a hint-less packet shape requested within this long is kept warm"
    )
    prefetch_warm_budget_ms: Integer = setting(2_000, "time budget of one background rebuild")
    prefetch_warm_concurrency: Integer = setting(2, "background rebuilds at once per process")
    packet_default_chars: Integer = setting(
        4_000, "packet budget when the request sets none (within the min..max below)"
    )
    packet_max_chars: Integer = setting(32_000, "largest packet budget a request may ask for")
    # Room for the framing, the longest session echo and a withheld note.
    packet_min_chars: Integer = setting(600, "smallest packet budget a request may ask for")
    half_life_days: Number = setting(
        30.0, "recency half-life of the Prefetch walk and of Recall's ordering", gt=0
    )
    confidence_half_life_days: HalfLives = setting(
        (),
        "confidence half-life per category, `category=days,…`, over preference=180, "
        "profile=365, relationship=365, goal=90, event=30, context=60 (an unlisted custom "
        "category uses `context`'s)",
    )
    references_flush_interval_ms: Integer = setting(
        1_000, "`last_referenced_at`: how often the batched upsert runs", ge=10
    )
    references_max_pending: Positive = setting(
        100_000, "`last_referenced_at`: ids waiting for the upsert (beyond: dropped, counted)"
    )
    references_min_interval_s: Number = setting(
        60.0, "`last_referenced_at`: an id referenced again within this long is not written again"
    )
    human_block_max_chars: Integer = setting(
        2_000,
        "human core block limit in characters, its written text and its core facts together "
        "(`0`: none; a tenant may override it: `memsvc tenants set --human-block-chars`)",
    )
    persona_block_max_chars: Integer = setting(
        2_000,
        "persona core block limit in characters (`0`: none; a tenant may override it: "
        "`memsvc tenants set --persona-block-chars`)",
    )
    core_compaction_timeout_ms: Integer = setting(
        5_000,
        "with the `openai` extractor, bound on the summarizing call before compaction falls "
        "back to demotion",
    )
    prefetch_topics: Integer = setting(8, "topics the Prefetch walk visits")
    prefetch_episodes: Integer = setting(8, "episodes the Prefetch walk visits")
    session_idle_s: Positive = setting(
        1_800,
        "a session not ended by Ingest `end_of_session` counts as finished once its last "
        "message is this old; until then Prefetch lists none of its episodes as an earlier "
        "conversation",
    )
    prefetch_facts: Integer = setting(40, "facts the Prefetch walk collects")
    # Few, because the section orders by role before relevance.
    prefetch_direct_facts: Integer = setting(
        10, "facts Prefetch takes directly (best hint matches, or most recent without a hint)"
    )
    cache_retry_after_ms: Integer = setting(
        1_000, "after a cache failure, skip Redis this long (answers say `BYPASSED`)"
    )
    metrics_host: str = setting("127.0.0.1", "address of Prometheus `/metrics`")
    metrics_port: PortOrOff = setting(
        9464,
        "port of Prometheus `/metrics`; `off` disables it, `0` takes any free port",
    )
    log_format: Literal["text", "json"] = setting(
        "text", "`text` or `json` (one object per line); also `--log-format`"
    )

    # Certificate paths are read at start.
    tls_cert_file: Path | None = setting(None, "PEM server certificate (chain): serve TLS")
    tls_key_file: Path | None = setting(None, "PEM key of the server certificate")
    tls_client_ca_file: Path | None = setting(
        None, "mutual TLS: clients need a certificate from this CA (with the next)"
    )
    tls_require_client_cert: Flag = setting(False, "mutual TLS: require a client certificate")
    # For TLS terminated in front of memsvc (a mesh, a load balancer).
    allow_plaintext: Flag = setting(False, "allow plaintext on an address that is not loopback")

    # Per-tenant admission after authentication, so one tenant cannot starve another.
    # On by default, at values one small tenant never meets (a 2-core process answers a few
    # hundred calls a second in all): they stop a flood, the shares below divide the pools.
    tenant_rate_per_s: Number = setting(
        1000.0, "per-tenant token bucket per process: calls per second (`0`: off)"
    )
    tenant_burst: Integer = setting(0, "per-tenant token bucket: burst (`0`: one second's worth)")
    tenant_max_in_flight: Integer = setting(
        128, "per-tenant calls in flight per process (`0`: off)"
    )
    reads_max_in_flight_per_tenant: Integer = setting(
        16,
        "Recall + Prefetch one tenant may have in flight per process, its share of "
        "`MEMSVC_READS_MAX_IN_FLIGHT` (`0`: no own cap)",
    )
    pg_pool_max_per_tenant: Integer = setting(
        10,
        "pooled connections one tenant's calls may hold at once per process, its share of "
        "`MEMSVC_PG_POOL_MAX`; past it they wait for their own (`0`: no own cap)",
    )
    stream_stall_s: Number = setting(
        30.0,
        "a server stream (ExportMemories, WatchMemories) whose caller accepts no message for "
        "this long is cut off with `DEADLINE_EXCEEDED` saying so (`0`: never)",
    )
    # gRPC itself drops anything over twice this before memsvc reads it (RESOURCE_EXHAUSTED).
    max_request_bytes: Integer = setting(
        4 * 1024 * 1024,
        "largest request answered; beyond, `INVALID_ARGUMENT` with its size",
        ge=1024,
    )
    export_batch_rows: Positive = setting(500, "rows ExportMemories reads per cursor batch")
    export_max_in_flight: Positive = setting(
        4,
        "exports streaming at once per process (each holds a connection and a snapshot); "
        "beyond, `RESOURCE_EXHAUSTED` with a retry hint",
    )
    export_max_in_flight_per_tenant: Integer = setting(
        1, "exports one tenant may stream at once per process (`0`: no own cap)"
    )
    export_default_deadline_s: Positive = setting(
        600, "deadline of an ExportMemories call that sets none"
    )
    export_max_deadline_s: Positive = setting(
        900, "longest an ExportMemories call may run, whatever deadline it sets"
    )
    # Batch and import (issue 15).
    import_max_lines: Positive = setting(
        100_000,
        "lines one ImportMemories call may send (summary lines included); more: "
        "`RESOURCE_EXHAUSTED`, nothing written",
    )
    import_max_bytes: Positive = setting(
        256 * 1024 * 1024,
        "bytes of lines one ImportMemories call may send (it holds them until all are "
        "checked); more: `RESOURCE_EXHAUSTED`, nothing written",
    )
    import_default_deadline_s: Positive = setting(
        600, "deadline of an ImportMemories call that sets none"
    )
    import_max_deadline_s: Positive = setting(
        900, "longest an ImportMemories call may run, whatever deadline it sets"
    )
    import_max_in_flight: Positive = setting(
        4,
        "imports running at once per process (each holds its lines in memory); beyond, "
        "`RESOURCE_EXHAUSTED` with a retry hint",
    )
    import_max_in_flight_per_tenant: Integer = setting(
        1, "imports one tenant may run at once per process (`0`: no own cap)"
    )
    import_embed_batch: Positive = setting(
        128, "texts per embedder call when ImportMemories re-embeds what it imports"
    )
    # Change stream (issue 15).
    watch_max_streams: Integer = setting(
        1000, "WatchMemories streams open at once per process; beyond, `RESOURCE_EXHAUSTED`"
    )
    watch_max_streams_per_tenant: Integer = setting(
        100, "WatchMemories streams one tenant may hold open per process (`0`: no own cap)"
    )
    watch_max_stream_s: Number = setting(
        3600.0,
        "a WatchMemories stream ends after this long with `UNAVAILABLE` saying so (resume "
        "after the last position; memsvc.client does) (`0`: never)",
    )
    watch_poll_s: Number = setting(
        2.0, "a WatchMemories stream also polls this often (covers a missed notification)"
    )
    watch_heartbeat_s: Number = setting(
        15.0, "an idle WatchMemories stream sends a HEARTBEAT with its position this often"
    )
    changes_retention_s: Number = setting(
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
    pii_phone_regions: RegionCodes = setting(
        ("US", "GB"),
        "regions whose national phone number formats the PII screen recognizes (ISO 3166 "
        "codes); international `+` numbers are recognized everywhere",
    )
    message_ttl_days: Integer = setting(
        90,
        "stored messages (the conversation history) are deleted this long after Ingest "
        "(`0`: never); per tenant: `memsvc tenants set --message-ttl-days`",
    )
    session_retention_s: Positive = setting(
        86_400,
        "a SESSION memory is deleted when its session ends, or this long after the write at "
        "the latest",
    )
    expiry_interval_s: Number = setting(
        60.0, "how often each worker process runs the expiry task (jittered ±20%)", gt=0
    )
    expiry_batch: Positive = setting(
        500, "rows the expiry task deletes per statement (one short transaction each)"
    )
    tenant_settings_cache_s: Number = setting(
        5.0, "how long a process trusts its copy of a tenant's settings"
    )

    default_write_deadline_ms: Positive = setting(
        5_000, "budget of a write call that has no deadline"
    )
    deadline_margin_ms: Integer = setting(10, "kept back from a call's deadline to answer")
    shutdown_grace_s: Number = setting(10.0, "in-flight grace on SIGTERM (calls and jobs together)")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Settings(...) is what the call says: the environment is read by from_env only.
        return (init_settings,)

    @property
    def message_ttl_s(self) -> int:
        return self.message_ttl_days * 86_400

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields replaced (CLI flags win over the environment; a None
        change is no change). Like the settings it copies, unchecked until check()."""
        return self.model_copy(update={k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read the MEMSVC_* variables (an empty one is unset); bad values fail loudly."""
        given = {name: raw for name, raw in env.items() if name in _VARIABLES and raw.strip()}
        return cls._checked(_Variables(cls, given)())

    def check(self) -> None:
        """Reject values and combinations that cannot work (a copy with overrides), with a
        message naming the setting."""
        type(self)._checked(dict(self))

    @classmethod
    def _checked(cls, values: Mapping[str, Any]) -> Settings:
        try:
            return cls(**values)
        except ValidationError as exc:
            raise _config_error(exc) from None

    @field_validator("user_id_pattern")
    @classmethod
    def _a_regular_expression(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"MEMSVC_USER_ID_PATTERN: not a regular expression ({exc})") from None
        return pattern

    @model_validator(mode="after")
    def _follow_then_check(self) -> Self:
        """A lower value left unset follows an upper one set below it; then the combinations
        are checked."""
        for lower, upper in _FOLLOWS:
            if upper in self.model_fields_set and lower not in self.model_fields_set:
                self.__dict__[lower] = min(getattr(self, lower), getattr(self, upper))
        self._check_combinations()
        return self

    def _check_combinations(self) -> None:
        """Combinations that cannot work, with a message naming the settings. (A field's own
        bounds are declared on it; MEMSVC_PII_POLICY and MEMSVC_PII_PHONE_REGIONS are
        governance's vocabularies, checked where the PII screen is built:
        memsvc.server.runtime.pii_defaults.)"""
        if not self.categories:
            raise ConfigError("MEMSVC_CATEGORIES: at least one category is required")
        if not self.roles:
            raise ConfigError("MEMSVC_ROLES: at least one role is required")
        if "context" not in self.categories or "context" not in self.roles:
            raise ConfigError("the category and role vocabularies must include 'context'")
        if not 0 <= self.dedup_lower <= self.dedup_upper <= 1:
            raise ConfigError("MEMSVC_DEDUP_LOWER <= MEMSVC_DEDUP_UPPER, both within 0..1")
        if self.worker_job_timeout_s >= self.worker_lease_s:
            raise ConfigError("MEMSVC_WORKER_JOB_TIMEOUT_S must be shorter than the lease")
        if self.pg_pool_min > self.pg_pool_max:
            raise ConfigError("MEMSVC_PG_POOL_MIN must not exceed MEMSVC_PG_POOL_MAX")
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
        if not 1 <= self.packet_min_chars <= self.packet_default_chars <= self.packet_max_chars:
            raise ConfigError(
                f"MEMSVC_PACKET_DEFAULT_CHARS must be within {self.packet_min_chars}.."
                f"{self.packet_max_chars} (MEMSVC_PACKET_MIN_CHARS..MEMSVC_PACKET_MAX_CHARS)"
            )
        if not 1 <= self.default_page_size <= self.max_page_size:
            raise ConfigError("MEMSVC_DEFAULT_PAGE_SIZE must be within 1..MEMSVC_MAX_PAGE_SIZE")
        if 0 < self.reads_max_queue_ms <= self.reads_degrade_queue_ms:
            raise ConfigError(
                "MEMSVC_READS_DEGRADE_QUEUE_MS must be below MEMSVC_READS_MAX_QUEUE_MS "
                "(a degraded answer comes before a refusal), or one of them 0"
            )
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


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _bound_broken(field: FieldInfo, value: Any) -> str:
    """What a field's declared bounds say, as a rule: "must be at least 1", "must be within
    1..64", "must be in (0, 1]", "must be positive" (or the field's own wording)."""
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(rule := extra.get("rule"), str):
        return rule.format(value=value)
    lower = next((m for m in reversed(field.metadata) if isinstance(m, Ge | Gt)), None)
    upper = next((m.le for m in field.metadata if isinstance(m, Le)), None)
    if isinstance(lower, Ge):
        low = _number(lower.ge)
        return f"must be at least {low}" if upper is None else f"must be within {low}..{upper}"
    if isinstance(lower, Gt):
        if upper is None:
            return "must be positive" if lower.gt == 0 else f"must be above {lower.gt}"
        return f"must be in ({_number(lower.gt)}, {_number(upper)}]"
    return f"must be at most {upper}"


_BOUNDS = ("greater_than", "greater_than_equal", "less_than_equal")


def _config_error(exc: ValidationError) -> ConfigError:
    """The first problem of a failed validation, worded as the settings have always worded
    it: a value that could not be read comes before a rule broken (as when each variable was
    parsed before the checks), each naming its variable."""
    problems = exc.errors()
    first = next(
        (p for p in problems if isinstance(p.get("ctx", {}).get("error"), ConfigError)),
        problems[0],
    )
    error = first.get("ctx", {}).get("error")
    if isinstance(error, ConfigError):
        return error
    name = str(first["loc"][0])
    variable = env_name(name)
    field = Settings.model_fields[name]
    if first["type"] in _BOUNDS:
        return ConfigError(f"{variable} {_bound_broken(field, first['input'])}")
    if first["type"] == "literal_error":
        choices = " or ".join(typing.get_args(field.annotation))
        return ConfigError(f"{variable}: expected {choices}, got {first['input']!r}")
    return ConfigError(f"{variable}: {first['msg']}")


@dataclass(frozen=True)
class EnvSetting:
    """One Settings field as the environment sets it."""

    field: str
    variable: str
    help: str


def _env_settings() -> tuple[EnvSetting, ...]:
    found = []
    for name, field in Settings.model_fields.items():
        # A field added without setting() fails every import.
        if not field.description:
            raise TypeError(f"Settings.{name}: needs setting(default, help)")
        found.append(EnvSetting(name, env_name(name), field.description))
    return tuple(found)


# Every field, in declaration order: what from_env reads and docs/reference/configuration.md lists.
ENV_SETTINGS = _env_settings()
_VARIABLES = frozenset(spec.variable for spec in ENV_SETTINGS)


# The services' config dataclasses (RecallConfig, WorkerSettings, ...) take their values from
# Settings by name, so a new setting is declared here and on the one field that uses it:
#     rrf_k: int = field(metadata=from_setting("rrf_k"))
#     service_config(settings, RecallConfig, leg_weights=...)   # only what is derived
_SETTING = "memsvc.setting"
Config = TypeVar("Config", bound="DataclassInstance")


def from_setting(name: str) -> Mapping[str, str]:
    """The metadata of a config field that takes the setting ``name``; a setting in
    milliseconds fills a field in seconds."""
    if name not in Settings.model_fields:
        raise TypeError(f"from_setting: Settings has no field {name!r}")
    return {_SETTING: name}


def service_config(settings: Settings, cls: type[Config], **derived: Any) -> Config:
    """``cls`` built from ``settings``: each field marked from_setting(name) takes that
    setting (``_ms`` into ``_s``: divided by 1000); ``derived`` gives the fields computed from
    several settings, the rest keep their defaults."""
    values = dict(derived)
    for f in dataclasses.fields(cls):
        name = f.metadata.get(_SETTING)
        if name is None:
            continue
        value = getattr(settings, name)
        if name.endswith("_ms"):
            if not f.name.endswith("_s"):
                raise TypeError(f"{cls.__name__}.{f.name}: {name} is in ms; the field in s")
            value = value / 1000
        values[f.name] = value
    return cls(**values)
