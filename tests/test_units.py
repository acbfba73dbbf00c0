"""Pure pieces: settings parsing, normalisation, cache keys, page tokens, budgets."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import pytest

from memsvc.cache.keys import packet_key, user_index_key, user_tag
from memsvc.concurrency.deadline import Budget
from memsvc.config import ConfigError, Settings, parse_bool
from memsvc.errors import InvalidArgument
from memsvc.server import validate
from memsvc.storage.normalize import content_hash, normalize_content


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("true", True), ("1", True), ("ON", True), ("false", False), ("0", False), ("no", False)],
)
def test_parse_bool_is_strict(raw: str, expected: bool) -> None:
    assert parse_bool("X", raw) is expected


def test_parse_bool_rejects_typos() -> None:
    with pytest.raises(ConfigError, match="MEMSVC_AUTH_ENABLED"):
        Settings.from_env({"MEMSVC_AUTH_ENABLED": "flase"})


def test_settings_from_env() -> None:
    s = Settings.from_env(
        {
            "MEMSVC_GRPC_PORT": "6000",
            "MEMSVC_AUTH_ENABLED": "false",
            "MEMSVC_CATEGORIES": "preference, context ,Goal",
            "MEMSVC_PG_DSN": "postgresql://secret@db/x",
            "MEMSVC_OPENAI_API_KEY": "sk-secret",
        }
    )
    assert s.grpc_port == 6000 and s.auth_enabled is False
    assert s.categories == ("preference", "context", "goal")
    assert "secret" not in repr(s)


@pytest.mark.parametrize(
    "env",
    [
        {"MEMSVC_GRPC_PORT": "abc"},
        {"MEMSVC_EMBEDDER": "magic"},
        {"MEMSVC_CATEGORIES": "preference"},
        {"MEMSVC_PG_POOL_MIN": "50", "MEMSVC_PG_POOL_MAX": "5"},
    ],
)
def test_bad_settings_fail_loudly(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        Settings.from_env(env)


def test_normalisation_and_exact_duplicate_key() -> None:
    assert normalize_content("  a\n\t b  ") == "a b"
    assert content_hash("I like tea.") == content_hash("i  like TEA")
    assert content_hash("I like tea") != content_hash("I like teas")
    # NFC: composed and decomposed é are the same statement.
    assert content_hash("café") == content_hash("cafe\u0301")


def test_cache_keys_share_one_cluster_slot_per_user() -> None:
    tag = user_tag("t1", "alice")
    assert tag.startswith("{") and tag.endswith("}")
    assert tag in packet_key("t1", "alice", "shape") and tag in user_index_key("t1", "alice")
    assert user_tag("t1", "alice") != user_tag("t2", "alice")
    # Separator injection cannot make two different (tenant, user) pairs collide.
    assert user_tag("a:b", "c") != user_tag("a", "b:c")
    assert user_tag("{x}", "y").count("{") == 1
    assert packet_key("t", "u", "s1") != packet_key("t", "u", "s2")


def test_page_token_round_trip_and_garbage() -> None:
    after = (datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC), uuid.uuid4())
    listing = "a-listing"
    assert validate.decode_page_token(validate.encode_page_token(after, listing), listing) == after
    for bad in ("", "!!!", "bm90IGpzb24=", "WzFd"):
        with pytest.raises(InvalidArgument):
            validate.decode_page_token(bad, listing)
    with pytest.raises(InvalidArgument, match="another listing"):
        validate.decode_page_token(validate.encode_page_token(after, "other"), listing)


def test_budget_shrinks_and_keeps_a_margin() -> None:
    b = Budget.from_remaining(None, default_ms=200, margin_ms=10)
    assert 0.18 < b.remaining() <= 0.19
    assert b.cap(0.05) == pytest.approx(0.05)
    assert Budget.from_remaining(0.005, default_ms=800, margin_ms=10).expired
    short = Budget(0.01)
    time.sleep(0.02)
    assert short.remaining() == 0.0 and short.expired


def test_vocabulary_is_case_insensitive_and_closed() -> None:
    allowed = ("preference", "context")
    assert validate.vocabulary("Preference", "category", allowed, "context") == "preference"
    assert validate.vocabulary("", "category", allowed, "context") == "context"
    with pytest.raises(InvalidArgument, match="one of preference, context"):
        validate.vocabulary("gossip", "category", allowed, "context")
