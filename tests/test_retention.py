"""Retention: TTL, SESSION and message expiry, proven against the real server and database.

Time is moved by rewriting ``expires_at`` in SQL (never by sleeping): an expired row is never
returned by any read even before the expiry task runs, then the task deletes it with what was
derived from it, in bounded batches, with several runs at once.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
import pytest
import redis.asyncio as aioredis
from google.protobuf.duration_pb2 import Duration

from memsvc.cache.keys import user_index_key
from memsvc.config import ConfigError, Settings
from memsvc.governance.expiry import ExpirySettings, ExpiryTask
from memsvc.prefetch import codec
from memsvc.prefetch import expiry as packet_expiry
from memsvc.prefetch.model import Packet
from memsvc.server.app import MemsvcServer
from memsvc.storage import retention, tenant_settings
from memsvc.storage.model import MemoryRecord, Scope
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import ingest, msg
from tests.read_helpers import prefetch, pscope, recall

TTL = pb.RETENTION_POLICY_TTL
SESSION = pb.RETENTION_POLICY_SESSION
USER_CONTROLLED = pb.RETENTION_POLICY_USER_CONTROLLED
HIT, MISS = pb.CACHE_STATUS_HIT, pb.CACHE_STATUS_MISS


async def remember(caller: Caller, content: str, **fields: object) -> pb.Memory:
    fields.setdefault("scope", pscope())
    reply: pb.RememberResponse = await caller.stub.Remember(
        pb.RememberRequest(content=content, **fields)  # type: ignore[arg-type]
    )
    return reply.memory


async def listed(caller: Caller, include_superseded: bool = True) -> list[str]:
    reply = await caller.stub.ListMemories(
        pb.ListMemoriesRequest(scope=pscope(), page_size=500, include_superseded=include_superseded)
    )
    return sorted(m.content for m in reply.memories)


async def expire_now(pool: asyncpg.Pool, table: str, tenant: str, where: str = "true") -> int:
    """Move time: every matching row of the tenant expired a second ago."""
    async with pool.acquire() as conn:
        status: str = await conn.execute(
            f"UPDATE {table} SET expires_at = now() - interval '1 second'"
            f" WHERE tenant_id = $1 AND {where}",
            tenant,
        )
    return int(status.split()[-1])


async def count(pool: asyncpg.Pool, table: str, tenant: str, where: str = "true") -> int:
    async with pool.acquire() as conn:
        value: int = await conn.fetchval(
            f"SELECT count(*) FROM {table} WHERE tenant_id = $1 AND {where}", tenant
        )
    return value


def seconds_from_now(ts: datetime | object) -> float:
    assert isinstance(ts, datetime)
    return (ts - datetime.now(UTC)).total_seconds()


def expiry(server: MemsvcServer, batch: int = 500) -> ExpiryTask:
    """An expiry task over the shared server (its own settings, the server's cache)."""
    runtime = server.runtime
    return ExpiryTask(runtime.pool, runtime.invalidator, ExpirySettings(batch=batch))


async def test_remember_ttl_is_stored_and_returned(caller: Caller) -> None:
    memory = await remember(
        caller, "Parked on level three", retention_policy=TTL, ttl=Duration(seconds=3600)
    )
    assert memory.retention_policy == TTL
    left = seconds_from_now(memory.expires_at.ToDatetime(tzinfo=UTC))
    assert 3500 < left <= 3600
    plain = await remember(caller, "Prefers window seats")
    assert plain.retention_policy == USER_CONTROLLED and not plain.HasField("expires_at")
    history = await caller.stub.GetMemoryHistory(
        pb.GetMemoryHistoryRequest(scope=pscope(), memory_id=memory.memory_id)
    )
    assert [v.retention_policy for v in history.versions] == [TTL]
    assert history.versions[0].expires_at == memory.expires_at


async def test_expired_memory_is_never_read_then_the_task_deletes_it_and_its_edges(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool, drain
) -> None:  # type: ignore[no-untyped-def]
    doomed = await remember(
        caller,
        "The user loves chess.",
        retention_policy=TTL,
        ttl=Duration(seconds=3600),
        pinned=True,
    )
    # Extraction reinforces the identical memory and links its episode to it (a derived edge).
    await ingest(caller, [msg("alice", "I love chess."), msg("alice", "I live in Oslo.")])
    await drain()
    edges = (
        "memory_id = ANY(SELECT memory_id FROM memories WHERE content = 'The user loves chess.')"
    )
    assert await count(pool, "episode_memories", caller.tenant_id, edges) == 1
    assert "The user loves chess." in await listed(caller)

    await expire_now(pool, "memories", caller.tenant_id, "content = 'The user loves chess.'")

    # Expiry racing a read: the row is still there, and no read returns it.
    assert await count(pool, "memories", caller.tenant_id, "content = 'The user loves chess.'") == 1
    facts = await recall(caller, "chess", types=[pb.ITEM_TYPE_FACT], top_k=50)
    assert all("chess" not in item.text.lower() for item in facts.items)
    # (The episode's own summary still quotes what was said: it is derived from the messages,
    # which are kept, not from the memory.)
    for packet in (await prefetch(caller), await prefetch(caller, hint="chess")):
        assert "The user loves chess." not in [f.content for f in packet.facts]
        assert "The user lives in Oslo." in [f.content for f in packet.facts]
    assert await listed(caller) == ["The user lives in Oslo."]
    for call, request in (
        (
            caller.stub.GetMemoryHistory,
            pb.GetMemoryHistoryRequest(scope=pscope(), memory_id=doomed.memory_id),
        ),
        (
            caller.stub.Correct,
            pb.CorrectRequest(scope=pscope(), memory_id=doomed.memory_id, new_content="x"),
        ),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(request)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND

    await expiry(server).run_once()

    assert await count(pool, "memories", caller.tenant_id, "content = 'The user loves chess.'") == 0
    assert await count(pool, "episode_memories", caller.tenant_id, edges) == 0
    # The episode came from the messages, which have not expired: it stays, as does the
    # extracted fact (facts without a policy never expire).
    assert await count(pool, "episodes", caller.tenant_id) == 1
    assert await listed(caller) == ["The user lives in Oslo."]


async def test_cached_packet_is_not_served_after_expiry(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool, redis_client: aioredis.Redis
) -> None:
    await remember(caller, "Allergic to cats", pinned=True)
    doomed = await remember(
        caller, "Gate code rotates today", retention_policy=TTL, ttl=Duration(seconds=4),
        pinned=True,
    )  # fmt: skip
    first, second = await prefetch(caller), await prefetch(caller)
    assert (first.cache, second.cache) == (MISS, HIT)
    assert "Gate code rotates today" in second.text
    # The cached packet lives no longer than the first expiry it shows (4 s, not 600 s).
    keys = await redis_client.smembers(user_index_key(caller.tenant_id, "alice"))
    assert keys
    for key in keys:
        assert await redis_client.pttl(key) <= 4_000

    # Wait (a condition, not a duration) until the database itself says it expired. No
    # write happened, so the user's content version is unchanged: only the packet's own
    # lifetime (and the check on a hit) keeps the cached copy from being served.
    async with pool.acquire() as conn:
        # Sleep in the database until its own clock has passed the expiry.
        await conn.execute(
            "SELECT pg_sleep(greatest(0, extract(epoch FROM expires_at - now())) + 0.01)"
            " FROM memories WHERE tenant_id = $1 AND memory_id = $2",
            caller.tenant_id,
            uuid.UUID(doomed.memory_id),
        )
    after = await prefetch(caller)
    assert after.cache == MISS
    assert "Gate code rotates today" not in after.text and "Allergic to cats" in after.text
    assert (await prefetch(caller)).cache == HIT

    async with pool.acquire() as conn:
        before = await conn.fetchval(
            "SELECT version FROM scope_versions WHERE tenant_id = $1", caller.tenant_id
        )
    await expiry(server).run_once()
    async with pool.acquire() as conn:
        bumped = await conn.fetchval(
            "SELECT version FROM scope_versions WHERE tenant_id = $1", caller.tenant_id
        )
    assert bumped > before
    assert not await redis_client.exists(user_index_key(caller.tenant_id, "alice"))
    final = await prefetch(caller)
    assert final.cache == MISS and "Allergic to cats" in final.text


def test_packet_lifetime_follows_what_it_shows() -> None:
    now = datetime.now(UTC)
    scope = Scope("t", "alice")

    def record(expires_at: datetime | None) -> MemoryRecord:
        return MemoryRecord(
            scope=scope, memory_id=uuid.uuid4(), lineage_id=uuid.uuid4(), content="x",
            category="context", role="core", confidence=1.0, reinforced_count=0, pinned=True,
            valid_from=now, recorded_at=now, status="active", origin="explicit",
            expires_at=expires_at,
        )  # fmt: skip

    def packet(*facts: MemoryRecord) -> Packet:
        return Packet(body="x", facts=facts, episodes=(), counts={}, withheld=(), version=1)

    assert packet_expiry.max_ttl_ms(packet(record(None)), now) is None
    soon = packet(record(None), record(now + timedelta(seconds=30)), record(now + timedelta(1)))
    assert packet_expiry.max_ttl_ms(soon, now) == 30_000
    assert packet_expiry.max_ttl_ms(packet(record(now - timedelta(seconds=1))), now) <= 0
    wire = codec.to_proto(soon)
    assert not packet_expiry.holds_expired(wire, now)
    assert packet_expiry.holds_expired(wire, now + timedelta(seconds=30))


async def test_message_ttl_per_tenant_and_episodes_expire_with_their_messages(
    new_caller, server: MemsvcServer, pool: asyncpg.Pool, drain
) -> None:  # type: ignore[no-untyped-def]
    short, never, default = await new_caller(), await new_caller(), await new_caller()
    await tenant_settings.save(pool, short.tenant_id, message_ttl_s=3600)
    await tenant_settings.save(pool, never.tenant_id, message_ttl_s=0)
    for caller in (short, never, default):
        await ingest(caller, [msg("alice", "I love chess."), msg("alice", "I play the cello.")])
    await drain()
    facts = await listed(short)
    assert facts

    async with pool.acquire() as conn:

        async def messages(tenant: str) -> list[asyncpg.Record]:
            rows: list[asyncpg.Record] = await conn.fetch(
                "SELECT retention_policy, expires_at FROM messages WHERE tenant_id = $1", tenant
            )
            return rows

        short_rows = await messages(short.tenant_id)
        assert {r["retention_policy"] for r in short_rows} == {"ttl"}
        assert all(3500 < seconds_from_now(r["expires_at"]) <= 3600 for r in short_rows)
        never_rows = await messages(never.tenant_id)
        assert {(r["retention_policy"], r["expires_at"]) for r in never_rows} == {
            ("user-controlled", None)
        }
        default_rows = await messages(default.tenant_id)
        assert all(
            89.9 * 86_400 < seconds_from_now(r["expires_at"]) <= 90 * 86_400 for r in default_rows
        )
        # An episode expires with the last of its source messages; never when they never do.
        episode_expiry = {
            r["tenant_id"]: r["expires_at"]
            for r in await conn.fetch(
                "SELECT tenant_id, expires_at FROM episodes WHERE tenant_id = ANY($1::text[])",
                [short.tenant_id, never.tenant_id],
            )
        }
        assert episode_expiry == {
            short.tenant_id: max(r["expires_at"] for r in short_rows),
            never.tenant_id: None,
        }

    # An hour later for everything of the short tenant (messages and the episode).
    for table in ("messages", "episodes"):
        await expire_now(pool, table, short.tenant_id)
    for kinds in ([pb.ITEM_TYPE_MESSAGE], [pb.ITEM_TYPE_EPISODE]):
        assert not (await recall(short, "chess cello", types=kinds, top_k=50)).items
        assert (await recall(never, "chess cello", types=kinds, top_k=50)).items
    assert not (await prefetch(short, hint="chess")).episodes
    assert (await prefetch(never, hint="chess")).episodes

    await expiry(server).run_once()

    for table in ("messages", "episodes", "topics", "topic_episodes", "episode_memories"):
        assert await count(pool, table, short.tenant_id) == 0, table
        assert await count(pool, table, never.tenant_id) > 0, table
    # The facts extracted from them have no retention policy: they stay.
    reply = await short.stub.ListMemories(pb.ListMemoriesRequest(scope=pscope()))
    assert sorted(m.content for m in reply.memories) == facts
    assert {(m.retention_policy, m.HasField("expires_at")) for m in reply.memories} == {
        (USER_CONTROLLED, False)
    }


async def test_an_expired_message_leaves_no_trace_in_its_neighbours_index(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool, drain
) -> None:  # type: ignore[no-untyped-def]
    await ingest(
        caller,
        [
            msg("alice", "We talked about the weather."),
            msg("alice", "My cousin moved to Zanzibar."),
            msg("alice", "Then we discussed lunch."),
        ],
    )
    await drain()
    indexed = "context_tsv @@ to_tsquery('english', 'zanzibar')"
    assert await count(pool, "messages", caller.tenant_id, indexed) == 3  # itself + neighbours

    await expire_now(pool, "messages", caller.tenant_id, "text LIKE '%Zanzibar%'")
    await expiry(server).run_once()

    assert await count(pool, "messages", caller.tenant_id) == 2
    assert await count(pool, "messages", caller.tenant_id, indexed) == 0
    # (The dense leg still returns the nearest remaining messages; no word matches any more.)
    hits = await recall(caller, "Zanzibar", types=[pb.ITEM_TYPE_MESSAGE], top_k=50)
    assert all(item.lexical_rank == 0 and "Zanzibar" not in item.text for item in hits.items)


async def test_session_memories_go_when_their_session_ends(
    caller: Caller, pool: asyncpg.Pool, drain
) -> None:  # type: ignore[no-untyped-def]
    ending = await remember(caller, "Wants the aisle seat", retention_policy=SESSION,
                            session_id="call-1")  # fmt: skip
    assert ending.retention_policy == SESSION
    assert 86_300 < seconds_from_now(ending.expires_at.ToDatetime(tzinfo=UTC)) <= 86_400
    await remember(caller, "Asked about refunds", retention_policy=SESSION, session_id="call-2")
    await remember(caller, "Flies to Lisbon often", session_id="call-1")
    # Corrected: the new version keeps SESSION and goes too.
    await caller.stub.Correct(
        pb.CorrectRequest(
            scope=pscope(), memory_id=ending.memory_id, new_content="Wants a window seat"
        )
    )
    # Another user's session of the same id is not theirs to end.
    await remember(caller, "Bob's note", retention_policy=SESSION, session_id="call-1",
                   scope=pscope("bob"))  # fmt: skip

    await ingest(caller, [], session="call-1", end_of_session=True)
    await drain()

    assert await listed(caller) == ["Asked about refunds", "Flies to Lisbon often"]
    assert await count(pool, "memories", caller.tenant_id, "session_id = 'call-1'") == 2


async def test_correct_keeps_retention_and_the_whole_chain_expires(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool
) -> None:
    first = await remember(
        caller, "Staying at the harbour hotel", retention_policy=TTL, ttl=Duration(seconds=7200)
    )
    second = await caller.stub.Correct(
        pb.CorrectRequest(
            scope=pscope(), memory_id=first.memory_id, new_content="Staying at the river hotel"
        )
    )
    assert second.retention_policy == TTL and second.expires_at == first.expires_at
    # Remembered again with another retention: every version of it follows.
    again = await remember(
        caller, "Staying at the river hotel", retention_policy=TTL, ttl=Duration(seconds=60)
    )
    history = await caller.stub.GetMemoryHistory(
        pb.GetMemoryHistoryRequest(scope=pscope(), memory_id=second.memory_id)
    )
    assert [v.expires_at for v in history.versions] == [again.expires_at] * 2

    await expire_now(pool, "memories", caller.tenant_id)
    assert await listed(caller) == []
    await expiry(server).run_once()
    assert await count(pool, "memories", caller.tenant_id) == 0

    # Should only the current version have expired, the task still takes the whole chain.
    old = await remember(
        caller, "Room on floor two", retention_policy=TTL, ttl=Duration(seconds=60)
    )
    await caller.stub.Correct(
        pb.CorrectRequest(scope=pscope(), memory_id=old.memory_id, new_content="Room on floor six")
    )
    await expire_now(pool, "memories", caller.tenant_id, "invalid_at IS NULL")
    await expiry(server).run_once()
    assert await count(pool, "memories", caller.tenant_id) == 0


async def test_remember_sets_retention_and_never_revives_an_expired_memory(
    caller: Caller, pool: asyncpg.Pool
) -> None:
    temporary = await remember(
        caller, "Likes green tea", retention_policy=TTL, ttl=Duration(seconds=600)
    )
    # Said again without a policy: the same memory, kept for good now.
    kept = await caller.stub.Remember(pb.RememberRequest(scope=pscope(), content="Likes green tea"))
    assert kept.reinforced and kept.memory.memory_id == temporary.memory_id
    assert kept.memory.retention_policy == USER_CONTROLLED
    assert not kept.memory.HasField("expires_at")

    short = await remember(caller, "Visiting Rome", retention_policy=TTL, ttl=Duration(seconds=9))
    await expire_now(pool, "memories", caller.tenant_id, "content = 'Visiting Rome'")
    again = await caller.stub.Remember(pb.RememberRequest(scope=pscope(), content="Visiting Rome"))
    assert not again.reinforced and again.memory.memory_id != short.memory_id
    assert again.memory.retention_policy == USER_CONTROLLED
    assert await count(pool, "memories", caller.tenant_id, "content = 'Visiting Rome'") == 1
    assert await listed(caller) == ["Likes green tea", "Visiting Rome"]


async def _seed_expired(caller: Caller, pool: asyncpg.Pool, memories: int, messages: int) -> None:
    """Memories (every third one corrected once, so chains too) and messages, all expired."""
    for i in range(memories):
        m = await remember(
            caller, f"Errand item {i}",
            retention_policy=TTL, ttl=Duration(seconds=3600),
        )  # fmt: skip
        if i % 3 == 0:
            await caller.stub.Correct(
                pb.CorrectRequest(
                    scope=pscope(), memory_id=m.memory_id, new_content=f"Fixed errand item {i}"
                )
            )
    await tenant_settings.save(pool, caller.tenant_id, message_ttl_s=3600)
    if messages:
        await ingest(
            caller,
            [msg("bot", f"Hold music line {i}", role=pb.MESSAGE_ROLE_ASSISTANT)
             for i in range(messages)],
        )  # fmt: skip
    await expire_now(pool, "memories", caller.tenant_id)
    await expire_now(pool, "messages", caller.tenant_id)


async def test_batches_are_bounded_and_all_rows_go(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool
) -> None:
    await _seed_expired(caller, pool, memories=21, messages=25)
    rows = await count(pool, "memories", caller.tenant_id)
    assert rows == 28  # 21 + 7 corrected versions

    # One statement takes at most a batch of expired rows (plus, for a current version, the
    # older versions of its chain).
    async with pool.acquire() as conn:
        assert len(await retention.expire_messages(conn, 7)) == 7
        assert 7 <= len(await retention.expire_memories(conn, 7)) <= 14
    task = expiry(server, batch=7)
    report = await task.run_once()

    assert await count(pool, "memories", caller.tenant_id) == 0
    assert await count(pool, "messages", caller.tenant_id) == 0
    assert report.memories >= rows - 14 and report.messages >= 18
    # 18 messages left at 7 a batch: 3 batches; at least one more for memories.
    assert report.batches >= 4
    assert (await task.run_once()).total == 0


async def test_concurrent_expiry_runs_do_not_block_each_other(
    caller: Caller, server: MemsvcServer, pool: asyncpg.Pool
) -> None:
    await _seed_expired(caller, pool, memories=30, messages=40)
    tasks = [expiry(server, batch=4) for _ in range(4)]
    # A deadlock would surface as DeadlockDetectedError from one of the runs.
    reports = await asyncio.gather(*(t.run_once() for t in tasks))
    assert await count(pool, "memories", caller.tenant_id) == 0
    assert await count(pool, "messages", caller.tenant_id) == 0
    assert sum(r.memories for r in reports) >= 40 and sum(r.messages for r in reports) >= 40


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"retention_policy": TTL}, "ttl: required"),
        ({"retention_policy": TTL, "ttl": Duration(nanos=500_000_000)}, "ttl: between"),
        ({"retention_policy": TTL, "ttl": Duration(seconds=-5)}, "ttl: between"),
        ({"retention_policy": TTL, "ttl": Duration(seconds=11 * 366 * 86_400)}, "ttl: between"),
        ({"retention_policy": TTL, "ttl": Duration(seconds=5, nanos=-1)}, "ttl: not a valid"),
        ({"ttl": Duration(seconds=60)}, "ttl: only with"),
        ({"retention_policy": USER_CONTROLLED, "ttl": Duration(seconds=60)}, "ttl: only with"),
        ({"retention_policy": SESSION}, "session_id: required"),
        (
            {"retention_policy": SESSION, "session_id": "s", "ttl": Duration(seconds=60)},
            "ttl: only with",
        ),
        ({"retention_policy": 9}, "retention_policy: unknown"),
    ],
)
async def test_bad_retention_is_refused_and_writes_nothing(
    caller: Caller, pool: asyncpg.Pool, fields: dict[str, object], message: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await remember(caller, "Anything at all", **fields)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (info.value.details() or "")
    assert await count(pool, "memories", caller.tenant_id) == 0


def test_retention_settings() -> None:
    settings = Settings.from_env(
        {
            "MEMSVC_SESSION_RETENTION_S": "3600",
            "MEMSVC_EXPIRY_INTERVAL_S": "5",
            "MEMSVC_EXPIRY_BATCH": "100",
        }
    )
    assert (settings.session_retention_s, settings.expiry_interval_s, settings.expiry_batch) == (
        3600,
        5.0,
        100,
    )
    default = Settings()
    assert (default.session_retention_s, default.expiry_interval_s, default.expiry_batch) == (
        86_400,
        60.0,
        500,
    )
    for name in ("EXPIRY_BATCH", "SESSION_RETENTION_S", "EXPIRY_INTERVAL_S"):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env({f"MEMSVC_{name}": "0"})
