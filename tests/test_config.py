"""Settings: one variable per field, strict parsing, secrets kept out of repr, bad governance
settings stop the command. (The configuration reference is generated from them:
tests/test_docs.py.)"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

from memsvc import cli
from memsvc.config import ENV_SETTINGS, ConfigError, Settings, env_name, service_config
from memsvc.export.importer import ImportConfig
from memsvc.export.service import ExportConfig
from memsvc.governance.expiry import ExpirySettings
from memsvc.memories.watch import WatchConfig
from memsvc.overload.load import LoadLimits
from memsvc.prefetch.service import PrefetchConfig
from memsvc.prefetch.warmer import WarmConfig
from memsvc.retrieval.recall import RecallConfig
from memsvc.server.runtime import pipeline_settings, worker_settings

# Values for the fields a plain one would not pass validation for (a vocabulary, a choice).
SAMPLES: dict[str, tuple[str, Any]] = {
    "embedder": ("openai", "openai"),
    "extractor": ("openai", "openai"),
    "log_format": ("json", "json"),
    "pii_policy": ("reject,email=store", "reject,email=store"),
    "user_id_pattern": ("[a-z]+", "[a-z]+"),
    "categories": ("Context, preference", ("context", "preference")),
    "roles": ("core,context", ("core", "context")),
    "pii_phone_regions": ("de, fr", ("DE", "FR")),
    "confidence_half_life_days": ("event=3", (("event", 3.0),)),
    "metrics_port": ("off", None),
}


def _sample(name: str, default: Any) -> tuple[str, Any]:
    """A valid value other than the default, as the environment writes it."""
    if name in SAMPLES:
        return SAMPLES[name]
    if isinstance(default, bool):
        return str(not default).lower(), not default
    if isinstance(default, int):
        value = default - 1 if default > 1 else default + 1
        return str(value), value
    if isinstance(default, float):
        value = default * 0.9 if default else 1.5
        return repr(value), value
    if typing.get_type_hints(Settings)[name] in (Path, Path | None):
        return "/srv/memsvc/x", Path("/srv/memsvc/x")
    if default is None:
        return "postgresql://x", "postgresql://x"
    assert isinstance(default, str), name
    return f"{default}-x", f"{default}-x"


@pytest.mark.parametrize("spec", ENV_SETTINGS, ids=lambda s: s.variable)
def test_every_field_is_set_by_its_own_variable(spec: Any) -> None:
    assert spec.variable == "MEMSVC_" + spec.field.upper() == env_name(spec.field)
    default = getattr(Settings(), spec.field)
    raw, expected = _sample(spec.field, default)
    assert expected != default
    changed = Settings.from_env({spec.variable: raw})
    assert getattr(changed, spec.field) == expected
    # Only that field (and a lower limit that follows a smaller upper one) moved.
    moved = {
        name
        for name in Settings.model_fields
        if getattr(changed, name) != getattr(Settings(), name)
    }
    assert moved - {spec.field} <= {
        "pg_pool_min",
        "default_page_size",
        "recall_default_top_k",
        "packet_default_chars",
    }


def test_the_variables_are_those_of_the_fields() -> None:
    assert [s.field for s in ENV_SETTINGS] == list(Settings.model_fields)
    # Names the old hand-kept table had, read the same as ever.
    for name in ("MEMSVC_PG_DSN", "MEMSVC_RRF_K", "MEMSVC_PII_PHONE_REGIONS", "MEMSVC_ROUTING"):
        assert name in {s.variable for s in ENV_SETTINGS}


@pytest.mark.parametrize(
    ("variable", "raw", "words"),
    [
        ("MEMSVC_ROUTING", "sometimes", "expected true/false"),
        ("MEMSVC_RUN_WORKERS", "ture", "expected true/false"),
        ("MEMSVC_GRPC_PORT", "1_000", "expected an integer"),
        ("MEMSVC_GRPC_PORT", "5e4", "expected an integer"),
        ("MEMSVC_GRPC_PORT", "70000", "at most 65535"),
        ("MEMSVC_RECALL_MAX_TOP_K", "-3", ">= 0"),
        ("MEMSVC_MAX_GOALS", "2.0", "expected an integer"),
        ("MEMSVC_HALF_LIFE_DAYS", "nan", "finite"),
        ("MEMSVC_SHUTDOWN_GRACE_S", "inf", "finite"),
        ("MEMSVC_TENANT_RATE_PER_S", "fast", "expected a number"),
        ("MEMSVC_CONFIDENCE_HALF_LIFE_DAYS", "event", "category=days"),
    ],
)
def test_values_are_parsed_strictly(variable: str, raw: str, words: str) -> None:
    with pytest.raises(ConfigError, match=f"^{variable}: .*{words}"):
        Settings.from_env({variable: raw})


def test_booleans_and_empty_values() -> None:
    for raw, expected in (("TRUE", True), ("on", True), ("1", True), ("Off", False), ("no", False)):
        assert Settings.from_env({"MEMSVC_ALLOW_PLAINTEXT": raw}).allow_plaintext is expected
    # An empty variable is an unset one: the default holds.
    assert Settings.from_env({"MEMSVC_AUTH_ENABLED": "", "MEMSVC_GRPC_PORT": " "}) == Settings()


def test_only_from_env_reads_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    # Settings(...) is what the call says, whatever the process's environment holds.
    monkeypatch.setenv("MEMSVC_GRPC_PORT", "1234")
    assert Settings().grpc_port == 50051
    assert Settings.from_env(os.environ).grpc_port == 1234
    # A variable is its exact name: no other spelling sets the field.
    assert Settings.from_env({"memsvc_grpc_port": "1", "MEMSVC_Grpc_Port": "2"}) == Settings()


def test_limits_without_a_variable_before_are_checked() -> None:
    assert Settings.from_env({"MEMSVC_RECALL_MAX_TOP_K": "5"}).recall_default_top_k == 5
    with pytest.raises(ConfigError, match="MEMSVC_RECALL_DEFAULT_TOP_K"):
        Settings.from_env({"MEMSVC_RECALL_DEFAULT_TOP_K": "500"})
    with pytest.raises(ConfigError, match="MEMSVC_MAX_ID_CHARS"):
        Settings.from_env({"MEMSVC_MAX_ID_CHARS": "0"})
    with pytest.raises(ConfigError, match="MEMSVC_DEFAULT_WRITE_DEADLINE_MS"):
        Settings.from_env({"MEMSVC_DEFAULT_WRITE_DEADLINE_MS": "5"})
    with pytest.raises(ConfigError, match="MEMSVC_READS_DEGRADE_QUEUE_MS: must be >= 0"):
        Settings.from_env({"MEMSVC_READS_DEGRADE_QUEUE_MS": "-1"})
    with pytest.raises(ConfigError, match="MEMSVC_READS_DEGRADE_QUEUE_MS must be below"):
        Settings.from_env({"MEMSVC_READS_MAX_QUEUE_MS": "20"})
    assert Settings.from_env({"MEMSVC_READS_MAX_QUEUE_MS": "0"}).reads_degrade_queue_ms == 20


def test_secrets_never_in_repr() -> None:
    secret = {name for name, field in Settings.model_fields.items() if not field.repr}
    assert secret == {"pg_dsn", "redis_url", "openai_api_key", "openai_chat_api_key"}
    settings = Settings.from_env({env_name(name): f"s3cret-{name}" for name in secret})
    assert "s3cret" not in repr(settings) and "s3cret" not in str(settings)


@pytest.mark.parametrize(
    ("variable", "raw", "message"),
    [
        ("MEMSVC_PII_POLICY", "email=maybe", "MEMSVC_PII_POLICY: unknown action 'maybe'"),
        ("MEMSVC_PII_PHONE_REGIONS", "de,xx", "MEMSVC_PII_PHONE_REGIONS: unknown region(s) XX"),
    ],
)
@pytest.mark.parametrize("command", ["serve", "worker", "migrate"])
def test_a_bad_governance_setting_stops_the_command(
    command: str,
    variable: str,
    raw: str,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Without the check each of these would fail on the missing database instead.
    monkeypatch.delenv("MEMSVC_PG_DSN", raising=False)
    monkeypatch.setenv(variable, raw)
    assert cli.main([command]) == 2
    assert f"memsvc: configuration error: {message}" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_memsvc_dev_fails_fast_on_a_bad_pii_policy(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSVC_")}
    env["MEMSVC_PII_POLICY"] = "keep"
    done = subprocess.run(
        [sys.executable, "-m", "memsvc", "dev", "--data-dir", str(tmp_path / "data")],
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 2
    assert "configuration error: MEMSVC_PII_POLICY: unknown action 'keep'" in done.stderr
    assert not (tmp_path / "data").exists()  # no embedded server was started


# Each service's config, as the runtime builds it from Settings.
SERVICE_CONFIGS: dict[str, Any] = {
    "RecallConfig": RecallConfig.from_settings,
    "PrefetchConfig": PrefetchConfig.from_settings,
    "PipelineSettings": pipeline_settings,
    "WorkerSettings": worker_settings,
    "ExpirySettings": lambda s: service_config(s, ExpirySettings),
    "ImportConfig": lambda s: service_config(s, ImportConfig),
    "ExportConfig": lambda s: service_config(s, ExportConfig),
    "WatchConfig": lambda s: service_config(s, WatchConfig),
    "WarmConfig": lambda s: service_config(s, WarmConfig),
    "LoadLimits": LoadLimits.from_settings,
}


@pytest.mark.parametrize("name", sorted(SERVICE_CONFIGS))
def test_service_configs_take_their_settings_by_name(name: str) -> None:
    build = SERVICE_CONFIGS[name]
    marked = [f for f in dataclasses.fields(build(Settings())) if "memsvc.setting" in f.metadata]
    assert marked, name
    for f in marked:
        setting = f.metadata["memsvc.setting"]
        _, value = _sample(setting, getattr(Settings(), setting))
        config = build(Settings().with_overrides(**{setting: value}))
        expected = value / 1000 if setting.endswith("_ms") else value
        assert getattr(config, f.name) == expected, (name, f.name, setting)
