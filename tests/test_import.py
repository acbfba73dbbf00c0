"""ImportMemories end to end: an export imported into another user reproduces every record
(ids derived, links kept), a re-run imports nothing, an import into the erased user brings
back the same ids, a bad line writes nothing, and Recall finds what was imported."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import orjson
import pytest

from memsvc.client import MemoryClient, MemsvcCallError
from memsvc.export.importer import ID_NAMESPACE
from memsvc.server.app import MemsvcServer
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import ASSISTANT, ingest, msg
from tests.read_helpers import StartServer, stub_for
from tests.read_helpers import start_server as start_server  # fixture

C = grpc.StatusCode
ALICE = pb.Scope(user_id="alice")
CAROL = pb.Scope(user_id="carol")
ID_FIELDS = (
    "memory_id",
    "lineage_id",
    "supersedes_id",
    "superseded_by_id",
    "episode_id",
    "topic_id",
)
ID_LISTS = ("memory_ids", "topic_ids", "episode_ids")


async def export_lines(stub: Any, scope: pb.Scope, *, whole_user: bool = True) -> list[str]:
    call = stub.ExportMemories(pb.ExportMemoriesRequest(scope=scope, whole_user=whole_user))
    return [r.json async for r in call]


async def requests(
    scope: pb.Scope | None, lines: list[str], *, keep: bool = True
) -> AsyncIterator[pb.ImportMemoriesRequest]:
    first = pb.ImportMemoriesRequest(keep_record_scopes=keep)
    if scope is not None:
        first.scope.CopyFrom(scope)
    yield first
    for line in lines:
        yield pb.ImportMemoriesRequest(json=line)


async def import_lines(
    stub: Any, scope: pb.Scope | None, lines: list[str], *, keep: bool = True
) -> pb.ImportMemoriesResponse:
    reply: pb.ImportMemoriesResponse = await stub.ImportMemories(
        requests(scope, lines, keep=keep), timeout=60.0
    )
    return reply


async def import_error(stub: Any, scope: pb.Scope | None, lines: list[str]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await import_lines(stub, scope, lines)
    return info.value


async def seed_alice(caller: Caller, drain: Callable[[], Awaitable[int]]) -> None:
    """A user with extracted facts, episodes, topics and messages, explicit facts (pinned,
    corrected, shared from an agent, with a time to live) and core blocks."""
    await ingest(
        caller,
        [
            msg("alice", "I live in Lisbon and my sister is called Ana."),
            msg("agent-1", "Nice! How long have you lived in Lisbon?", ASSISTANT),
            msg("alice", "I'm a vegetarian and I work as a nurse at the harbour clinic."),
        ],
        session="s1",
        end_of_session=True,
    )
    await ingest(caller, [msg("alice", "I love hiking in the Serra da Estrela.")], session="s2")
    await drain()
    stub = caller.stub
    tea = await stub.Remember(pb.RememberRequest(scope=ALICE, content="Drinks green tea daily"))
    await stub.Correct(
        pb.CorrectRequest(
            scope=ALICE, memory_id=tea.memory.memory_id, new_content="Drinks black tea daily"
        )
    )
    await stub.Remember(
        pb.RememberRequest(
            scope=ALICE, content="Allergic to peanuts", category="profile", pinned=True
        )
    )
    await stub.Remember(
        pb.RememberRequest(
            scope=pb.Scope(user_id="alice", agent_id="bot-1"),
            content="Prefers calls after 6 pm",
            sharing=pb.Sharing(all_agents=True),
        )
    )
    await stub.Remember(
        pb.RememberRequest(
            scope=ALICE,
            content="Is on holiday in Crete this week",
            retention_policy=pb.RETENTION_POLICY_TTL,
            ttl={"seconds": 86_400},
        )
    )
    await stub.UpdateCoreBlock(
        pb.UpdateCoreBlockRequest(
            scope=ALICE,
            block=pb.CORE_BLOCK_KIND_HUMAN,
            mode=pb.CORE_BLOCK_MODE_REPLACE,
            text="Alice is a nurse in Lisbon.",
        )
    )
    await stub.UpdateCoreBlock(
        pb.UpdateCoreBlockRequest(
            scope=ALICE,
            block=pb.CORE_BLOCK_KIND_HUMAN,
            mode=pb.CORE_BLOCK_MODE_APPEND,
            text=" She is vegetarian.",
        )
    )


def derived(tenant: str, user: str, original: str) -> str:
    return str(uuid.uuid5(ID_NAMESPACE, f"{tenant}\x1f{user}\x1f{original}"))


def normalized(lines: list[str], id_map: Callable[[str], str] = str) -> dict[str, Any]:
    """The records keyed by kind and (mapped) id, with the user and the export's time left
    out: what must survive an export -> import -> export round trip."""
    out: dict[str, Any] = {}
    for line in lines:
        record = orjson.loads(line)
        kind = record["type"]
        if kind == "summary":
            out["summary"] = record["counts"]
            continue
        record["scope"].pop("user_id")
        for name in ID_FIELDS:
            if record.get(name):
                record[name] = id_map(record[name])
        for name in ID_LISTS:
            if name in record:
                record[name] = sorted(id_map(i) for i in record[name])
        if record.get("demoted") and record["demoted"].get("summarised_into"):
            record["demoted"]["summarised_into"] = id_map(record["demoted"]["summarised_into"])
        for edit in record.get("edits", ()):
            edit["edit_id"] = id_map(edit["edit_id"])
        key = {
            "memory": "memory_id",
            "episode": "episode_id",
            "topic": "topic_id",
        }.get(kind)
        if key:
            ident = record[key]
        elif kind == "message":
            ident = (record["scope"]["persona_id"], record["session_id"], record["message_id"])
        else:
            ident = (record["scope"]["persona_id"], record["block"], record["revision"])
        out[f"{kind}:{ident}"] = record
    return out


async def test_export_import_export_reproduces_every_record_for_another_user(
    caller: Caller, drain: Callable[[], Awaitable[int]], pool: asyncpg.Pool
) -> None:
    await seed_alice(caller, drain)
    original = await export_lines(caller.stub, ALICE)
    kinds = {orjson.loads(line)["type"] for line in original}
    assert kinds >= {"memory", "episode", "topic", "message", "core_block", "summary"}

    reply = await import_lines(caller.stub, CAROL, original)
    counts = orjson.loads(original[-1])["counts"]
    assert reply.lines == len(original)
    assert reply.memories.imported == counts["memory"] and reply.memories.skipped == 0
    assert reply.episodes.imported == counts["episode"]
    assert reply.topics.imported == counts["topic"]
    assert reply.messages.imported == counts["message"]
    blocks = sum(orjson.loads(line)["type"] == "core_block" for line in original)
    assert blocks > 0 and reply.core_blocks.imported == blocks

    copied = await export_lines(caller.stub, CAROL)
    expected = normalized(original, lambda i: derived(caller.tenant_id, "carol", i))
    assert normalized(copied) == expected
    assert all(orjson.loads(line)["scope"]["user_id"] == "carol" for line in copied[:-1])

    # Every row is embedded again and messages are indexed for search.
    async with pool.acquire() as conn:
        missing = await conn.fetchval(
            "SELECT (SELECT count(*) FROM memories WHERE tenant_id = $1 AND user_id = 'carol'"
            " AND embedding_state <> 'ok') + (SELECT count(*) FROM messages WHERE tenant_id = $1"
            " AND user_id = 'carol' AND (embedding_state <> 'ok' OR context_tsv IS NULL))",
            caller.tenant_id,
        )
    assert missing == 0

    # A re-run imports nothing twice.
    again = await import_lines(caller.stub, CAROL, original)
    assert again.memories.imported == again.episodes.imported == 0
    assert again.topics.imported == again.messages.imported == 0
    assert again.memories.skipped == counts["memory"]
    assert again.messages.skipped == counts["message"]
    assert again.core_blocks.imported == 0 and again.core_blocks.skipped == blocks
    assert normalized(await export_lines(caller.stub, CAROL)) == expected


async def test_recall_finds_imported_facts_and_messages(
    caller: Caller, drain: Callable[[], Awaitable[int]]
) -> None:
    await seed_alice(caller, drain)
    await import_lines(caller.stub, CAROL, await export_lines(caller.stub, ALICE))
    facts = await caller.stub.Recall(
        pb.RecallRequest(scope=CAROL, query="Which tea does she drink?", types=[pb.ITEM_TYPE_FACT])
    )
    assert any(i.text == "Drinks black tea daily" for i in facts.items)
    assert all(i.text != "Drinks green tea daily" for i in facts.items), "history stays history"
    messages = await caller.stub.Recall(
        pb.RecallRequest(
            scope=CAROL, query="hiking in the Serra da Estrela", types=[pb.ITEM_TYPE_MESSAGE]
        )
    )
    assert any("Serra da Estrela" in i.text for i in messages.items)
    history = await caller.stub.ListMemories(
        pb.ListMemoriesRequest(scope=CAROL, include_superseded=True, page_size=100)
    )
    old = next(m for m in history.memories if m.content == "Drinks green tea daily")
    new = next(m for m in history.memories if m.content == "Drinks black tea daily")
    assert old.superseded_by_id == new.memory_id and new.supersedes_id == old.memory_id
    assert old.HasField("invalid_at") and not new.HasField("invalid_at")


async def test_import_into_the_erased_user_brings_back_the_same_ids(
    caller: Caller, drain: Callable[[], Awaitable[int]]
) -> None:
    await seed_alice(caller, drain)
    original = await export_lines(caller.stub, ALICE)
    await caller.stub.Forget(pb.ForgetRequest(scope=ALICE, erase_user=True))
    assert len(await export_lines(caller.stub, ALICE)) == 1  # the summary alone
    reply = await import_lines(caller.stub, ALICE, original)
    assert reply.memories.skipped == 0
    assert normalized(await export_lines(caller.stub, ALICE)) == normalized(original)


async def test_into_one_exact_scope_without_keep_record_scopes(
    caller: Caller, drain: Callable[[], Awaitable[int]]
) -> None:
    await seed_alice(caller, drain)
    lines = await export_lines(caller.stub, ALICE, whole_user=False)
    target = pb.Scope(user_id="dave", persona_id="p9")
    reply = await import_lines(caller.stub, target, lines, keep=False)
    assert reply.memories.imported > 0
    copied = [
        orjson.loads(line) for line in await export_lines(caller.stub, target, whole_user=False)
    ]
    assert {(r["scope"]["user_id"], r["scope"]["persona_id"]) for r in copied[:-1]} == {
        ("dave", "p9")
    }


def _line(kind: str, **fields: Any) -> str:
    return orjson.dumps({"type": kind, **fields}).decode()


async def test_a_bad_line_is_invalid_argument_naming_it_and_nothing_is_written(
    caller: Caller, drain: Callable[[], Awaitable[int]]
) -> None:
    await seed_alice(caller, drain)
    good = await export_lines(caller.stub, ALICE)
    memory = orjson.loads(good[0])
    without_content = {k: v for k, v in memory.items() if k != "content"}
    cases = {
        "line 2: not valid JSON": [good[0], "{not json", *good[1:]],
        "line 2: type: not a known record type": [good[0], _line("gizmo"), *good[1:]],
        "line 1: memory.content: Field required": [
            orjson.dumps(without_content).decode(),
            *good[1:],
        ],
        "line 1: memory.confidence": [
            orjson.dumps({**memory, "confidence": 3}).decode(),
            *good[1:],
        ],
        f"line {len(good) - 1}: the summary counts": good[1:],
        "line 1: memory.valid_from": [
            orjson.dumps({**memory, "valid_from": "2026-11-01T09:00:00"}).decode(),
            *good[1:],
        ],
        "line 1: memory.category: not one of this server's category values": [
            orjson.dumps({**memory, "category": "gossip"}).decode(),
            *good[1:],
        ],
        "line 1: memory.role: not one of this server's role values": [
            orjson.dumps({**memory, "role": "hero"}).decode(),
            *good[1:],
        ],
        "line 1: a text holds a NUL": [
            orjson.dumps({**memory, "content": "a\u0000b"}).decode(),
            *good[1:],
        ],
        # Issue 31: Import skipped the checks Remember and Ingest apply.
        "line 1: memory.content: at most 2000 characters": [
            orjson.dumps({**memory, "content": "x" * 2_001}).decode(),
            *good[1:],
        ],
        "line 1: memory.valid_from: must be from 1900 up to 1 day after now": [
            orjson.dumps({**memory, "valid_from": "2199-01-01T00:00:00Z"}).decode(),
            *good[1:],
        ],
        "line 1: memory.recorded_at: must be from 1900 up to 1 day after now": [
            orjson.dumps({**memory, "recorded_at": "2199-01-01T00:00:00Z"}).decode(),
            *good[1:],
        ],
        "line 1: memory.supersedes_id: names no memory": [
            orjson.dumps({**memory, "supersedes_id": str(uuid.uuid4())}).decode(),
            *good[1:],
        ],
        # Alice's own memory id, claimed for carol (ids are kept for the export's user).
        "line 1: memory.memory_id: already the id of a memory in another scope": [
            orjson.dumps({**memory, "scope": {**memory["scope"], "user_id": "carol"}}).decode(),
            *good[1:],
        ],
    }
    for expected, lines in cases.items():
        error = await import_error(caller.stub, CAROL, lines)
        assert error.code() == C.INVALID_ARGUMENT, expected
        assert (error.details() or "").startswith(expected), (expected, error.details())
    assert len(await export_lines(caller.stub, CAROL)) == 1, "nothing was written"
    error = await import_error(caller.stub, None, good)
    assert error.code() == C.INVALID_ARGUMENT
    assert (error.details() or "").startswith("scope: required")
    error = await import_error(caller.stub, pb.Scope(user_id="carol", persona_id="p1"), good)
    assert error.code() == C.INVALID_ARGUMENT  # keep_record_scopes with a persona


async def test_an_import_error_never_echoes_the_lines_values(
    caller: Caller, drain: Callable[[], Awaitable[int]]
) -> None:
    # Issue 31: errors named the caller's values ("unknown record type 'gizmo'", "'gossip'
    # is not one of..."); they name the line, the field and the rule only.
    await seed_alice(caller, drain)
    good = await export_lines(caller.stub, ALICE)
    memory = orjson.loads(good[0])
    summary = orjson.loads(good[-1])
    mark = f"zqmark{uuid.uuid4().hex[:10]}"
    bad = [
        [_line(mark), *good[1:]],
        [orjson.dumps({**memory, "category": mark}).decode(), *good[1:]],
        [orjson.dumps({**memory, "role": mark}).decode(), *good[1:]],
        [orjson.dumps({**memory, "memory_id": f"z{mark}"}).decode(), *good[1:]],
        [orjson.dumps({**memory, "valid_from": mark}).decode(), *good[1:]],
        [*good[:-1], orjson.dumps({**summary, "counts": {mark: 1}}).decode()],
        [*good[:-1], orjson.dumps({**summary, "counts": {mark: "x"}}).decode()],
    ]
    for lines in bad:
        error = await import_error(caller.stub, CAROL, lines)
        assert error.code() == C.INVALID_ARGUMENT
        details = error.details() or ""
        assert details.startswith("line ") and mark not in details, details
        assert "`z`" not in details, details


async def test_the_pii_policy_applies_to_imported_text(caller: Caller, pool: asyncpg.Pool) -> None:
    card = "4111 1111 1111 1111"
    await caller.stub.Ingest(
        pb.IngestRequest(
            scope=ALICE,
            session_id="s9",
            idempotency_key=uuid.uuid4().hex,
            messages=[msg("alice", "my old card was 4000 0000 0000 0002, nothing else")],
        )
    )
    lines = await export_lines(caller.stub, ALICE)
    # An export edited (or from another system) holding a card number in a message.
    edited = [line.replace("4000 0000 0000 0002", card) for line in lines]
    edited = [line.replace("[redacted card number]", card) for line in edited]
    assert any(card in line for line in edited)
    reply = await import_lines(caller.stub, CAROL, edited)
    assert reply.messages.imported == 1
    async with pool.acquire() as conn:
        texts = await conn.fetch(
            "SELECT text FROM messages WHERE tenant_id = $1 AND user_id = 'carol'",
            caller.tenant_id,
        )
    assert texts and all(card not in r["text"] for r in texts)


async def test_more_lines_than_the_limit_is_resource_exhausted(
    caller: Caller, start_server: StartServer
) -> None:
    _, channel = await start_server(import_max_lines=3)
    stub = stub_for(channel, caller)
    lines = [_line("summary", counts={})] * 4
    error = await import_error(stub, CAROL, lines)
    assert error.code() == C.RESOURCE_EXHAUSTED
    assert "MEMSVC_IMPORT_MAX_LINES" in (error.details() or "")
    reply = await import_lines(stub, CAROL, lines[:3])
    assert reply.lines == 3


async def test_client_helper_imports_a_file(
    caller: Caller, server: MemsvcServer, tmp_path: Path
) -> None:
    await caller.stub.Remember(pb.RememberRequest(scope=ALICE, content="Alice flies kites"))
    path = tmp_path / "alice.jsonl"
    path.write_text("".join(line + "\n" for line in await export_lines(caller.stub, ALICE)))
    async with MemoryClient(f"127.0.0.1:{server.port}", api_key=caller.key) as client:
        reply = await client.import_memories(CAROL, path, keep_record_scopes=True)
        assert reply.memories.imported == 1
        again = await client.import_memories(CAROL, path.read_text().splitlines())
        assert again.memories.skipped == 1
        with pytest.raises(MemsvcCallError):
            await client.import_memories(CAROL, ["{"])
