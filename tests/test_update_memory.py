"""UpdateMemory and GetMemory against the real server: in-place changes with their history,
the scope rules of Correct, retention and core compaction, the packet cache, bad input that
writes nothing, and reads of one memory by id."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import grpc
import orjson
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask

from memsvc.client import MemoryClient
from memsvc.governance.policy import parse_pii_policy
from memsvc.server.app import MemsvcServer
from memsvc.storage import tenant_settings
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller

C = grpc.StatusCode
ALICE = pb.Scope(user_id="alice", agent_id="a1")
OTHER_AGENT = pb.Scope(user_id="alice", agent_id="a2")


async def remember(caller: Caller, content: str, sc: pb.Scope = ALICE, **fields: Any) -> pb.Memory:
    reply: pb.RememberResponse = await caller.stub.Remember(
        pb.RememberRequest(scope=sc, content=content, **fields)
    )
    return reply.memory


async def update(
    caller: Caller, memory_id: str, *paths: str, sc: pb.Scope = ALICE, **fields: Any
) -> pb.UpdateMemoryResponse:
    reply: pb.UpdateMemoryResponse = await caller.stub.UpdateMemory(
        pb.UpdateMemoryRequest(
            scope=sc, memory_id=memory_id, update_mask=FieldMask(paths=list(paths)), **fields
        )
    )
    return reply


async def get(caller: Caller, memory_id: str, sc: pb.Scope = ALICE) -> pb.Memory:
    reply: pb.Memory = await caller.stub.GetMemory(
        pb.GetMemoryRequest(scope=sc, memory_id=memory_id)
    )
    return reply


async def history(caller: Caller, memory_id: str) -> pb.GetMemoryHistoryResponse:
    reply: pb.GetMemoryHistoryResponse = await caller.stub.GetMemoryHistory(
        pb.GetMemoryHistoryRequest(scope=ALICE, memory_id=memory_id)
    )
    return reply


async def state(pool: asyncpg.Pool, caller: Caller) -> tuple[int, int, list[tuple[Any, ...]]]:
    """(content version, edit rows, every memory row's mutable columns): what a write changes."""
    async with pool.acquire() as conn:
        version = await conn.fetchval(
            "SELECT coalesce(max(version), 0) FROM scope_versions WHERE tenant_id = $1",
            caller.tenant_id,
        )
        edits = await conn.fetchval(
            "SELECT count(*) FROM memory_edits WHERE tenant_id = $1", caller.tenant_id
        )
        rows = await conn.fetch(
            "SELECT memory_id, pinned, category, role, shared_all_agents, shared_all_personas,"
            " retention_policy, expires_at, confidence, last_reinforced_at, updated_at"
            " FROM memories WHERE tenant_id = $1 ORDER BY memory_id",
            caller.tenant_id,
        )
    return version, edits, [tuple(r) for r in rows]


def when(ts: Any) -> datetime:
    value: datetime = ts.ToDatetime(tzinfo=UTC)
    return value


async def expect_error(code: grpc.StatusCode, call: Any, match: str = "") -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == code, err.value.details()
    details = err.value.details() or ""
    assert match in details, details
    return details


# -- the paths ------------------------------------------------------------------------------------


async def test_unpin_keeps_the_memory_and_records_the_edit(caller: Caller) -> None:
    m = await remember(caller, "Prefers aisle seats on long flights", pinned=True)
    before = datetime.now(UTC)
    reply = await update(caller, m.memory_id, "pinned", pinned=False, reason="not key any more")
    assert reply.changed and not reply.displaced
    now = reply.memory
    assert (now.memory_id, now.content, now.pinned) == (m.memory_id, m.content, False)
    assert now.valid_from == m.valid_from and now.status == pb.MEMORY_STATUS_ACTIVE
    assert now.HasField("updated_at") and when(now.updated_at) >= before - timedelta(seconds=1)
    assert not m.HasField("updated_at")

    found = await history(caller, m.memory_id)
    assert [v.memory_id for v in found.versions] == [m.memory_id]
    assert found.versions[0].updated_at == now.updated_at
    [edit] = found.edits
    assert edit.memory_id == m.memory_id and list(edit.fields) == ["pinned"]
    assert dict(edit.before) == {"pinned": "true"} and dict(edit.after) == {"pinned": "false"}
    assert edit.reason == "not key any more" and edit.edited_at == now.updated_at


async def test_recategorise_and_change_role_and_confidence(caller: Caller) -> None:
    m = await remember(caller, "Works at the harbour office", category="context", confidence=0.7)
    reply = await update(
        caller,
        m.memory_id,
        "confidence",
        "category",
        "role",
        category="Profile",
        role="detail",
        confidence=0.95,
    )
    assert (reply.memory.category, reply.memory.role) == ("profile", "detail")
    assert reply.memory.confidence == pytest.approx(0.95)
    [edit] = (await history(caller, m.memory_id)).edits
    # Mask order is the contract's field order, whatever order the caller named them in.
    assert list(edit.fields) == ["category", "role", "confidence"]
    assert dict(edit.before) == {"category": "context", "role": "context", "confidence": "0.7"}
    assert dict(edit.after) == {"category": "profile", "role": "detail", "confidence": "0.95"}
    listed = await caller.stub.ListMemories(
        pb.ListMemoriesRequest(scope=ALICE, filters=pb.MemoryFilters(categories=["profile"]))
    )
    assert [x.memory_id for x in listed.memories] == [m.memory_id]


async def test_a_new_confidence_restarts_the_decay_clock(
    caller: Caller, pool: asyncpg.Pool
) -> None:
    m = await remember(caller, "Has a weekly tennis match", category="event", confidence=0.8)
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE memories SET recorded_at = recorded_at - interval '60 days'"
            " WHERE tenant_id = $1",
            caller.tenant_id,
        )
    assert (await get(caller, m.memory_id)).effective_confidence < 0.3  # two half-lives
    reply = await update(caller, m.memory_id, "confidence", confidence=0.6)
    assert reply.memory.effective_confidence == pytest.approx(0.6, abs=1e-3)
    assert reply.memory.HasField("last_reinforced_at")


async def test_sharing_change_shows_and_hides_it_from_another_agent(caller: Caller) -> None:
    m = await remember(caller, "Allergic to peanuts")
    await expect_error(C.NOT_FOUND, get(caller, m.memory_id, OTHER_AGENT))
    shared = await update(caller, m.memory_id, "sharing", sharing=pb.Sharing(all_agents=True))
    assert shared.memory.sharing.all_agents
    assert (await get(caller, m.memory_id, OTHER_AGENT)).content == "Allergic to peanuts"
    [edit] = (await history(caller, m.memory_id)).edits
    assert orjson.loads(edit.after["sharing"]) == {"all_agents": True, "all_personas": False}
    # Unset sharing in the mask: shared with no one.
    await update(caller, m.memory_id, "sharing")
    await expect_error(C.NOT_FOUND, get(caller, m.memory_id, OTHER_AGENT))
    assert len((await history(caller, m.memory_id)).edits) == 2


async def test_retention_ttl_sets_and_user_controlled_clears_the_expiry(caller: Caller) -> None:
    m = await remember(caller, "Is in Rome this week")
    assert not m.HasField("expires_at")
    start = datetime.now(UTC)
    ttl = await update(
        caller,
        m.memory_id,
        "retention_policy",
        "ttl",
        retention_policy=pb.RETENTION_POLICY_TTL,
        ttl=Duration(seconds=3_600),
    )
    expires = when(ttl.memory.expires_at)
    assert start + timedelta(seconds=3_590) <= expires <= start + timedelta(seconds=3_610)
    assert ttl.memory.retention_policy == pb.RETENTION_POLICY_TTL
    # "ttl" alone re-arms a TTL memory's expiry from now.
    longer = await update(caller, m.memory_id, "ttl", ttl=Duration(seconds=7_200))
    assert when(longer.memory.expires_at) - expires >= timedelta(seconds=3_590)
    kept = await update(
        caller,
        m.memory_id,
        "retention_policy",
        retention_policy=pb.RETENTION_POLICY_USER_CONTROLLED,
    )
    assert not kept.memory.HasField("expires_at")
    assert kept.memory.retention_policy == pb.RETENTION_POLICY_USER_CONTROLLED
    edits = (await history(caller, m.memory_id)).edits
    assert [list(e.fields) for e in edits] == [
        ["retention_policy", "ttl"],
        ["ttl"],
        ["retention_policy"],
    ]
    assert edits[0].before["ttl"] == "" and edits[0].after["ttl"] == "3600"
    assert 3_500 <= int(edits[1].before["ttl"]) <= 3_600
    assert dict(edits[2].after) == {"retention_policy": "RETENTION_POLICY_USER_CONTROLLED"}


async def test_session_retention_needs_the_memorys_session(caller: Caller) -> None:
    loose = await remember(caller, "Likes jazz")
    await expect_error(
        C.INVALID_ARGUMENT,
        update(
            caller,
            loose.memory_id,
            "retention_policy",
            retention_policy=pb.RETENTION_POLICY_SESSION,
        ),
        "retention_policy",
    )
    bound = await remember(caller, "Is on the train right now", session_id="s1")
    reply = await update(
        caller, bound.memory_id, "retention_policy", retention_policy=pb.RETENTION_POLICY_SESSION
    )
    assert reply.memory.retention_policy == pb.RETENTION_POLICY_SESSION
    assert reply.memory.HasField("expires_at")


async def test_pinning_past_the_core_limit_lists_what_it_displaced(caller: Caller) -> None:
    def fact(word: str) -> str:
        return (f"Remembers {word} from the trip" + " with friends and family" * 30)[:500]

    pins = [
        await remember(caller, fact(w), pinned=True) for w in ("ash", "birch", "cedar", "dogwood")
    ]
    extra = await remember(caller, fact("elm"))
    reply = await update(caller, extra.memory_id, "pinned", pinned=True)
    assert reply.changed and reply.memory.pinned
    assert [d.memory_id for d in reply.displaced] == [pins[0].memory_id]
    demoted = await get(caller, pins[0].memory_id)
    assert not demoted.pinned and demoted.HasField("demoted_at")
    # Unpinning needs no compaction and displaces nothing.
    assert not (await update(caller, pins[1].memory_id, "pinned", pinned=False)).displaced


async def test_values_equal_to_the_stored_ones_write_nothing(
    caller: Caller, pool: asyncpg.Pool
) -> None:
    m = await remember(caller, "Drinks tea, not coffee", category="preference", session_id="s1")
    before = await state(pool, caller)
    reply = await update(
        caller,
        m.memory_id,
        "pinned",
        "category",
        "sharing",
        "retention_policy",
        category="preference",
        retention_policy=pb.RETENTION_POLICY_USER_CONTROLLED,
    )
    assert not reply.changed and reply.memory.memory_id == m.memory_id
    assert not reply.memory.HasField("updated_at")
    assert await state(pool, caller) == before
    assert not (await history(caller, m.memory_id)).edits


async def test_an_update_invalidates_the_cached_packet(caller: Caller) -> None:
    m = await remember(caller, "Speaks Portuguese at home", category="context")
    request = pb.PrefetchRequest(scope=ALICE, session_id="s")
    await caller.stub.Prefetch(request)
    cached = await caller.stub.Prefetch(request)
    assert cached.cache == pb.CACHE_STATUS_HIT
    [fact] = [f for f in cached.facts if f.memory_id == m.memory_id]
    assert not fact.pinned and fact.category == "context"
    await update(caller, m.memory_id, "pinned", "category", pinned=True, category="profile")
    fresh = await caller.stub.Prefetch(request)
    assert fresh.cache != pb.CACHE_STATUS_HIT and fresh.version > cached.version
    [fact] = [f for f in fresh.facts if f.memory_id == m.memory_id]
    assert fact.pinned and fact.category == "profile"


async def test_another_agents_scope_cannot_update_a_shared_memory(
    caller: Caller, pool: asyncpg.Pool
) -> None:
    m = await remember(caller, "Lives in Oslo", sharing=pb.Sharing(all_agents=True))
    assert (await get(caller, m.memory_id, OTHER_AGENT)).memory_id == m.memory_id
    before = await state(pool, caller)
    await expect_error(
        C.NOT_FOUND, update(caller, m.memory_id, "pinned", sc=OTHER_AGENT, pinned=True)
    )
    await expect_error(C.NOT_FOUND, update(caller, str(uuid.uuid4()), "pinned", pinned=True))
    assert await state(pool, caller) == before


async def test_a_superseded_version_is_refused_and_still_readable(
    caller: Caller, pool: asyncpg.Pool
) -> None:
    old = await remember(caller, "Has two cats")
    new: pb.Memory = await caller.stub.Correct(
        pb.CorrectRequest(scope=ALICE, memory_id=old.memory_id, new_content="Has three cats")
    )
    before = await state(pool, caller)
    await expect_error(
        C.FAILED_PRECONDITION,
        update(caller, old.memory_id, "pinned", pinned=True),
        new.memory_id,
    )
    assert await state(pool, caller) == before
    superseded = await get(caller, old.memory_id)
    assert superseded.status == pb.MEMORY_STATUS_SUPERSEDED
    assert superseded.superseded_by_id == new.memory_id
    # Edits of every version show in the chain's history, oldest first.
    await update(caller, new.memory_id, "pinned", pinned=True)
    found = await history(caller, old.memory_id)
    assert [e.memory_id for e in found.edits] == [new.memory_id]


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("empty mask", {"paths": []}, "update_mask"),
    ("unknown path", {"paths": ["content"]}, "update_mask.paths[0]"),
    ("snake path typo", {"paths": ["pinned", "pined"]}, "update_mask.paths[1]"),
    ("zero confidence", {"paths": ["confidence"], "confidence": 0.0}, "confidence"),
    ("confidence above 1", {"paths": ["confidence"], "confidence": 1.5}, "confidence"),
    ("nan confidence", {"paths": ["confidence"], "confidence": float("nan")}, "confidence"),
    ("unknown category", {"paths": ["category"], "category": "hobby"}, "category"),
    ("empty category", {"paths": ["category"]}, "category"),
    ("unknown role", {"paths": ["role"], "role": "persona"}, "role"),
    (
        "ttl policy without ttl",
        {"paths": ["retention_policy"], "retention_policy": pb.RETENTION_POLICY_TTL},
        '"ttl"',
    ),
    (
        "ttl with another policy",
        {
            "paths": ["retention_policy", "ttl"],
            "retention_policy": pb.RETENTION_POLICY_USER_CONTROLLED,
            "ttl": Duration(seconds=60),
        },
        "ttl",
    ),
    ("ttl path without value", {"paths": ["ttl"]}, "ttl"),
    ("ttl alone on a kept memory", {"paths": ["ttl"], "ttl": Duration(seconds=60)}, "ttl"),
    (
        "ttl too long",
        {
            "paths": ["retention_policy", "ttl"],
            "retention_policy": pb.RETENTION_POLICY_TTL,
            "ttl": Duration(seconds=400_000_000),
        },
        "ttl",
    ),
    (
        "unspecified policy",
        {"paths": ["retention_policy"], "retention_policy": pb.RETENTION_POLICY_UNSPECIFIED},
        "retention_policy",
    ),
    ("reason too long", {"paths": ["pinned"], "pinned": True, "reason": "x" * 501}, "reason"),
    ("malformed id", {"paths": ["pinned"], "memory_id": "nope"}, "memory_id"),
    ("missing id", {"paths": ["pinned"], "memory_id": ""}, "memory_id"),
    ("missing scope", {"paths": ["pinned"], "scope": None}, "scope"),
]


@pytest.mark.parametrize(("case", "fields", "names"), BAD, ids=[b[0] for b in BAD])
async def test_bad_input_is_invalid_argument_and_writes_nothing(
    caller: Caller, pool: asyncpg.Pool, case: str, fields: dict[str, Any], names: str
) -> None:
    m = await remember(caller, "Plays the cello", category="context")
    fields = dict(fields)
    paths = fields.pop("paths")
    request = pb.UpdateMemoryRequest(
        memory_id=fields.pop("memory_id", m.memory_id), update_mask=FieldMask(paths=paths)
    )
    sc = fields.pop("scope", ALICE)
    if sc is not None:
        request.scope.CopyFrom(sc)
    for name, value in fields.items():
        if isinstance(value, Duration):
            getattr(request, name).CopyFrom(value)
        else:
            setattr(request, name, value)
    before = await state(pool, caller)
    await expect_error(C.INVALID_ARGUMENT, caller.stub.UpdateMemory(request), names)
    assert await state(pool, caller) == before


async def test_personal_data_kept_under_store_cannot_join_the_core_block(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool
) -> None:
    """Core memory never holds screened data (test_pii): pinning a memory whose content kept
    a phone number under the "store" policy is refused, and the reason is screened too."""
    await tenant_settings.save(pool, caller.tenant_id, pii_policy=parse_pii_policy("store"))
    server.runtime.policies.forget(caller.tenant_id)
    m = await remember(caller, "Old landline (415) 555-0132")
    assert m.content.endswith("555-0132")
    before = await state(pool, caller)
    for path, fields in (("pinned", {"pinned": True}), ("role", {"role": "core"})):
        await expect_error(C.FAILED_PRECONDITION, update(caller, m.memory_id, path, **fields), path)
    assert await state(pool, caller) == before
    await tenant_settings.save(
        pool, caller.tenant_id, pii_policy=parse_pii_policy("redact,phone=reject")
    )
    server.runtime.policies.forget(caller.tenant_id)
    await expect_error(
        C.INVALID_ARGUMENT,
        update(caller, m.memory_id, "category", category="event", reason="call (415) 555-0132"),
        "reason",
    )
    assert await state(pool, caller) == before


# -- GetMemory -------------------------------------------------------------------------------------


async def test_get_memory_by_scope(caller: Caller) -> None:
    own = await remember(caller, "Owns a red bicycle")
    shared = await remember(
        caller, "Is vegetarian", sc=OTHER_AGENT, sharing=pb.Sharing(all_agents=True)
    )
    private = await remember(caller, "Keeps a diary", sc=OTHER_AGENT)
    got = await get(caller, own.memory_id)
    assert (got.memory_id, got.content, got.scope.agent_id) == (own.memory_id, own.content, "a1")
    # Shared into this scope: readable (and shows the scope it was written in).
    assert (await get(caller, shared.memory_id)).scope.agent_id == "a2"
    await expect_error(C.NOT_FOUND, get(caller, private.memory_id))
    await expect_error(C.NOT_FOUND, get(caller, own.memory_id, pb.Scope(user_id="bob")))
    await expect_error(C.NOT_FOUND, get(caller, str(uuid.uuid4())))
    await expect_error(C.INVALID_ARGUMENT, get(caller, "not-a-uuid"), "memory_id")
    await expect_error(
        C.INVALID_ARGUMENT,
        caller.stub.GetMemory(pb.GetMemoryRequest(memory_id=own.memory_id)),
        "scope",
    )


# -- history everywhere: export, forget ------------------------------------------------------------


async def test_export_carries_updated_at_and_the_edits(caller: Caller) -> None:
    m = await remember(caller, "Runs every morning", pinned=True)
    await update(caller, m.memory_id, "pinned", pinned=False, reason="routine changed")
    call: Any = caller.stub.ExportMemories(pb.ExportMemoriesRequest(scope=ALICE))
    records = [orjson.loads(r.json) async for r in call if r.type == "memory"]
    [record] = records
    assert record["updated_at"] is not None and record["updated_at"].endswith("Z")
    [edit] = record["edits"]
    assert edit["fields"] == ["pinned"] and edit["reason"] == "routine changed"
    assert edit["before"] == {"pinned": "true"} and edit["after"] == {"pinned": "false"}
    assert edit["edited_at"] == record["updated_at"]
    uuid.UUID(edit["edit_id"])


async def test_forget_deletes_the_edits(caller: Caller, pool: asyncpg.Pool) -> None:
    m = await remember(caller, "Collects stamps")
    await update(caller, m.memory_id, "pinned", pinned=True)
    assert (await state(pool, caller))[1] == 1
    await caller.stub.Forget(pb.ForgetRequest(scope=ALICE, memory_ids=[m.memory_id]))
    assert (await state(pool, caller))[1] == 0


async def test_client_helpers(caller: Caller, server: MemsvcServer) -> None:
    m = await remember(caller, "Takes the 8:10 ferry")
    async with MemoryClient(f"127.0.0.1:{server.port}", api_key=caller.key) as client:
        reply = await client.update_memory(
            pb.UpdateMemoryRequest(
                scope=ALICE,
                memory_id=m.memory_id,
                update_mask=FieldMask(paths=["role"]),
                role="temporal",
            )
        )
        assert reply.changed and reply.memory.role == "temporal"
        got = await client.get_memory(pb.GetMemoryRequest(scope=ALICE, memory_id=m.memory_id))
        assert got.role == "temporal" and got.updated_at == reply.memory.updated_at


async def test_the_readme_grpcurl_lines(caller: Caller, server: MemsvcServer) -> None:
    """grpcurl takes update_mask as an object with its list of paths, as the README shows."""
    from tests.test_grpcurl import grpcurl

    m = await remember(caller, "Visits the dentist on Friday", sc=pb.Scope(user_id="alice"))
    body = {
        "scope": {"user_id": "alice"},
        "memory_id": m.memory_id,
        "update_mask": {"paths": ["category", "retention_policy", "ttl"]},
        "category": "event",
        "retention_policy": "RETENTION_POLICY_TTL",
        "ttl": "86400s",
    }
    code, out, err = await grpcurl(
        server,
        "memsvc.v1.MemoryService/UpdateMemory",
        data=orjson.dumps(body).decode(),
        key=caller.key,
    )
    assert code == 0, err
    reply = orjson.loads(out)
    assert reply["changed"] and reply["memory"]["category"] == "event"
    assert reply["memory"]["retention_policy"] == "RETENTION_POLICY_TTL"
    assert "updated_at" in reply["memory"] and "expires_at" in reply["memory"]
    ref = {"scope": {"user_id": "alice"}, "memory_id": m.memory_id}
    code, out, err = await grpcurl(
        server,
        "memsvc.v1.MemoryService/GetMemory",
        data=orjson.dumps(ref).decode(),
        key=caller.key,
    )
    assert code == 0, err
    assert orjson.loads(out)["category"] == "event"
