"""Settings: the environment and CLI flags, read once into a frozen object passed explicitly."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

    pg_pool_min: int = 2
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

    # Used when a write RPC arrives without a deadline: writes are bounded too.
    default_write_deadline_ms: int = 5_000
    # Kept back from a call's deadline to serialize and send the answer.
    deadline_margin_ms: int = 10
    shutdown_grace_s: float = 10.0

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
        }
        for env_name, attr in int_fields.items():
            raw = get(env_name)
            if raw is not None:
                values[attr] = _parse_int(f"MEMSVC_{env_name}", raw)
        if (raw := get("AUTH_ENABLED")) is not None:
            values["auth_enabled"] = parse_bool("MEMSVC_AUTH_ENABLED", raw)
        if (raw := get("DATA_DIR")) is not None:
            values["data_dir"] = Path(raw)
        if (raw := get("SHUTDOWN_GRACE_S")) is not None:
            values["shutdown_grace_s"] = float(_parse_int("MEMSVC_SHUTDOWN_GRACE_S", raw))
        if (raw := get("CATEGORIES")) is not None:
            values["categories"] = _parse_csv(raw)
        if (raw := get("ROLES")) is not None:
            values["roles"] = _parse_csv(raw)
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
        if self.pg_pool_min > self.pg_pool_max:
            raise ConfigError("MEMSVC_PG_POOL_MIN must not exceed MEMSVC_PG_POOL_MAX")
