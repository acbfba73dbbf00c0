"""PII screening before saving: the detectors (positives and near-misses), the checksums, the
policy arithmetic, and every write path end to end over gRPC (Remember, Correct, Ingest)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import MappingProxyType

import asyncpg
import grpc
import pytest
from prometheus_client import REGISTRY
from stdnum import luhn

from memsvc.config import ConfigError, Settings
from memsvc.governance import pii
from memsvc.governance.policy import PII_KINDS, parse_pii_policy
from memsvc.server.app import MemsvcServer
from memsvc.server.runtime import pii_defaults
from memsvc.storage import tenant_settings
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import ingest, msg

REDACT_ALL = MappingProxyType(parse_pii_policy("redact"))
CARD = "4111 1111 1111 1111"
PHONE = "(415) 555-0132"
EMAIL = "alice.smith@example.com"
ALICE = pb.Scope(user_id="alice")
STRIPE = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GITHUB = "ghp_1234567890abcdefghijklmnopqrstuvwxyzAB"
SLACK = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
PRIVATE_KEY = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7x\n-----END RSA PRIVATE KEY-----"

# (text, kind, the clear value that must disappear)
POSITIVES = [
    ("My card is 4111 1111 1111 1111, expires 12/25", "card_number", "4111 1111 1111 1111"),
    ("card 4539-1488-0343-6467 please", "card_number", "4539-1488-0343-6467"),
    ("amex 3782 822463 10005", "card_number", "3782 822463 10005"),
    ("pay with 5555555555554444 today", "card_number", "5555555555554444"),
    ("the CVV is 737", "card_number", "737"),
    ("My SSN is 219-44-1234", "government_id", "219-44-1234"),
    ("my social security number is 219 44 1234", "government_id", "219 44 1234"),
    ("NI number AB 12 34 56 C", "government_id", "AB 12 34 56 C"),
    ("my passport number is X1234567", "government_id", "X1234567"),
    ("Passport: 533380006", "government_id", "533380006"),
    ("driver's license D1234-56789-01234", "government_id", "D1234-56789-01234"),
    ("IBAN GB82 WEST 1234 5698 7654 32 thanks", "bank_account", "GB82 WEST 1234 5698 7654 32"),
    ("send it to DE89370400440532013000", "bank_account", "DE89370400440532013000"),
    ("account number 31926819, sort code 60-16-13", "bank_account", "31926819"),
    ("routing number 021000021", "bank_account", "021000021"),
    ("my password is hunter2.", "password", "hunter2"),
    ("my password for netflix is Tr0ub4dor&3", "password", "Tr0ub4dor&3"),
    ("the wifi password is 'correct horse battery'", "password", "correct horse battery"),
    ("PIN is 1234", "password", "1234"),
    ("the door code is 4821", "password", "4821"),
    # Issue 31: credentials of the common providers were stored in clear.
    ("my stripe key is sk_live_4eC39HqLyjWDarjtT1zdp7dc, keep it", "secret", STRIPE),
    ("test with sk_test_51H8abcdEFGHijklMNOP1234", "secret", "sk_test_51H8abcdEFGHijklMNOP1234"),
    (f"aws key {AWS_ID} secret {AWS_SECRET}", "secret", AWS_ID),
    (f"my token is {GITHUB}", "secret", GITHUB),
    (
        "use github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
        "secret",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    ),
    (f"the slack bot token {SLACK}", "secret", SLACK),
    (
        "openai sk-proj-abcdefghijklmnopqrstuvwxyz123456",
        "secret",
        "sk-proj-abcdefghijklmnopqrstuvwxyz123456",
    ),
    ("the api key is 9f8e7d6c5b4a3f2e1d0c", "secret", "9f8e7d6c5b4a3f2e1d0c"),
    (f"here: {PRIVATE_KEY} done", "secret", PRIVATE_KEY),
    ("verification code 482913", "one_time_code", "482913"),
    ("OTP: 4821", "one_time_code", "4821"),
    ("the code they sent me is 482 913", "one_time_code", "482 913"),
    ("email me at alice.smith+tag@example.co.uk.", "email", "alice.smith+tag@example.co.uk"),
    ("call me at (415) 555-0132", "phone", "(415) 555-0132"),
    ("my number is +44 20 7946 0958", "phone", "+44 20 7946 0958"),
    ("text me on 07911 123456", "phone", "07911 123456"),
    ("my mobile is 2025550147", "phone", "2025550147"),
    ("ring +33 6 12 34 56 78 after six", "phone", "+33 6 12 34 56 78"),
]

NEAR_MISSES = [
    "order 4539 1488 0343 6468",  # fails Luhn by one digit
    "Order #4111 1111 1111 1111",
    "order number 2125550199",
    "tracking 1Z999AA10123456784",
    "tracking number 9400 1000 0000 0000 0000 00",
    "ticket #A-10293",
    "invoice INV-2024-000123",
    "reference 123-45-6789",
    "ISBN 978-3-16-148410-0",
    "SKU 123456789012",
    "timestamp 1710489600000",
    "we met on 2024-03-15",
    "we met on 15/03/2024 at 10:30",
    "I was born on 03/15/1990",
    "the meeting is 14:00-15:30",
    "it cost $1,299.99",
    "it cost £12,500,000",
    "1,234,567.89 in total",
    "I moved there in 1999",
    "between 2019 and 2023",
    "version 3.2.1",
    "zip 94103",
    "zip 94103-1234",
    "room 1204",
    "I bought 12000 units",
    "I walked 10,000 steps in 45:30",
    "I have 1234567 points",
    "dial 555-0100",
    "Call 911",
    "ip 192.168.1.1",
    "coordinates 40.7128, -74.0060",
    "the score was 3-2",
    "flight BA 2490 at 18:45, gate B22",
    "my password is too long",
    "I use a password manager",
    "I forgot my password again",
    "my PIN is wrong",
    "pin this to the top",
    "my passport expires 2030-01-01",
    "my driver's license was renewed in 2021",
    "the account was opened in 2019",
    "my bank account is with Chase",
    "routing number 123456789",  # fails the ABA checksum
    "zip code is 94103",
    "the code is on line 42",
    "my phone is broken",
    "@alice on twitter",
    "my combination of skills",
    # Not credentials: words after "secret" or "token", prefixes without a key.
    "my secret is that I love cake",
    "the secret ingredient is love",
    "the token is expired",
    "I bought tokens for the arcade",
    "ask_live_abcdefghijklm",
    "task-1234567890abcdefghijk",
    "my api key is in the vault",
]


def found(text: str) -> list[tuple[str, str]]:
    return [(text[s.start : s.end], s.kind) for s in pii.detect(text)]


# -- detectors and arithmetic ------------------------------------------------------------------


def test_card_checks() -> None:
    # Luhn (python-stdnum's): one digit off, or two adjacent digits swapped (the commonest
    # typo), is not a card.
    assert found("card 4539 1488 0343 6467") == [("4539 1488 0343 6467", "card_number")]
    assert found("card 4539 1488 0343 6468") == []
    assert found("card 4539 1488 0343 6476") == []
    # Luhn alone is not enough: the prefix must belong to a card network of that length.
    assert luhn.is_valid("1234567812345670") and found("card 1234 5678 1234 5670") == []
    assert luhn.is_valid("411111111111116") and found("card 411111111111116") == []
    assert not pii.card_prefix_valid("1234567812345670")
    assert not pii.card_prefix_valid("411111111111116")  # Visa is 13, 16 or 19 digits
    assert pii.card_prefix_valid("378282246310005") and pii.card_prefix_valid("4111111111111111")


def test_iban_routing_and_ssn_checks() -> None:
    gb = "GB82 WEST 1234 5698 7654 32"
    assert found(f"IBAN {gb}") == [(gb, "bank_account")]
    # The match may run on into the next word: the IBAN is the prefix of the country's length.
    assert found(f"IBAN {gb} THANKS") == [(gb, "bank_account")]
    assert found("IBAN NO93 8601 1117 947") == [("NO93 8601 1117 947", "bank_account")]
    assert found("IBAN GB82 WEST 1234 5698 7654 33") == []  # mod 97
    assert found("IBAN GB82WEST12345698765432X") == []  # too long for GB
    # Right length and mod 97, but not GB's layout (a four-letter bank code, then digits)...
    assert found("IBAN GB531234WEST5698765432") == []
    # ...and a Norwegian account number whose national MOD11 check digit is wrong.
    assert found("IBAN NO6686011117948") == []
    assert found("routing number 021000021") == [("021000021", "bank_account")]
    assert found("routing number 021000022") == []
    assert found("codes 219-44-1234") == [("219-44-1234", "government_id")]
    # Never issued (area 000, 666, 9xx; group 00; serial 0000) or published and void.
    never = "000-12-3456, 666-12-3456, 900-12-3456, 219-00-1234, 219-44-0000"
    assert found(f"codes {never}, 078-05-1120 or 457-55-5462") == []


@pytest.mark.parametrize(("text", "kind", "value"), POSITIVES)
def test_positives_are_redacted(text: str, kind: str, value: str) -> None:
    assert (value, kind) in found(text)
    screened = pii.screen(text, REDACT_ALL)
    assert value not in screened.text
    assert pii.placeholder(kind) in screened.text
    assert screened.redactions == (kind,) and screened.rejected_kinds == ()


@pytest.mark.parametrize("text", NEAR_MISSES)
def test_near_misses_pass_untouched(text: str) -> None:
    assert found(text) == []
    assert pii.screen(text, REDACT_ALL).text == text


def test_labels_are_visible_and_each_span_is_replaced() -> None:
    text = f"Card {CARD}, email {EMAIL}, phone {PHONE}, card again 5555 5555 5555 4444."
    screened = pii.screen(text, REDACT_ALL)
    assert screened.text == (
        "Card [redacted card number], email [redacted email], phone [redacted phone number],"
        " card again [redacted card number]."
    )
    assert screened.redactions == ("card_number", "email", "phone")
    assert screened.labels == ("card number", "email", "phone number")
    assert [p for k in PII_KINDS if (p := pii.placeholder(k))] == [
        "[redacted card number]",
        "[redacted government id]",
        "[redacted bank account]",
        "[redacted password]",
        "[redacted secret]",
        "[redacted one-time code]",
        "[redacted email]",
        "[redacted phone number]",
    ]


def test_an_aws_key_pair_is_redacted_whole() -> None:
    for between in (" secret ", " / ", " with secret key: ", "\n"):
        text = f"{AWS_ID}{between}{AWS_SECRET}"
        screened = pii.screen(text, REDACT_ALL)
        assert AWS_ID not in screened.text and AWS_SECRET not in screened.text, screened.text
        assert screened.redactions == ("secret",)


def test_damaged_placeholders_still_name_their_kind() -> None:
    # A parser that edited inside a placeholder leaves its first word: still that kind.
    assert pii.placeholder_kinds("SSN [redacted government the userd]") == ("government_id",)
    assert pii.placeholder_kinds("[ redacted secret") == ("secret",)
    assert pii.placeholder_kinds("I redacted email addresses") == ()
    # The placeholders module (kept light for the parser process) knows every kind, in order.
    assert tuple(pii.LABELS) == PII_KINDS and tuple(pii.NOUNS) == PII_KINDS


def test_policy_actions() -> None:
    text = f"my card {CARD} and my email {EMAIL}"
    policy = parse_pii_policy("store,card_number=reject")
    screened = pii.screen(text, policy)
    assert screened.rejected_kinds == ("card_number",) and screened.redactions == ()
    assert CARD not in screened.text and EMAIL in screened.text  # rejected spans never linger
    assert screened.kept
    # Core memory: "store" is redacted; where a write cannot be refused, "reject" redacts.
    core = pii.screen(text, policy, core=True, may_reject=False)
    assert core.redactions == ("card_number", "email") and core.rejected_kinds == ()
    assert EMAIL not in core.text and not core.kept
    assert pii.screen(text, parse_pii_policy("store")).text == text


def test_screen_of_a_long_text_is_quick_enough_and_exact() -> None:
    text = (f"Lunch on 2024-03-15 cost $12.50, call {PHONE}; order 12345. " * 40)[:2000]
    screened = pii.screen(text, REDACT_ALL)
    assert PHONE not in screened.text and "$12.50" in screened.text
    assert screened.text.count("[redacted phone number]") == text.count(PHONE)


def test_phone_regions_setting() -> None:
    berlin = "call me on 030 901820"
    assert found(berlin) == []  # not a US or UK number
    assert pii.detect(berlin, phone_regions=("DE",)) == [pii.Span(11, 21, "phone")]
    assert found("call me on +49 30 901820") == [("+49 30 901820", "phone")]
    settings = Settings.from_env({"MEMSVC_PII_PHONE_REGIONS": "de, fr"})
    assert settings.pii_phone_regions == ("DE", "FR")
    assert Settings().pii_phone_regions == ("US", "GB")
    # The region vocabulary is libphonenumber's, checked where the screen is built.
    with pytest.raises(ConfigError, match="MEMSVC_PII_PHONE_REGIONS: unknown region"):
        pii_defaults(Settings.from_env({"MEMSVC_PII_PHONE_REGIONS": "de,xx"}))


# -- end to end ----------------------------------------------------------------------------------


def _metric(kind: str, action: str, path: str) -> float:
    value = REGISTRY.get_sample_value(
        "memsvc_pii_screened_total", {"kind": kind, "action": action, "path": path}
    )
    return value or 0.0


async def _policy(server: MemsvcServer, pool: asyncpg.Pool, caller: Caller, spec: str) -> None:
    await tenant_settings.save(pool, caller.tenant_id, pii_policy=parse_pii_policy(spec))
    server.runtime.policies.forget(caller.tenant_id)


async def _contents(caller: Caller, *, superseded: bool = False) -> list[str]:
    page = await caller.stub.ListMemories(
        pb.ListMemoriesRequest(scope=ALICE, include_superseded=superseded, page_size=500)
    )
    return [m.content for m in page.memories]


async def _stored_anywhere(pool: asyncpg.Pool, tenant: str, value: str) -> list[str]:
    """Every stored memory, episode or topic text of the tenant that holds ``value``."""
    rows = await pool.fetch(
        """
        SELECT content || ' ' || subject || ' ' || object || ' ' || correction_reason AS t
        FROM memories WHERE tenant_id = $1
        UNION ALL SELECT title || ' ' || summary || ' ' || excerpt FROM episodes
        WHERE tenant_id = $1
        UNION ALL SELECT name FROM topics WHERE tenant_id = $1
        """,
        tenant,
    )
    return [r["t"] for r in rows if value.lower() in r["t"].lower()]


async def test_remember_redacts_content_and_triple(caller: Caller, pool: asyncpg.Pool) -> None:
    before = _metric("card_number", "redact", "remember")
    reply = await caller.stub.Remember(
        pb.RememberRequest(
            scope=ALICE,
            content=f"Pays with card {CARD}; receipts go to {EMAIL}",
            subject="user",
            predicate="pays_with",
            object=f"card {CARD}",
        )
    )
    assert list(reply.redactions) == ["card number", "email"]
    assert reply.memory.content == (
        "Pays with card [redacted card number]; receipts go to [redacted email]"
    )
    assert reply.memory.object == "card [redacted card number]"
    assert _metric("card_number", "redact", "remember") == before + 2
    assert await _contents(caller) == [reply.memory.content]
    assert await _stored_anywhere(pool, caller.tenant_id, "4111") == []
    assert await _stored_anywhere(pool, caller.tenant_id, EMAIL) == []
    # Recall cannot find the clear value: neither lexically nor by meaning.
    for query in (CARD, "4111111111111111", EMAIL, "which card does she pay with"):
        recall = await caller.stub.Recall(pb.RecallRequest(scope=ALICE, query=query, top_k=20))
        assert all("4111" not in i.text and EMAIL not in i.text for i in recall.items)
    # The same text again reinforces the redacted memory (dedup is of the stored text).
    again = await caller.stub.Remember(
        pb.RememberRequest(scope=ALICE, content=f"Pays with card {CARD}; receipts go to {EMAIL}")
    )
    assert again.reinforced and again.memory.memory_id == reply.memory.memory_id
    plain = await caller.stub.Remember(pb.RememberRequest(scope=ALICE, content="Likes jazz"))
    assert list(plain.redactions) == []


async def test_reject_writes_nothing(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool
) -> None:
    await _policy(server, pool, caller, "redact,card_number=reject,government_id=reject")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Remember(
            pb.RememberRequest(scope=ALICE, content=f"My card is {CARD} and I like tea")
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == (
        "content contains a payment card number, which this tenant does not store; "
        "nothing was written"
    )
    assert CARD not in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Remember(
            pb.RememberRequest(
                scope=ALICE,
                content="Has an SSN",
                subject="user",
                predicate="ssn",
                object="219-44-1234",
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "object contains a government id number" in (err.value.details() or "")
    assert await _contents(caller, superseded=True) == []
    # The kinds the tenant did not reject are still redacted.
    ok = await caller.stub.Remember(pb.RememberRequest(scope=ALICE, content=f"Mail {EMAIL}"))
    assert list(ok.redactions) == ["email"]


async def test_correct_redacts_content_and_reason_and_rejects(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool
) -> None:
    first = (
        await caller.stub.Remember(pb.RememberRequest(scope=ALICE, content="Lives alone"))
    ).memory
    corrected = await caller.stub.Correct(
        pb.CorrectRequest(
            scope=ALICE,
            memory_id=first.memory_id,
            new_content=f"Lives with Sam, reachable on {PHONE}",
            reason=f"she emailed from {EMAIL}",
        )
    )
    assert corrected.content == "Lives with Sam, reachable on [redacted phone number]"
    assert corrected.correction_reason == "she emailed from [redacted email]"
    assert await _stored_anywhere(pool, caller.tenant_id, "555-0132") == []

    await _policy(server, pool, caller, "redact,phone=reject")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Correct(
            pb.CorrectRequest(
                scope=ALICE, memory_id=corrected.memory_id, new_content=f"Call {PHONE} instead"
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == (
        "new_content contains a phone number, which this tenant does not store; nothing was written"
    )
    history = await caller.stub.GetMemoryHistory(
        pb.GetMemoryHistoryRequest(scope=ALICE, memory_id=corrected.memory_id)
    )
    assert len(history.versions) == 2  # the refused correction wrote no version
    assert await _contents(caller) == [corrected.content]


async def test_policy_is_per_tenant(
    new_caller: Callable[[], Awaitable[Caller]], server: MemsvcServer, pool: asyncpg.Pool
) -> None:
    storer, rejecter, default = await new_caller(), await new_caller(), await new_caller()
    await _policy(server, pool, storer, "redact,email=store")
    await _policy(server, pool, rejecter, "redact,email=reject")
    content = f"Work email is {EMAIL}"
    kept = await storer.stub.Remember(pb.RememberRequest(scope=ALICE, content=content))
    assert kept.memory.content == content and list(kept.redactions) == []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await rejecter.stub.Remember(pb.RememberRequest(scope=ALICE, content=content))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    redacted = await default.stub.Remember(pb.RememberRequest(scope=ALICE, content=content))
    assert redacted.memory.content == "Work email is [redacted email]"
    assert await _contents(rejecter) == []


async def test_core_memory_never_holds_screened_data_even_under_store(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool
) -> None:
    await _policy(server, pool, caller, "store")
    ordinary = await caller.stub.Remember(
        pb.RememberRequest(scope=ALICE, content=f"Old landline {PHONE}", role="detail")
    )
    assert ordinary.memory.content == f"Old landline {PHONE}"  # "store" means stored
    pinned = await caller.stub.Remember(
        pb.RememberRequest(scope=ALICE, content=f"Primary phone {PHONE}", pinned=True)
    )
    core = await caller.stub.Remember(
        pb.RememberRequest(scope=ALICE, content=f"Card on file {CARD}", role="core")
    )
    assert pinned.memory.content == "Primary phone [redacted phone number]"
    assert list(pinned.redactions) == ["phone number"]
    assert core.memory.content == "Card on file [redacted card number]"
    # A correction of a core memory is screened as core; of an ordinary one, by the policy.
    fixed_core = await caller.stub.Correct(
        pb.CorrectRequest(
            scope=ALICE, memory_id=pinned.memory.memory_id, new_content=f"Primary mail {EMAIL}"
        )
    )
    assert fixed_core.content == "Primary mail [redacted email]" and fixed_core.pinned
    fixed = await caller.stub.Correct(
        pb.CorrectRequest(
            scope=ALICE, memory_id=ordinary.memory.memory_id, new_content=f"Old mail {EMAIL}"
        )
    )
    assert fixed.content == f"Old mail {EMAIL}"
    rows = await pool.fetch(
        "SELECT content FROM memories WHERE tenant_id = $1 AND (pinned OR role = 'core')",
        caller.tenant_id,
    )
    assert rows and all("[redacted" in r["content"] for r in rows)


async def _status(caller: Caller, ingest_id: str) -> pb.ExtractionOutcome:
    status = await caller.stub.GetIngestStatus(
        pb.GetIngestStatusRequest(ingest_id=ingest_id, scope=ALICE)
    )
    assert status.state == pb.INGEST_STATE_DONE
    return status.outcome


TURNS = (
    f"I want to call my mom at {PHONE}",  # a context fact
    f"Remember that my card number is {CARD}",  # a core fact
    "I love hiking",
)


async def test_ingest_redacts_facts_and_episodes(
    caller: Caller, pool: asyncpg.Pool, drain: Callable[[], Awaitable[int]]
) -> None:
    # The messages are redacted at Ingest: extraction then sees only placeholders.
    before = _metric("phone", "redact", "ingest")
    reply = await ingest(caller, [msg("alice", t) for t in TURNS], end_of_session=True)
    assert await drain() >= 1
    outcome = await _status(caller, reply.ingest_id)
    assert outcome.redacted == 3  # two facts and the episode
    assert outcome.pii_rejected == 0 and outcome.added == 3
    assert _metric("phone", "redact", "ingest") > before
    contents = await _contents(caller)
    assert "The user wants to call their mom at [redacted phone number]." in contents
    assert "The user's card number is [redacted card number]." in contents
    assert "The user loves hiking." in contents
    assert await _stored_anywhere(pool, caller.tenant_id, "4111") == []
    assert await _stored_anywhere(pool, caller.tenant_id, "555-0132") == []
    episode = await pool.fetchrow(
        "SELECT title, summary, excerpt FROM episodes WHERE tenant_id = $1", caller.tenant_id
    )
    assert episode is not None and "[redacted phone number]" in episode["excerpt"]


async def test_ingest_reject_drops_the_fact_and_redacts_the_episode(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool, drain: Callable[[], Awaitable[int]]
) -> None:
    await _policy(server, pool, caller, "redact,card_number=reject,phone=reject")
    reply = await ingest(caller, [msg("alice", t) for t in TURNS], end_of_session=True)
    assert await drain() >= 1
    outcome = await _status(caller, reply.ingest_id)
    assert outcome.pii_rejected == 2 and outcome.added == 1
    assert outcome.redacted == 1  # the episode: its text is redacted, never refused
    assert await _contents(caller) == ["The user loves hiking."]
    assert await _stored_anywhere(pool, caller.tenant_id, "4111") == []
    assert await _stored_anywhere(pool, caller.tenant_id, "555-0132") == []


async def test_ingest_under_store_keeps_ordinary_facts_but_not_core_ones(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool, drain: Callable[[], Awaitable[int]]
) -> None:
    await _policy(server, pool, caller, "store")
    reply = await ingest(caller, [msg("alice", t) for t in TURNS], end_of_session=True)
    assert await drain() >= 1
    outcome = await _status(caller, reply.ingest_id)
    assert outcome.redacted == 1 and outcome.pii_rejected == 0
    contents = await _contents(caller)
    assert f"The user wants to call their mom at {PHONE}." in contents
    assert "The user's card number is [redacted card number]." in contents  # role core


# -- issue 31: secrets, atomic placeholders ------------------------------------------------


async def _everything_stored(pool: asyncpg.Pool, tenant: str) -> str:
    """Every row of every table the tenant has rows in, as text: each stored copy."""
    tables = await pool.fetch(
        "SELECT table_name FROM information_schema.columns"
        " WHERE column_name = 'tenant_id' AND table_schema = 'public'"
    )
    out = []
    for t in tables:
        rows = await pool.fetch(
            f"SELECT t::text AS row FROM {t['table_name']} t WHERE tenant_id = $1", tenant
        )
        out += [r["row"] for r in rows]
    return "\n".join(out)


SECRET_TURNS = (
    f"My Stripe live key is {STRIPE}, and I keep it in my notes.",
    f"The AWS access key is {AWS_ID} with secret {AWS_SECRET} for my backups.",
    f"Remember that my GitHub token is {GITHUB}",
)
SECRETS = (STRIPE, AWS_ID, AWS_SECRET, GITHUB, "4eC39HqLyjWD", "K7MDENG")


async def test_secrets_are_never_stored_in_clear(
    caller: Caller, pool: asyncpg.Pool, drain: Callable[[], Awaitable[int]]
) -> None:
    # Issue 31: API keys and tokens in an utterance ended up in facts, messages, episode
    # excerpts and core blocks: there was no PII kind for them.
    reply = await ingest(caller, [msg("alice", t) for t in SECRET_TURNS], end_of_session=True)
    assert reply.redacted == 3
    remembered = await caller.stub.Remember(
        pb.RememberRequest(scope=ALICE, content=f"Deploy key: sk_test_{STRIPE[8:]} for staging")
    )
    assert "[redacted secret]" in remembered.memory.content
    block = await caller.stub.UpdateCoreBlock(
        pb.UpdateCoreBlockRequest(
            scope=ALICE,
            block=pb.CORE_BLOCK_KIND_HUMAN,
            mode=pb.CORE_BLOCK_MODE_REPLACE,
            text=f"Alice's CI token is {GITHUB}.",
        )
    )
    assert "[redacted secret]" in block.block.text
    assert await drain() >= 1
    assert (await _status(caller, reply.ingest_id)).redacted >= 1
    stored = await _everything_stored(pool, caller.tenant_id)
    assert "[redacted secret]" in stored
    leaked = [s for s in SECRETS if s in stored]
    assert leaked == []


async def test_reject_secret_refuses_remember_without_echoing_it(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool
) -> None:
    await _policy(server, pool, caller, "redact,secret=reject")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Remember(pb.RememberRequest(scope=ALICE, content=f"key {STRIPE}"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details() or ""
    assert "API key" in details and STRIPE not in details
    assert await _contents(caller) == []


async def test_a_placeholder_is_atomic_and_reject_holds_for_it(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool, drain: Callable[[], Awaitable[int]]
) -> None:
    # Issue 31: the extractor rendered "[redacted government id]" as "[redacted government
    # the userd]" (spaCy reads "id" as "I'd"), so with government_id=reject the fact was no
    # longer recognised as holding that kind and was stored.
    said = "My SSN is 219-44-1234 and I live in Lisbon."
    reply = await ingest(caller, [msg("alice", said)])
    assert await drain() >= 1
    # One fact per clause (issue 29); the placeholder is copied whole into its fact.
    assert "The user's SSN is [redacted government id]." in await _contents(caller)
    await _policy(server, pool, caller, "redact,government_id=reject")
    other = await ingest(
        caller,
        [msg("bob", "My passport number is X1234567 and it expires in May.")],
        user="bob",
    )
    assert await drain() >= 1
    outcome = (
        await caller.stub.GetIngestStatus(
            pb.GetIngestStatusRequest(ingest_id=other.ingest_id, scope=pb.Scope(user_id="bob"))
        )
    ).outcome
    assert outcome.pii_rejected >= 1
    stored = await _everything_stored(pool, caller.tenant_id)
    assert "userd" not in stored
    bob = await caller.stub.ListMemories(pb.ListMemoriesRequest(scope=pb.Scope(user_id="bob")))
    assert all("redacted" not in m.content for m in bob.memories), bob.memories
    assert reply.ingest_id
