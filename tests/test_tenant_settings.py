"""Per-tenant governance settings: the table, the cached resolution, and `memsvc tenants`."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from memsvc import cli
from memsvc.config import ConfigError, Settings
from memsvc.governance.policy import (
    PII_KINDS,
    PolicyError,
    TenantPolicies,
    parse_pii_overrides,
    parse_pii_policy,
)
from memsvc.server.runtime import pii_defaults
from memsvc.storage import tenant_settings


def test_policy_spec_parsing() -> None:
    assert parse_pii_policy("redact") == dict.fromkeys(PII_KINDS, "redact")
    policy = parse_pii_policy("store, card_number=reject,EMAIL=redact")
    assert policy["card_number"] == "reject" and policy["email"] == "redact"
    assert policy["phone"] == "store"
    assert parse_pii_overrides("email=store") == {"email": "store"}
    assert parse_pii_overrides("reject") == dict.fromkeys(PII_KINDS, "reject")
    for bad in ("keep", "email=keep", "ssn=redact", "email=store,reject"):
        with pytest.raises(PolicyError):
            parse_pii_policy(bad)
    with pytest.raises(ConfigError, match="MEMSVC_PII_POLICY"):
        pii_defaults(Settings.from_env({"MEMSVC_PII_POLICY": "email=maybe"}))
    assert Settings.from_env({"MEMSVC_MESSAGE_TTL_DAYS": "7"}).message_ttl_s == 7 * 86_400


async def test_overrides_merge_and_the_cache_expires(pool: asyncpg.Pool) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    policies = TenantPolicies(
        pool, default_pii=parse_pii_policy("redact"), default_message_ttl_s=90, cache_s=3600
    )
    before = await policies.get(tenant)
    assert before.action("email") == "redact" and before.message_ttl_s == 90

    await tenant_settings.save(pool, tenant, pii_policy={"email": "store"}, message_ttl_s=0)
    await tenant_settings.save(pool, tenant, pii_policy={"card_number": "reject"})
    assert (await policies.get(tenant)).action("email") == "redact"  # still cached
    policies.forget(tenant)
    after = await policies.get(tenant)
    assert after.action("email") == "store"
    assert after.action("card_number") == "reject"
    assert after.action("phone") == "redact"
    assert after.message_ttl_s == 0  # kept by the second save

    await tenant_settings.save(pool, tenant, clear_message_ttl=True)
    policies.forget()
    assert (await policies.get(tenant)).message_ttl_s == 90
    # Another tenant is untouched.
    assert (await policies.get(tenant + "-other")).action("email") == "redact"


def test_cli_sets_and_shows(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert settings.pg_dsn is not None
    monkeypatch.setenv("MEMSVC_PG_DSN", settings.pg_dsn)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    args = ["tenants", "set", "--tenant", tenant, "--pii", "email=store"]
    assert cli.main([*args, "--message-ttl-days", "30"]) == 0
    out = capsys.readouterr().out
    assert "message ttl: 30 days" in out
    assert "email=store" in out and "card_number=redact" in out
    assert cli.main(["tenants", "show", "--tenant", tenant]) == 0
    assert "email=store" in capsys.readouterr().out
    assert cli.main(["tenants", "set", "--tenant", tenant, "--pii", "email=forget"]) == 2
    assert "unknown action" in capsys.readouterr().err
