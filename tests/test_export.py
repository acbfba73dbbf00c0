"""ExportMemories end to end: completeness against ListMemories and Recall, whole user vs exact
scope, isolation, expiry, bad input, the JSON-lines shape, batching, deadline, cancellation."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import grpc
import pytest
from prometheus_client import REGISTRY

from memsvc.client import MemoryClient, MemsvcCallError, RetryPolicy
from memsvc.concurrency.deadline import Budget
from memsvc.errors import DeadlineExceeded, ResourceExhausted
from memsvc.export.encode import dumps
from memsvc.export.service import ExportConfig, ExportService
from memsvc.server.app import MemsvcServer
from memsvc.storage.export import MARKER, Subject
from memsvc.storage.messages import StoredMessage, insert_messages
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import Caller
from tests.ingest_helpers import ASSISTANT, ingest, msg, status
from tests.read_helpers import pscope
from tests.test_explicit_memory import remember

FACT, EPISODE, MESSAGE = pb.ITEM_TYPE_FACT, pb.ITEM_TYPE_EPISODE, pb.ITEM_TYPE_MESSAGE
KINDS = ("memory", "episode", "topic", "message", "core_block")
C = grpc.StatusCode


async def export(
    caller: Caller, scope: pb.Scope | None = None, *, whole_user: bool = False
) -> list[dict[str, Any]]:
    """The export as parsed JSON objects, checking the wire shape of every record."""
    call: Any = caller.stub.ExportMemories(
        pb.ExportMemoriesRequest(scope=scope or pscope(), whole_user=whole_user)
    )
    records = [r async for r in call]
    assert await call.code() == C.OK
    out = []
    for record in records:
        assert "\n" not in record.json and "\r" not in record.json
        assert len(record.json.splitlines()) == 1
        obj = json.loads(record.json)
        assert obj["type"] == record.type
        out.append(obj)
    assert out and out[-1]["type"] == "summary", "the summary comes last, once"
    assert [o["type"] for o in out].count("summary") == 1
    return out


def ids(records: list[dict[str, Any]], kind: str) -> list[str]:
    key = {"memory": "memory_id", "episode": "episode_id", "topic": "topic_id"}.get(kind)
    return [r[key] if key else r["message_id"] for r in records if r["type"] == kind]


async def export_error(caller_stub: Any, request: pb.ExportMemoriesRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in caller_stub.ExportMemories(request):
            pytest.fail("a refused export must not stream any record")
    return info.value


async def all_listed(caller: Caller, scope: pb.Scope) -> set[str]:
    found: set[str] = set()
    token = ""
    while True:
        page = await caller.stub.ListMemories(
            pb.ListMemoriesRequest(
                scope=scope, page_size=2, page_token=token, include_superseded=True
            )
        )
        found |= {m.memory_id for m in page.memories}
        token = page.next_page_token
        if not token:
            return found


async def recalled(caller: Caller, scope: pb.Scope, queries: list[str]) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {FACT: set(), EPISODE: set(), MESSAGE: set()}
    for query in queries:
        for mode in (pb.RECALL_MODE_HYBRID, pb.RECALL_MODE_LEXICAL):
            reply = await caller.stub.Recall(
                pb.RecallRequest(
                    scope=scope, query=query, top_k=100, types=[FACT, EPISODE, MESSAGE], mode=mode
                )
            )
            assert not reply.degraded
            for item in reply.items:
                found[item.type].add(item.id)
    return found


def handled(code: str) -> float:
    value = REGISTRY.get_sample_value(
        "memsvc_grpc_server_handled_total",
        {
            "grpc_service": "memsvc.v1.MemoryService",
            "grpc_method": "ExportMemories",
            "grpc_code": code,
        },
    )
    return value or 0.0


def batches_read() -> float:
    return REGISTRY.get_sample_value("memsvc_export_batches_total") or 0.0


# -- completeness ---------------------------------------------------------------------------


async def test_export_holds_everything_list_and_recall_can_show(
    caller: Caller, drain: Callable[[], Awaitable[int]]
) -> None:
    alice = pscope()
    first = await ingest(
        caller,
        [
            msg("alice", "I live in Lisbon and my sister is called Ana."),
            msg("agent-1", "Nice! How long have you lived in Lisbon?", ASSISTANT),
            msg("alice", "I'm a vegetarian and I work as a nurse."),
        ],
        session="s1",
        end_of_session=True,
    )
    await ingest(caller, [msg("alice", "I love hiking in the mountains.")], session="s2")
    await drain()
    assert (await status(caller, first.ingest_id)).state == pb.INGEST_STATE_DONE
    tea = (await remember(caller, "Drinks green tea every morning")).memory
    await remember(caller, "Allergic to peanuts", category="profile", pinned=True)
    corrected = await caller.stub.Correct(
        pb.CorrectRequest(scope=alice, memory_id=tea.memory_id, new_content="Drinks black tea")
    )
    # Shared into alice's own scope from one of her agents: her reads show it, so does the export.
    shared = (
        await remember(
            caller,
            "Prefers calls after 6 pm",
            scope=pscope(agent="bot-1"),
            sharing=pb.Sharing(all_agents=True),
        )
    ).memory

    records = await export(caller, alice)
    listed = await all_listed(caller, alice)
    found = await recalled(
        caller,
        alice,
        ["Lisbon", "sister Ana", "vegetarian nurse", "hiking mountains", "tea", "peanuts", "calls"],
    )
    exported = {kind: set(ids(records, kind)) for kind in KINDS}
    assert listed and found[FACT] and found[EPISODE] and found[MESSAGE]
    assert listed <= exported["memory"]
    assert found[FACT] <= exported["memory"]
    assert found[EPISODE] <= exported["episode"]
    assert found[MESSAGE] <= exported["message"]
    assert len(ids(records, "message")) == 4 and len(ids(records, "topic")) >= 1
    assert {shared.memory_id, tea.memory_id, corrected.memory_id} <= exported["memory"]
    history = await caller.stub.GetMemoryHistory(
        pb.GetMemoryHistoryRequest(scope=alice, memory_id=tea.memory_id)
    )
    assert {v.memory_id for v in history.versions} <= exported["memory"]

    # Kinds in order, then the summary with their counts and what was asked.
    kinds = [r["type"] for r in records[:-1]]
    assert kinds == sorted(kinds, key=KINDS.index)
    summary = records[-1]
    assert summary["counts"] == {k: len(ids(records, k)) for k in KINDS}
    assert summary["scope"] == {"user_id": "alice", "persona_id": "", "agent_id": ""}
    assert summary["whole_user"] is False
    assert summary["exported_at"].endswith("Z")

    by_id = {r["memory_id"]: r for r in records if r["type"] == "memory"}
    old, new = by_id[tea.memory_id], by_id[corrected.memory_id]
    # Every version, grouped by lineage and oldest first.
    positions = [r.get("memory_id") for r in records]
    assert positions.index(old["memory_id"]) + 1 == positions.index(new["memory_id"])
    assert old["status"] == "superseded" and old["superseded_by_id"] == new["memory_id"]
    assert old["invalid_at"].endswith("Z") and new["invalid_at"] is None
    assert new["supersedes_id"] == old["memory_id"] and new["origin"] == "correction"
    assert new["lineage_id"] == old["lineage_id"] and new["confidence"] == 1.0
    assert by_id[shared.memory_id]["sharing"] == {"all_agents": True, "all_personas": False}
    assert by_id[shared.memory_id]["scope"]["agent_id"] == "bot-1"
    extracted = [r for r in by_id.values() if r["origin"] == "extraction"]
    assert extracted and all(r["session_id"] and r["source_message_ids"] for r in extracted)
    assert any(r["triple"] for r in extracted)
    for record in records[:-1]:
        assert "embedding" not in record and "search_tsv" not in record
        assert record["scope"]["user_id"] == "alice"
    episode = next(r for r in records if r["type"] == "episode" and r["session_id"] == "s1")
    assert episode["summary"] and len(episode["source_message_ids"]) == 2  # alice's turns
    assert set(episode["memory_ids"]) <= exported["memory"] and episode["memory_ids"]
    assert set(episode["topic_ids"]) <= exported["topic"]
    topic = next(r for r in records if r["type"] == "topic" and not r["is_persona"])
    assert (
        topic["name"]
        and topic["weight"] >= 1.0
        and set(topic["episode_ids"]) <= exported["episode"]
    )
    message = next(r for r in records if r["type"] == "message")
    assert set(message) >= {"sender_id", "role", "text", "sent_at", "session_id", "expires_at"}
    assert message["sent_at"].endswith("Z") and message["role"] in ("user", "assistant")


# -- whose data -------------------------------------------------------------------------------


async def test_whole_user_spans_personas_and_agents_and_nothing_of_anyone_else(
    caller: Caller, new_caller: Callable[[], Awaitable[Caller]], drain: Callable[[], Awaitable[int]]
) -> None:
    own = (await remember(caller, "Lives in Porto")).memory
    persona = (await remember(caller, "Nova likes jazz", scope=pscope(persona="nova"))).memory
    agent = (await remember(caller, "Asked about taxes", scope=pscope(agent="bot-1"))).memory
    bob = (await remember(caller, "Bob lives in Rome", scope=pscope("bob"))).memory
    other_tenant = await new_caller()
    elsewhere = (await remember(other_tenant, "Lives in Porto")).memory
    await ingest(caller, [msg("alice", "I play the cello.")], persona="nova", session="sn")
    # A meeting owned by bob: alice's turn is her data, bob's is not.
    await ingest(
        caller,
        [
            msg("bob", "I run the meeting.", message_id="bob-1"),
            msg("alice", "I take the notes.", message_id="alice-1"),
        ],
        user="bob",
        session="meeting",
    )
    await drain()

    records = await export(caller, pscope(), whole_user=True)
    memories = set(ids(records, "memory"))
    assert {own.memory_id, persona.memory_id, agent.memory_id} <= memories
    assert bob.memory_id not in memories and elsewhere.memory_id not in memories
    assert all(r["scope"]["user_id"] == "alice" for r in records if r["type"] == "memory")
    messages = [r for r in records if r["type"] == "message"]
    assert {m["session_id"] for m in messages} == {"sn", "meeting"}
    assert "bob-1" not in ids(records, "message") and "alice-1" in ids(records, "message")
    assert all(m["sender_id"] == "alice" or m["scope"]["user_id"] == "alice" for m in messages)
    assert records[-1]["whole_user"] is True
    assert {r["scope"]["persona_id"] for r in records if r["type"] == "episode"} >= {"nova"}

    other = await export(other_tenant, pscope(), whole_user=True)
    assert set(ids(other, "memory")) == {elsewhere.memory_id}


async def test_exact_scope_excludes_sibling_scopes(
    caller: Caller, drain: Callable[[], Awaitable[int]]
) -> None:
    own = (await remember(caller, "Lives in Porto")).memory
    await remember(caller, "Nova likes jazz", scope=pscope(persona="nova"))
    await remember(caller, "Asked about taxes", scope=pscope(agent="bot-1"))
    await ingest(caller, [msg("alice", "I play the cello.")], agent="bot-1", session="sa")
    await ingest(caller, [msg("alice", "I play the piano.")], session="s0")
    await drain()
    records = await export(caller, pscope())
    assert ids(records, "memory") == [own.memory_id] + [
        r["memory_id"] for r in records if r["type"] == "memory" and r["origin"] == "extraction"
    ]
    assert all(
        r["scope"] == {"user_id": "alice", "persona_id": "", "agent_id": ""} for r in records[:-1]
    )
    assert {r["session_id"] for r in records if r["type"] == "message"} == {"s0"}
    nova = await export(caller, pscope(persona="nova"))
    assert [r["content"] for r in nova if r["type"] == "memory"] == ["Nova likes jazz"]
    assert not ids(nova, "message") and not ids(nova, "episode")


async def test_expired_rows_are_not_exported(caller: Caller, pool: asyncpg.Pool) -> None:
    kept = (await remember(caller, "Lives in Porto")).memory
    gone = (await remember(caller, "Waiting for a parcel")).memory
    later = (await remember(caller, "Has a dentist appointment")).memory
    await ingest(caller, [msg("alice", "I am at the airport.", message_id="m-old")])
    await ingest(caller, [msg("alice", "I landed.", message_id="m-new")])
    # Past their expiry but not yet deleted by the expiry task: never served, never exported.
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE memories SET retention_policy = 'ttl', expires_at = now() - interval '1 s'"
            " WHERE tenant_id = $1 AND memory_id = $2",
            caller.tenant_id,
            gone.memory_id,
        )
        await conn.execute(
            "UPDATE memories SET retention_policy = 'ttl', expires_at = now() + interval '1 day'"
            " WHERE tenant_id = $1 AND memory_id = $2",
            caller.tenant_id,
            later.memory_id,
        )
        await conn.execute(
            "UPDATE messages SET expires_at = now() - interval '1 s'"
            " WHERE tenant_id = $1 AND message_id = 'm-old'",
            caller.tenant_id,
        )
        # Episodes of a session-retained conversation expire with it.
        for session, expires in (("s-old", "now() - interval '1 s'"), ("s-new", "NULL")):
            await conn.execute(
                "INSERT INTO episodes (tenant_id, user_id, episode_id, session_id, title, summary,"
                f" started_at, ended_at, expires_at) VALUES ($1, 'alice', $2, $3, 'A call',"
                f" 'They talked.', now(), now(), {expires})",
                caller.tenant_id,
                uuid.uuid4(),
                session,
            )
    records = await export(caller)
    assert set(ids(records, "memory")) == {kept.memory_id, later.memory_id}
    assert ids(records, "message") == ["m-new"]
    by_id = {r["memory_id"]: r for r in records if r["type"] == "memory"}
    assert by_id[later.memory_id]["retention_policy"] == "ttl"
    assert by_id[later.memory_id]["expires_at"].endswith("Z")
    assert by_id[kept.memory_id]["expires_at"] is None
    assert [r["session_id"] for r in records if r["type"] == "episode"] == ["s-new"]
    assert records[-1]["counts"] == {
        "memory": 2,
        "episode": 1,
        "topic": 0,
        "message": 1,
        "core_block": 0,
    }


# -- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.ExportMemoriesRequest(), "scope"),
        (pb.ExportMemoriesRequest(scope=pb.Scope()), "scope.user_id"),
        (pb.ExportMemoriesRequest(scope=pscope(persona="nova"), whole_user=True), "whole_user"),
        (pb.ExportMemoriesRequest(scope=pscope(agent="bot-1"), whole_user=True), "whole_user"),
        (pb.ExportMemoriesRequest(scope=pb.Scope(user_id="al\x00ice")), "scope.user_id"),
        (pb.ExportMemoriesRequest(scope=pb.Scope(user_id="a" * 129)), "scope.user_id"),
    ],
)
async def test_bad_input_is_invalid_argument(
    caller: Caller, request_: pb.ExportMemoriesRequest, field: str
) -> None:
    await remember(caller, "Lives in Porto", scope=pscope(persona="nova"))
    error = await export_error(caller.stub, request_)
    assert error.code() == C.INVALID_ARGUMENT
    assert (error.details() or "").startswith(field)


async def test_unauthenticated_callers_get_nothing(
    caller: Caller, channel: grpc.aio.Channel
) -> None:
    await remember(caller, "Lives in Porto")
    stub = memory_pb2_grpc.MemoryServiceStub(channel)
    request = pb.ExportMemoriesRequest(scope=pscope(), whole_user=True)
    for metadata in ((), (("x-api-key", "not-a-key"),)):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.ExportMemories(request, metadata=metadata, timeout=10):
                pytest.fail("no record without a valid key")
        assert info.value.code() == C.UNAUTHENTICATED


# -- streaming -------------------------------------------------------------------------------


async def seed_messages(pool: asyncpg.Pool, scope: Scope, n: int, session: str = "big") -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        StoredMessage(
            session_id=session,
            message_id=f"m{i:06d}",
            sender_id=scope.user_id,
            role="user",
            text=f"Message number {i}: a line of\nconversation with a break\u2028and more",
            sent_at=start + timedelta(seconds=i),
        )
        for i in range(n)
    ]
    async with pool.acquire() as conn:
        await insert_messages(conn, scope, uuid.uuid4(), rows)


async def test_a_large_export_streams_in_several_batches(
    caller: Caller, pool: asyncpg.Pool, server: MemsvcServer
) -> None:
    n = server.settings.export_batch_rows * 2 + 7
    await seed_messages(pool, Scope(caller.tenant_id, "alice"), n)
    before_batches, before_ok = batches_read(), handled("OK")
    records = await export(caller)
    assert batches_read() - before_batches >= 3
    assert handled("OK") == before_ok + 1  # the interceptor saw the stream end
    message_ids = ids(records, "message")
    assert message_ids == sorted(message_ids) and len(message_ids) == n
    assert records[-1]["counts"]["message"] == n
    first = next(r for r in records if r["type"] == "message")
    assert first["text"] == "Message number 0: a line of\nconversation with a break\u2028and more"


def test_lines_never_break_whatever_the_text() -> None:
    text = "a\nb\rc\u2028d\u2029e\u0085f\x0bg\x1ch"
    line = dumps({"type": "message", "text": text})
    assert len(line.splitlines()) == 1 and json.loads(line)["text"] == text


async def test_the_service_stops_at_its_budget(caller: Caller, pool: asyncpg.Pool) -> None:
    scope = Scope(caller.tenant_id, "alice")
    await seed_messages(pool, scope, 50)
    service = ExportService(
        pool,
        ExportConfig(batch_rows=10, max_in_flight=1, acquire_timeout_s=5, fetch_timeout_s=5),
    )
    stream = service.export(Subject(scope), Budget(0.5))
    got = [await anext(stream)]
    await asyncio.sleep(0.6)  # a slow reader: the budget runs out mid-stream
    with pytest.raises(DeadlineExceeded):
        async for record in stream:
            got.append(record)
    assert len(got) == 10  # the batch in hand, then nothing more
    assert service.in_flight == 0


async def test_exports_in_flight_are_capped(caller: Caller, pool: asyncpg.Pool) -> None:
    scope = Scope(caller.tenant_id, "alice")
    await seed_messages(pool, scope, 5)
    service = ExportService(
        pool,
        ExportConfig(batch_rows=2, max_in_flight=1, acquire_timeout_s=5, fetch_timeout_s=5),
    )
    first = service.export(Subject(scope), Budget(30))
    await anext(first)
    with pytest.raises(ResourceExhausted) as info:
        await anext(service.export(Subject(scope), Budget(30)))
    assert info.value.retry_after_s
    await first.aclose()
    assert service.in_flight == 0
    records = [r async for r in service.export(Subject(scope), Budget(30))]
    assert Counter(r.type for r in records) == {"message": 5, "summary": 1}


async def export_sessions(pool: asyncpg.Pool) -> int:
    async with pool.acquire() as conn:
        value: int = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE $1 AND pid <> pg_backend_pid()"
            " AND state <> 'idle'",
            MARKER + "%",
        )
    return value


async def test_cancelling_the_call_closes_the_cursor(
    caller: Caller, pool: asyncpg.Pool, server: MemsvcServer
) -> None:
    await seed_messages(pool, Scope(caller.tenant_id, "alice"), 20_000)
    before = handled("CANCELLED")
    call: Any = caller.stub.ExportMemories(pb.ExportMemoriesRequest(scope=pscope()))
    first = await call.read()
    assert first.type == "message"
    # The export holds its snapshot open while the reader is slow...
    assert await export_sessions(pool) == 1
    assert server.runtime.export.in_flight == 1
    call.cancel()
    # ...and lets it go as soon as the caller walks away.
    for _ in range(200):
        if await export_sessions(pool) == 0 and server.runtime.export.in_flight == 0:
            break
        await asyncio.sleep(0.05)
    assert await export_sessions(pool) == 0
    assert server.runtime.export.in_flight == 0
    for _ in range(200):
        if handled("CANCELLED") > before:
            break
        await asyncio.sleep(0.05)
    assert handled("CANCELLED") == before + 1


async def test_the_client_streams_retries_a_refusal_and_cancels_when_stopped_early(
    caller: Caller, pool: asyncpg.Pool, server: MemsvcServer
) -> None:
    await seed_messages(pool, Scope(caller.tenant_id, "alice"), 20_000)
    request = pb.ExportMemoriesRequest(scope=pscope())
    async with MemoryClient(
        f"127.0.0.1:{server.port}",
        api_key=caller.key,
        retry=RetryPolicy(max_attempts=2, max_backoff_ms=50),
    ) as client:
        records = [r async for r in client.export_memories(request)]
        assert json.loads(records[-1].json)["counts"]["message"] == 20_000

        # The tenant's share of the export slots taken: refused before any record, retried,
        # then reported with the number of attempts.
        held = []
        for _ in range(server.settings.export_max_in_flight_per_tenant):
            call: Any = caller.stub.ExportMemories(request)
            assert (await call.read()).type == "message"
            held.append(call)
        with pytest.raises(MemsvcCallError) as info:
            async for _ in client.export_memories(request):
                pytest.fail("no slot was free")
        assert info.value.code == C.RESOURCE_EXHAUSTED and info.value.attempts == 2
        for call in held:
            call.cancel()

        # Stopping early ends the call: the server lets its snapshot go.
        for _ in range(200):
            if server.runtime.export.in_flight == 0:
                break
            await asyncio.sleep(0.05)
        stream = client.export_memories(request)
        async for _ in stream:
            assert server.runtime.export.in_flight == 1
            break
        await stream.aclose()  # type: ignore[attr-defined]
        for _ in range(200):
            if server.runtime.export.in_flight == 0 and await export_sessions(pool) == 0:
                break
            await asyncio.sleep(0.05)
        assert server.runtime.export.in_flight == 0 and await export_sessions(pool) == 0


async def test_a_demoted_core_memory_says_so(caller: Caller, pool: asyncpg.Pool) -> None:
    core = (await remember(caller, "Is allergic to penicillin", role="core")).memory
    plain = (await remember(caller, "Likes jazz")).memory
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE memories SET demoted_at = now(), demoted_role = role, role = 'context'"
            " WHERE tenant_id = $1 AND memory_id = $2",
            caller.tenant_id,
            core.memory_id,
        )
    records = await export(caller)
    by_id = {r["memory_id"]: r for r in records if r["type"] == "memory"}
    demoted = by_id[core.memory_id]["demoted"]
    assert demoted["former_role"] == "core" and demoted["was_pinned"] is False
    assert demoted["at"].endswith("Z") and demoted["summarised_into"] is None
    assert by_id[core.memory_id]["role"] == "context"
    assert by_id[plain.memory_id]["demoted"] is None
