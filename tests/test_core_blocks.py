"""Core blocks (issue 15 item 1): the persona and human blocks of an exact scope, their limits
and history, self-editing by the agent, the human block's core facts within its limit, and
Prefetch rendering them first (persona block under its authorship disclaimer)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import grpc
import pytest

from memsvc import cli
from memsvc.client import MemoryClient
from memsvc.config import Settings
from memsvc.server.app import MemsvcServer
from memsvc.storage import tenant_settings
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import ingest, msg

C = grpc.StatusCode
PERSONA, HUMAN = pb.CORE_BLOCK_KIND_PERSONA, pb.CORE_BLOCK_KIND_HUMAN
REPLACE, APPEND = pb.CORE_BLOCK_MODE_REPLACE, pb.CORE_BLOCK_MODE_APPEND
ALICE = pb.Scope(user_id="alice")
AVA = pb.Scope(user_id="alice", persona_id="ava", agent_id="a1")
DISCLAIMER = "written about the persona, possibly by other people, not by the persona itself"


def words(word: str, length: int) -> str:
    return (f"{word} " * length)[:length].strip()[:length].ljust(length, "x")


async def update(caller: Caller, **fields: Any) -> pb.UpdateCoreBlockResponse:
    fields.setdefault("scope", ALICE)
    fields.setdefault("mode", REPLACE)
    reply: pb.UpdateCoreBlockResponse = await caller.stub.UpdateCoreBlock(
        pb.UpdateCoreBlockRequest(**fields)
    )
    return reply


async def blocks(caller: Caller, scope: pb.Scope = ALICE) -> pb.GetCoreBlocksResponse:
    reply: pb.GetCoreBlocksResponse = await caller.stub.GetCoreBlocks(
        pb.GetCoreBlocksRequest(scope=scope)
    )
    return reply


async def history(
    caller: Caller, block: int, scope: pb.Scope = ALICE, **fields: Any
) -> list[pb.CoreBlockRevision]:
    reply = await caller.stub.GetCoreBlockHistory(
        pb.GetCoreBlockHistoryRequest(scope=scope, block=block, **fields)
    )
    return list(reply.revisions)


async def refused(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value


async def remember(caller: Caller, content: str, sc: pb.Scope = ALICE, **f: Any) -> pb.Memory:
    reply = await caller.stub.Remember(pb.RememberRequest(scope=sc, content=content, **f))
    memory: pb.Memory = reply.memory
    return memory


async def prefetch(caller: Caller, scope: pb.Scope = ALICE, **fields: Any) -> pb.PrefetchResponse:
    reply: pb.PrefetchResponse = await caller.stub.Prefetch(
        pb.PrefetchRequest(scope=scope, session_id="s-now", **fields)
    )
    return reply


async def version(pool: asyncpg.Pool, caller: Caller) -> int:
    async with pool.acquire() as conn:
        found: int | None = await conn.fetchval(
            "SELECT version FROM scope_versions WHERE tenant_id = $1 AND user_id = 'alice'",
            caller.tenant_id,
        )
    return found or 0


async def test_blocks_start_empty(caller: Caller) -> None:
    reply = await blocks(caller, AVA)
    for block, kind in ((reply.persona, PERSONA), (reply.human, HUMAN)):
        assert block.block == kind and block.scope == AVA
        assert (block.text, block.revision, block.used_chars, block.author) == ("", 0, 0, "")
        assert block.limit_chars == 2_000 and not block.HasField("updated_at")
        assert not block.facts
    assert await history(caller, PERSONA, AVA) == []


async def test_replace_append_and_history_with_authors(caller: Caller) -> None:
    first = await update(
        caller, block=PERSONA, text="Ava is a calm travel guide.\nShe speaks Portuguese."
    )
    assert first.block.revision == 1 and first.block.author == "application"
    assert not first.displaced
    # The agent edits its own memory (self-editing), with a reason.
    second = await update(
        caller,
        block=PERSONA,
        mode=APPEND,
        text="  She never books night trains.  ",
        author="agent",
        reason="the user asked twice",
    )
    text = "Ava is a calm travel guide.\nShe speaks Portuguese.\nShe never books night trains."
    assert (second.block.text, second.block.revision, second.block.author) == (text, 2, "agent")
    assert second.block.used_chars == len(text)
    now = await blocks(caller)
    assert now.persona.text == text and now.persona.HasField("updated_at")
    assert now.human.text == "" and now.human.revision == 0  # the other block is untouched
    revisions = await history(caller, PERSONA)
    assert [(r.revision, r.mode, r.author, r.reason) for r in revisions] == [
        (2, APPEND, "agent", "the user asked twice"),
        (1, REPLACE, "application", ""),
    ]
    assert revisions[0].text == text and not revisions[0].HasField("replaced_at")
    assert revisions[1].text.endswith("Portuguese.") and revisions[1].HasField("replaced_at")
    assert revisions[1].replaced_at.ToDatetime() >= revisions[1].recorded_at.ToDatetime()
    assert [r.revision for r in await history(caller, PERSONA, page_size=1)] == [2]
    # Optimistic concurrency: a stale expected_revision writes nothing.
    stale = await refused(
        update(caller, block=PERSONA, mode=APPEND, text="dup", expected_revision=1)
    )
    assert stale.code() == C.FAILED_PRECONDITION and "revision 2" in (stale.details() or "")
    done = await update(caller, block=PERSONA, text="", expected_revision=2, author="operator")
    assert (done.block.text, done.block.revision) == ("", 3)  # empty REPLACE clears it
    assert len(await history(caller, PERSONA)) == 3


async def test_limits_default_and_per_tenant(caller: Caller, pool: asyncpg.Pool) -> None:
    too_long = await refused(update(caller, block=PERSONA, text="p" * 2_001))
    assert too_long.code() == C.INVALID_ARGUMENT
    assert "2,001" in (too_long.details() or "") and "2,000" in (too_long.details() or "")
    await update(caller, block=PERSONA, text="p" * 1_990)
    past = await refused(update(caller, block=PERSONA, mode=APPEND, text="q" * 10))
    assert past.code() == C.FAILED_PRECONDITION and "2,001" in (past.details() or "")
    assert (await blocks(caller)).persona.revision == 1  # nothing written
    # A tenant's own limits (0: none).
    async with pool.acquire() as conn:
        await tenant_settings.save(
            conn, caller.tenant_id, persona_block_max_chars=100, human_block_max_chars=0
        )
    now = await blocks(caller)
    assert (now.persona.limit_chars, now.human.limit_chars) == (100, 0)
    assert (await refused(update(caller, block=PERSONA, text="p" * 101))).code() == (
        C.INVALID_ARGUMENT
    )
    big = await update(caller, block=HUMAN, text="h" * 5_000)
    assert big.block.used_chars == 5_000 and big.block.limit_chars == 0
    # Back to the server defaults.
    async with pool.acquire() as conn:
        await tenant_settings.save(conn, caller.tenant_id, clear_block_limits=True)
    assert (await blocks(caller)).human.limit_chars == 2_000


async def test_human_replace_displaces_core_facts(caller: Caller) -> None:
    weak = await remember(caller, words("weak", 500), pinned=True, confidence=0.6)
    strong = await remember(caller, words("strong", 500), pinned=True, confidence=0.95)
    core = await remember(caller, words("core", 500), role="core", confidence=0.9)
    before = await blocks(caller)
    assert before.human.used_chars == 1_500 and len(before.human.facts) == 3
    # Pinned first in Prefetch's order.
    assert [f.memory_id for f in before.human.facts][:2] == [strong.memory_id, weak.memory_id]
    # 900 of text leaves 1,100 for the facts: the lowest priority one (core role, not
    # pinned) is demoted and reported.
    reply = await update(caller, block=HUMAN, text="t" * 900)
    assert [m.memory_id for m in reply.displaced] == [core.memory_id]
    assert not reply.displaced[0].pinned and reply.displaced[0].role == "context"
    assert reply.block.used_chars == 1_900 <= reply.block.limit_chars
    assert {f.memory_id for f in reply.block.facts} == {weak.memory_id, strong.memory_id}
    # A larger text: the least confident pin goes next.
    reply = await update(caller, block=HUMAN, text="t" * 1_400)
    assert [m.memory_id for m in reply.displaced] == [weak.memory_id]
    assert reply.block.used_chars == 1_900
    # A pin that cannot fit the room the text leaves is refused, naming both.
    err = await refused(remember(caller, words("huge", 700), pinned=True))
    assert err.code() == C.INVALID_ARGUMENT
    assert "1,400 of them taken by the block's written text" in (err.details() or "")
    # APPEND never displaces: past the limit with the facts, it is refused.
    err = await refused(update(caller, block=HUMAN, mode=APPEND, text="u" * 100))
    assert err.code() == C.FAILED_PRECONDITION and "core facts" in (err.details() or "")
    assert (await blocks(caller)).human.revision == 2


async def test_extraction_promotes_within_the_human_limit(
    caller: Caller, drain: Callable[[], Awaitable[int]]
) -> None:
    filler = await remember(caller, words("filler", 400), role="core", confidence=0.6)
    await update(caller, block=HUMAN, text="t" * 1_580)
    assert (await blocks(caller)).human.used_chars == 1_980
    # Session goals become core facts of the owner ("Goal: ..."): over the limit with the
    # text, so the weakest core fact leaves the block.
    reply = await ingest(
        caller,
        [msg("alice", "Hi, I need help planning my week.")],
        goals=["finish the quarterly report"],
    )
    assert await drain() >= 1
    status = await caller.stub.GetIngestStatus(pb.GetIngestStatusRequest(ingest_id=reply.ingest_id))
    assert status.state == pb.INGEST_STATE_DONE and status.outcome.core_demoted == 1
    human = (await blocks(caller)).human
    contents = [f.content for f in human.facts]
    assert any(c.startswith("Goal:") for c in contents)
    assert filler.memory_id not in {f.memory_id for f in human.facts}
    assert human.used_chars <= human.limit_chars == 2_000
    # Extraction never writes the persona block.
    assert (await blocks(caller)).persona.revision == 0


async def test_prefetch_renders_persona_block_then_human_block(caller: Caller) -> None:
    await update(caller, scope=AVA, block=PERSONA, text="Ava is a calm travel guide from Porto.")
    await update(caller, scope=AVA, block=HUMAN, text="Alice is vegetarian.\nAlice has a dog.")
    await remember(caller, "Alice's daughter is named Maya", AVA, pinned=True)
    await remember(caller, "Alice visited Lisbon in May", AVA)
    reply = await prefetch(caller, AVA, hint="Lisbon trip")
    text = reply.text
    order = [
        text.index(DISCLAIMER),
        text.index("Ava is a calm travel guide"),
        text.index("About the user (core memory, always applies):"),
        text.index("> Alice is vegetarian."),
        text.index("> Alice has a dog."),
        text.index("Pinned and core facts"),
        text.index("Maya"),
        text.index("visited Lisbon"),
    ]
    assert order == sorted(order)
    assert text.index('About the persona "ava"') < text.index("Ava is a calm")
    persona_len = len("Ava is a calm travel guide from Porto.")
    human_len = len("Alice is vegetarian.\nAlice has a dog.")
    assert (reply.counts.persona_block.shown_chars, reply.counts.persona_block.total_chars) == (
        persona_len,
        persona_len,
    )
    assert reply.counts.human_block.total_chars == human_len
    assert reply.counts.human_block.shown_chars == human_len
    assert not reply.withheld


async def test_a_block_cut_by_the_budget_says_so(caller: Caller) -> None:
    persona = "\n".join(
        f"Line {i} about Ava: " + "she loves old tram routes. " * 3 for i in range(20)
    )
    stored = (await update(caller, scope=AVA, block=PERSONA, text=persona[:2_000])).block.text
    await update(caller, scope=AVA, block=HUMAN, text=words("human", 1_500))
    reply = await prefetch(caller, AVA, budget=pb.PacketBudget(chars=1_000))
    counts = reply.counts
    assert 0 < counts.persona_block.shown_chars < counts.persona_block.total_chars
    assert counts.persona_block.total_chars == len(stored)
    shown = counts.persona_block.shown_chars
    # The shown prefix is in the text, line by line; what follows it is not.
    assert all(f"> {line}" in reply.text for line in stored[:shown].splitlines())
    assert stored[shown:].strip().splitlines()[0] not in reply.text
    assert counts.human_block.shown_chars < counts.human_block.total_chars == 1_500
    notes = [w for w in reply.withheld if "characters of the persona block" in w]
    assert len(notes) == 1 and notes[0] in reply.text
    assert f"Showing {counts.persona_block.shown_chars:,} of" in notes[0]
    assert "Not all of it is shown here." in reply.text
    assert any("characters of the human block" in w for w in reply.withheld)
    assert len(reply.text) <= 1_000


async def test_update_invalidates_the_cached_packet(caller: Caller) -> None:
    await remember(caller, "Alice likes green tea", pinned=True)
    await prefetch(caller)
    cached = await prefetch(caller)
    assert cached.cache == pb.CACHE_STATUS_HIT and "Dutch" not in cached.text
    await update(caller, block=HUMAN, text="Alice is Dutch.", author="agent")
    fresh = await prefetch(caller)
    assert fresh.cache == pb.CACHE_STATUS_MISS and "Alice is Dutch." in fresh.text
    assert fresh.version > cached.version


async def test_exact_scope_isolation(caller: Caller) -> None:
    await update(caller, scope=AVA, block=PERSONA, text="Ava secret persona text")
    await update(caller, scope=AVA, block=HUMAN, text="Ava-only human text")
    others = [
        pb.Scope(user_id="alice"),
        pb.Scope(user_id="alice", persona_id="ava"),
        pb.Scope(user_id="alice", agent_id="a1"),
        pb.Scope(user_id="alice", persona_id="ava", agent_id="a2"),
        pb.Scope(user_id="alice", persona_id="bob", agent_id="a1"),
        pb.Scope(user_id="bob", persona_id="ava", agent_id="a1"),
    ]
    for other in others:
        found = await blocks(caller, other)
        assert (found.persona.text, found.human.text) == ("", ""), other
        assert await history(caller, PERSONA, other) == []
        packet = await prefetch(caller, other)
        assert "Ava secret" not in packet.text and "Ava-only" not in packet.text
    assert (await blocks(caller, AVA)).human.text == "Ava-only human text"


async def test_bad_input_is_invalid_and_writes_nothing(caller: Caller, pool: asyncpg.Pool) -> None:
    await update(caller, block=HUMAN, text="Alice is vegetarian.")
    before = await version(pool, caller)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"block": pb.CORE_BLOCK_KIND_UNSPECIFIED, "text": "x"}, "block"),
        ({"block": HUMAN, "mode": pb.CORE_BLOCK_MODE_UNSPECIFIED, "text": "x"}, "mode"),
        ({"block": HUMAN, "text": "x", "author": "Agent!"}, "author"),
        ({"block": HUMAN, "text": "x", "author": "a" * 65}, "author"),
        ({"block": HUMAN, "text": "x", "reason": "r" * 501}, "reason"),
        ({"block": HUMAN, "text": "bad \x00 byte"}, "text"),
        ({"block": HUMAN, "mode": APPEND, "text": "  \n "}, "text"),
        ({"block": HUMAN, "text": "x", "expected_revision": -1}, "expected_revision"),
        ({"block": HUMAN, "text": "x", "scope": pb.Scope()}, "scope.user_id"),
        ({"block": HUMAN, "text": "x" * 40_000}, "text"),
    ]
    for fields, field in cases:
        err = await refused(update(caller, **fields))
        assert err.code() == C.INVALID_ARGUMENT, fields
        assert (err.details() or "").startswith(field), (fields, err.details())
    err = await refused(
        caller.stub.UpdateCoreBlock(pb.UpdateCoreBlockRequest(block=HUMAN, mode=REPLACE))
    )
    assert err.code() == C.INVALID_ARGUMENT and "scope" in (err.details() or "")
    for fields, field in (
        ({"block": pb.CORE_BLOCK_KIND_UNSPECIFIED}, "block"),
        ({"block": HUMAN, "page_size": 501}, "page_size"),
        ({"block": HUMAN, "page_size": -1}, "page_size"),
    ):
        err = await refused(
            caller.stub.GetCoreBlockHistory(pb.GetCoreBlockHistoryRequest(scope=ALICE, **fields))
        )
        assert err.code() == C.INVALID_ARGUMENT and (err.details() or "").startswith(field)
    assert len(await history(caller, HUMAN)) == 1
    assert (await blocks(caller)).human.text == "Alice is vegetarian."
    assert await version(pool, caller) == before


async def test_personal_data_is_redacted_in_a_block(caller: Caller) -> None:
    reply = await update(caller, block=HUMAN, text="Alice's card is 4111 1111 1111 1111.")
    assert "4111" not in reply.block.text and "[redacted card number]" in reply.block.text
    assert "4111" not in (await history(caller, HUMAN))[0].text


async def test_personal_data_the_tenant_rejects_is_refused(
    caller: Caller, pool: asyncpg.Pool
) -> None:
    # Set before the tenant's first call (the server caches a tenant's policy for a while).
    async with pool.acquire() as conn:
        await tenant_settings.save(conn, caller.tenant_id, pii_policy={"email": "reject"})
    err = await refused(
        update(caller, block=PERSONA, text="Write to ava@example.com", author="operator")
    )
    assert err.code() == C.INVALID_ARGUMENT
    assert (err.details() or "").startswith("text") and "email" in (err.details() or "")
    assert (await blocks(caller)).persona.revision == 0


async def test_export_and_erasure(caller: Caller) -> None:
    await update(caller, scope=AVA, block=PERSONA, text="Ava v1")
    await update(caller, scope=AVA, block=PERSONA, mode=APPEND, text="Ava v2", author="agent")
    await update(caller, block=HUMAN, text="Alice is vegetarian.")
    call: Any = caller.stub.ExportMemories(
        pb.ExportMemoriesRequest(scope=pb.Scope(user_id="alice"), whole_user=True)
    )
    records = [json.loads(r.json) async for r in call]
    found = [r for r in records if r["type"] == "core_block"]
    assert [(r["scope"]["persona_id"], r["block"], r["revision"]) for r in found] == [
        ("", "human", 1),
        ("ava", "persona", 1),
        ("ava", "persona", 2),
    ]
    last = found[-1]
    assert last["text"] == "Ava v1\nAva v2" and last["mode"] == "append"
    assert last["author"] == "agent" and last["replaced_at"] is None
    assert found[1]["replaced_at"] is not None and found[1]["recorded_at"].endswith("Z")
    assert records[-1]["counts"]["core_block"] == 3
    # Forget all_in_scope clears that scope's blocks only; erase_user clears the rest.
    await caller.stub.Forget(pb.ForgetRequest(scope=AVA, all_in_scope=True))
    assert (await blocks(caller, AVA)).persona.revision == 0
    assert await history(caller, PERSONA, AVA) == []
    assert (await blocks(caller)).human.text == "Alice is vegetarian."
    await caller.stub.Forget(pb.ForgetRequest(scope=ALICE, erase_user=True))
    assert await history(caller, HUMAN) == []


async def test_client_helpers(caller: Caller, server: MemsvcServer) -> None:
    async with MemoryClient(f"127.0.0.1:{server.port}", api_key=caller.key) as client:
        done = await client.update_core_block(
            pb.UpdateCoreBlockRequest(scope=ALICE, block=HUMAN, mode=REPLACE, text="Alice is 40.")
        )
        assert done.block.revision == 1
        got = await client.get_core_blocks(pb.GetCoreBlocksRequest(scope=ALICE))
        assert got.human.text == "Alice is 40."
        past = await client.get_core_block_history(
            pb.GetCoreBlockHistoryRequest(scope=ALICE, block=HUMAN)
        )
        assert [r.text for r in past.revisions] == ["Alice is 40."]


def test_cli_sets_and_shows_block_limits(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert settings.pg_dsn is not None
    monkeypatch.setenv("MEMSVC_PG_DSN", settings.pg_dsn)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    assert cli.main(["tenants", "show", "--tenant", tenant]) == 0
    out = capsys.readouterr().out
    assert "human block: 2000 chars (server default)" in out
    assert "persona block: 2000 chars (server default)" in out
    args = ["tenants", "set", "--tenant", tenant]
    assert cli.main([*args, "--human-block-chars", "1500", "--persona-block-chars", "0"]) == 0
    out = capsys.readouterr().out
    assert "human block: 1500 chars\n" in out and "persona block: no limit\n" in out
    assert cli.main([*args, "--human-block-chars", "-1"]) == 2
    assert "--human-block-chars" in capsys.readouterr().err
    assert cli.main([*args, "--default-block-chars"]) == 0
    assert "human block: 2000 chars (server default)" in capsys.readouterr().out
