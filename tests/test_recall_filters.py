"""Recall filters (categories, roles, origins, sessions, since/until) on every item kind and
mode, relevance and min_score, and bad filters (INVALID_ARGUMENT naming the field)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
import numpy as np
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from memsvc.client import MemoryClient, MemsvcCallError, scope
from memsvc.concurrency.deadline import Budget
from memsvc.embedding import Embedder
from memsvc.retrieval.dense import dense_hits, dense_sql
from memsvc.retrieval.query import ItemKind, RecallFilters
from memsvc.server.app import MemsvcServer
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.ingest_helpers import ingest, msg
from tests.read_helpers import (
    StartServer,
    days_ago,
    dscope,
    pscope,
    recall,
    seed_episode,
    seed_messages,
    stub_for,
)
from tests.read_helpers import start_server as start_server  # fixture
from tests.test_dense_exactness import copy_rows, unit
from tests.test_explicit_memory import remember
from tests.test_read_input import _nothing_written

FACT, EPISODE, MESSAGE = pb.ITEM_TYPE_FACT, pb.ITEM_TYPE_EPISODE, pb.ITEM_TYPE_MESSAGE
ALL = [FACT, EPISODE, MESSAGE]
MODES = [pb.RECALL_MODE_HYBRID, pb.RECALL_MODE_DENSE, pb.RECALL_MODE_LEXICAL]
NO_MINIMUM = 0.0


def ts(value: datetime) -> Timestamp:
    t = Timestamp()
    t.FromDatetime(value)
    return t


def filters(**fields: object) -> pb.RecallFilters:
    fields.setdefault("min_score", NO_MINIMUM)
    return pb.RecallFilters(**fields)  # type: ignore[arg-type]


async def texts(caller: Caller, query: str, **fields: object) -> set[str]:
    fields.setdefault("top_k", 50)
    reply = await recall(caller, query, **fields)
    assert not reply.degraded
    return {item.text for item in reply.items}


async def _hiking_everywhere(caller: Caller, pool: asyncpg.Pool, embedder: Embedder) -> None:
    """Facts of several categories, roles and origins, plus an episode and a message, all
    about hiking."""
    await remember(caller, "Loves hiking in the Alps", category="preference", role="detail")
    await remember(caller, "Hiking boots are size 43", category="profile", role="core")
    wrong = (await remember(caller, "Goes hiking with Tom", category="relationship")).memory
    await caller.stub.Correct(
        pb.CorrectRequest(
            scope=pscope(), memory_id=wrong.memory_id, new_content="Goes hiking with Tim"
        )
    )
    scope = dscope(caller)
    await seed_messages(pool, embedder, scope, ["We went hiking near Zermatt"], session_id="s9")
    await seed_episode(
        pool,
        embedder,
        scope,
        session_id="s9",
        title="Hiking trip",
        summary="Talked about hiking near Zermatt",
        ended_at=days_ago(1),
    )


@pytest.mark.parametrize("mode", MODES)
async def test_fact_only_filters(
    caller: Caller, pool: asyncpg.Pool, embedder: Embedder, mode: pb.RecallMode
) -> None:
    await _hiking_everywhere(caller, pool, embedder)
    query = "hiking"
    everything = await texts(caller, query, types=ALL, mode=mode, filters=filters())
    assert {"We went hiking near Zermatt", "Hiking trip: Talked about hiking near Zermatt"} <= (
        everything
    )
    assert "Goes hiking with Tom" not in everything  # superseded: not current

    def only(**f: object) -> object:
        return texts(caller, query, types=ALL, mode=mode, filters=filters(**f))

    # Fact-only filters leave episodes and messages out.
    assert await only(categories=["preference"]) == {"Loves hiking in the Alps"}
    assert await only(categories=["PROFILE", "preference"]) == {
        "Loves hiking in the Alps",
        "Hiking boots are size 43",
    }
    assert await only(roles=["core"]) == {"Hiking boots are size 43"}
    assert await only(origins=["correction"]) == {"Goes hiking with Tim"}
    assert await only(origins=["explicit"], roles=["detail"]) == {"Loves hiking in the Alps"}
    assert await only(origins=["extraction"]) == set()
    # Asked for messages only, a fact-only filter matches nothing.
    reply = await recall(
        caller, query, types=[MESSAGE], mode=mode, filters=filters(categories=["preference"])
    )
    assert list(reply.items) == [] and not reply.degraded


async def test_session_filter_on_every_kind(caller: Caller, drain) -> None:  # type: ignore[no-untyped-def]
    await ingest(caller, [msg("alice", "I live in Bergen."), msg("alice", "I love chess.")])
    await ingest(
        caller, [msg("alice", "I love sailing."), msg("alice", "I live in Bergen.")], session="s2"
    )
    await drain()
    for mode in MODES:
        reply = await recall(
            caller,
            "Bergen chess sailing",
            types=ALL,
            top_k=50,
            mode=mode,
            filters=filters(session_ids=["s2"]),
        )
        kinds = {item.type for item in reply.items}
        assert kinds == {FACT, EPISODE, MESSAGE}, (mode, reply.items)
        assert {item.session_id for item in reply.items} == {"s2"}
        assert not any("chess" in item.text for item in reply.items)
        unfiltered = await recall(
            caller, "Bergen chess sailing", types=ALL, top_k=50, mode=mode, filters=filters()
        )
        assert {item.session_id for item in unfiltered.items} == {"s1", "s2"}
    # The extracted facts are of origin "extraction".
    extracted = await texts(
        caller, "chess", types=ALL, filters=filters(origins=["extraction"], session_ids=["s1"])
    )
    assert any("chess" in t for t in extracted) and all("sailing" not in t for t in extracted)


@pytest.mark.parametrize("mode", MODES)
async def test_time_range_on_messages_and_episodes(
    caller: Caller, pool: asyncpg.Pool, embedder: Embedder, mode: pb.RecallMode
) -> None:
    scope = dscope(caller)
    old, new = datetime(2024, 3, 1, tzinfo=UTC), datetime(2025, 3, 1, tzinfo=UTC)
    await seed_messages(
        pool, embedder, scope, ["The garden roses bloomed"], session_id="a", start=old
    )
    await seed_messages(
        pool, embedder, scope, ["The garden tulips bloomed"], session_id="b", start=new
    )
    for session, when, flower in (("a", old, "roses"), ("b", new, "tulips")):
        await seed_episode(
            pool,
            embedder,
            scope,
            session_id=session,
            title="Garden",
            summary=f"The {flower} in the garden bloomed",
            ended_at=when + timedelta(minutes=30),
        )
    query = "garden flowers bloomed"

    async def between(since: datetime | None, until: datetime | None) -> set[str]:
        f = filters()
        if since is not None:
            f.since.CopyFrom(ts(since))
        if until is not None:
            f.until.CopyFrom(ts(until))
        found = await texts(caller, query, types=[EPISODE, MESSAGE], mode=mode, filters=f)
        return {
            ("roses" if "roses" in t else "tulips") + ("/e" if ":" in t else "/m") for t in found
        }

    assert await between(None, None) == {"roses/e", "roses/m", "tulips/e", "tulips/m"}
    assert await between(datetime(2025, 1, 1, tzinfo=UTC), None) == {"tulips/e", "tulips/m"}
    assert await between(None, datetime(2025, 1, 1, tzinfo=UTC)) == {"roses/e", "roses/m"}
    # Messages by sent_at in [since, until); episodes: ended at or after since, started before
    # until (the episode of session "a" ran 00:00-00:30 on its day: it overlaps 00:10-00:20).
    assert await between(old + timedelta(minutes=10), old + timedelta(minutes=20)) == {"roses/e"}
    assert await between(old, old + timedelta(seconds=1)) == {"roses/e", "roses/m"}
    assert await between(old + timedelta(seconds=1), new) == {"roses/e"}


@pytest.mark.parametrize("mode", MODES)
async def test_time_range_on_fact_validity(caller: Caller, mode: pb.RecallMode) -> None:
    held_from = datetime(2020, 1, 1, tzinfo=UTC)
    old = (await remember(caller, "Works as a baker in Porto", valid_from=ts(held_from))).memory
    before_correction = datetime.now(UTC)
    await caller.stub.Correct(
        pb.CorrectRequest(
            scope=pscope(), memory_id=old.memory_id, new_content="Works as a chef in Porto"
        )
    )
    after_correction = datetime.now(UTC) + timedelta(seconds=1)
    query = "what is her job in Porto"

    async def during(since: datetime | None, until: datetime | None, **fields: object) -> set[str]:
        f = filters()
        if since is not None:
            f.since.CopyFrom(ts(since))
        if until is not None:
            f.until.CopyFrom(ts(until))
        return await texts(caller, query, types=[FACT], mode=mode, filters=f, **fields)

    baker, chef = "Works as a baker in Porto", "Works as a chef in Porto"
    # No range: the current version only.
    assert await during(None, None) == {chef}
    # A range reaches every version valid in it: the superseded one included.
    assert await during(datetime(2021, 1, 1, tzinfo=UTC), datetime(2022, 1, 1, tzinfo=UTC)) == {
        baker
    }
    assert await during(None, before_correction) == {baker}
    assert await during(datetime(2019, 1, 1, tzinfo=UTC), None) == {baker, chef}
    assert await during(after_correction, None) == {chef}
    assert await during(None, held_from) == set()
    # With as_of: what held then, narrowed by the range.
    as_of = ts(datetime(2021, 6, 1, tzinfo=UTC))
    assert await during(datetime(2021, 1, 1, tzinfo=UTC), None, as_of=as_of) == {baker}
    assert await during(after_correction, None, as_of=as_of) == set()


PERSONAL = [
    "My brother lives in Oslo",
    "Allergic to peanuts",
    "Works as a nurse at the city hospital",
    "Daughter Maya starts school in September",
    "Prefers tea over coffee in the morning",
    "Plays the cello in a community orchestra",
]


@pytest.mark.parametrize("mode", [pb.RECALL_MODE_HYBRID, pb.RECALL_MODE_DENSE])
async def test_min_score_default_drops_noise_keeps_answers(
    caller: Caller, mode: pb.RecallMode
) -> None:
    for content in PERSONAL:
        await remember(caller, content)
    unrelated = await recall(caller, "what is the capital of Peru?", mode=mode)
    assert list(unrelated.items) == [] and not unrelated.degraded
    # min_score 0: no minimum, the noise comes back.
    noise = await recall(
        caller, "what is the capital of Peru?", mode=mode, filters=filters(min_score=0.0)
    )
    assert len(noise.items) == len(PERSONAL)
    assert all(0.0 <= item.relevance < 0.2 for item in noise.items)
    # Real questions keep their answers under the default.
    for question, answer in (
        ("where does my brother live?", "My brother lives in Oslo"),
        ("what can't she eat?", "Allergic to peanuts"),
        ("which instrument does she play", "Plays the cello in a community orchestra"),
        ("what does she drink at breakfast", "Prefers tea over coffee in the morning"),
    ):
        reply = await recall(caller, question, mode=mode)
        assert reply.items and reply.items[0].text == answer, (question, reply.items)
        assert 0.2 <= reply.items[0].relevance <= 1.0
    # An explicit minimum above every item's relevance returns nothing.
    high = await recall(
        caller, "where does my brother live?", mode=mode, filters=filters(min_score=0.99)
    )
    assert list(high.items) == []


async def test_the_default_minimum_gates_the_answer_a_callers_filters_each_item(
    caller: Caller,
) -> None:
    """Default: a relevant answer comes back whole (top_k, its weaker items too); an explicit
    min_score drops each item below it."""
    for content in PERSONAL:
        await remember(caller, content)
    question = "where does my brother live?"
    gated = await recall(caller, question, top_k=len(PERSONAL))
    assert gated.items[0].text == "My brother lives in Oslo"
    assert len(gated.items) == len(PERSONAL)
    assert any(item.relevance < 0.2 for item in gated.items)
    per_item = await recall(caller, question, top_k=len(PERSONAL), filters=filters(min_score=0.2))
    assert 1 <= len(per_item.items) < len(PERSONAL)
    assert all(item.relevance >= 0.2 for item in per_item.items)


async def test_relevance_of_lexical_only_hits(caller: Caller) -> None:
    """Hybrid: a hit only the lexical leg found still gets its cosine relevance (the same
    measure as the dense leg's); lexical mode: the share of the query's words matched."""
    await remember(caller, "Visited Cuzco and Lima in Peru last spring")
    await remember(caller, "Paints watercolours on weekends")
    reply = await recall(caller, "Peru", filters=filters(min_score=0.0), top_k=2)
    top = reply.items[0]
    assert top.text.startswith("Visited Cuzco") and top.lexical_rank == 1
    assert 0.2 < top.relevance <= 1.0
    lexical = await recall(
        caller, "Peru trip souvenirs", mode=pb.RECALL_MODE_LEXICAL, filters=filters(min_score=0.0)
    )
    [only] = lexical.items
    assert abs(only.relevance - 1 / 3) < 1e-6  # one of the query's three words
    stricter = await recall(
        caller, "Peru trip souvenirs", mode=pb.RECALL_MODE_LEXICAL, filters=filters(min_score=0.5)
    )
    assert list(stricter.items) == []


async def test_narrow_filter_on_a_large_scope_stays_exact(
    caller: Caller, pool: asyncpg.Pool, embedder: Embedder, start_server: StartServer
) -> None:
    """A scope above dense_exact_max_rows takes the index branch; when a filter leaves that
    scan short of the limit, the exact branch ranks the matching rows instead, so none goes
    missing although other users' rows crowd the query's neighbourhood."""
    rng = np.random.default_rng(15)
    dim = embedder.dimension
    query = unit(rng.standard_normal(dim))
    others = unit(query + 0.6 * unit(rng.standard_normal((1_500, dim))))
    mine = unit(rng.standard_normal((300, dim)) + 0.3 * query)
    tenant = caller.tenant_id
    _, my_ids = await asyncio.gather(
        copy_rows(
            pool, tenant, [f"other-{i % 50}" for i in range(1_500)], others, embedder.model_id
        ),
        copy_rows(pool, tenant, ["alice"] * 300, mine, embedder.model_id),
    )
    try:
        narrow = my_ids[::25]  # 12 goals among 300 context facts (category has no index)
        async with pool.acquire() as conn:
            await conn.execute(
                "UPDATE memories SET category = 'goal' WHERE tenant_id = $1"
                " AND memory_id::text = ANY($2::text[])",
                tenant,
                narrow,
            )
            await conn.execute("ANALYZE memories")
        index = {m: i for i, m in enumerate(my_ids)}
        truth = sorted(narrow, key=lambda m: -float(mine[index[m]] @ query))
        _srv, channel = await start_server(dense_exact_max_rows=20)
        reply = await stub_for(channel, caller).Recall(
            pb.RecallRequest(
                scope=pscope("alice"),
                query_vector=[float(x) for x in query],
                top_k=10,
                types=[FACT],
                mode=pb.RECALL_MODE_DENSE,
                filters=filters(categories=["goal"]),
            )
        )
        assert not reply.degraded
        assert [i.id for i in reply.items] == truth[:10]
        # An index scan that comes back short (a tiny scan limit here; in production, a
        # narrow filter over millions of rows): the exact branch takes over.
        filtered = RecallFilters(categories=("goal",))
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL hnsw.max_scan_tuples = 30")
            await conn.execute("SET LOCAL hnsw.ef_search = 10")
            await conn.execute("SET LOCAL enable_sort = off")  # the index for the ORDER BY
            sql = dense_sql((ItemKind.FACT,), with_as_of=False, shape=filtered.shape)
            args = [*dscope(caller).key, query, embedder.model_id, 20, 10, ["goal"]]
            plan = [r[0] for r in await conn.fetch(f"EXPLAIN (ANALYZE, COSTS OFF) {sql}", *args)]
            hits = await dense_hits(
                conn,
                dscope(caller),
                query,
                (ItemKind.FACT,),
                model_id=embedder.model_id,
                limit=10,
                exact_max_rows=20,
                as_of=None,
                budget=Budget(5.0),
                filters=filtered,
            )
        hnsw = [line for line in plan if "memories_embedding_hnsw" in line]
        assert hnsw and not any("never executed" in line for line in hnsw), plan
        assert [h.id for h in hits] == truth[:10]
    finally:
        async with pool.acquire() as conn:
            # Thousands of rows, each through the change triggers: past the pool's 5 s
            # statement bound on a busy moment (a cleanup, not a measured statement).
            await conn.execute("DELETE FROM memories WHERE tenant_id = $1", tenant, timeout=60)


def _ts_seconds(seconds: int) -> Timestamp:
    return Timestamp(seconds=seconds)


BAD_FILTERS = [
    ({"categories": ["hobby"]}, "filters.categories[0]"),
    ({"categories": ["preference", ""]}, "filters.categories[1]"),
    ({"categories": ["context"] * 21}, "filters.categories"),
    ({"roles": ["boss"]}, "filters.roles[0]"),
    ({"roles": ["core"] * 21}, "filters.roles"),
    ({"origins": ["imported-by-hand"]}, "filters.origins[0]"),
    ({"origins": ["explicit"] * 11}, "filters.origins"),
    ({"session_ids": [""]}, "filters.session_ids[0]"),
    ({"session_ids": ["x" * 129]}, "filters.session_ids[0]"),
    ({"session_ids": [f"s{i}" for i in range(101)]}, "filters.session_ids"),
    ({"since": _ts_seconds(2_000_000_000), "until": _ts_seconds(1_000_000_000)}, "filters.since"),
    ({"since": _ts_seconds(1_000_000_000), "until": _ts_seconds(1_000_000_000)}, "filters.since"),
    ({"until": _ts_seconds(-10_000_000_000)}, "filters.until"),
    ({"min_score": 1.5}, "filters.min_score"),
    ({"min_score": -0.1}, "filters.min_score"),
    ({"min_score": float("nan")}, "filters.min_score"),
]


@pytest.mark.parametrize(("fields", "field_name"), BAD_FILTERS)
async def test_bad_filters(
    caller: Caller, pool: asyncpg.Pool, fields: dict[str, object], field_name: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await caller.stub.Recall(
            pb.RecallRequest(
                scope=pscope(),
                query="anything",
                filters=pb.RecallFilters(**fields),  # type: ignore[arg-type]
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(field_name + ":"), err.value.details()
    await _nothing_written(pool, caller)


async def test_python_client_passes_filters(caller: Caller, server: MemsvcServer) -> None:
    await remember(caller, "Loves hiking in the Alps", category="preference")
    await remember(caller, "Hiking boots are size 43", category="profile")
    async with MemoryClient(f"127.0.0.1:{server.port}", api_key=caller.key) as client:
        reply = await client.recall(
            pb.RecallRequest(
                scope=scope("alice"),
                query="hiking",
                filters=pb.RecallFilters(categories=["profile"]),
            )
        )
        assert [i.text for i in reply.items] == ["Hiking boots are size 43"]
        assert 0.2 <= reply.items[0].relevance <= 1.0
        with pytest.raises(MemsvcCallError) as err:
            await client.recall(
                pb.RecallRequest(
                    scope=scope("alice"), query="x", filters=pb.RecallFilters(min_score=2.0)
                )
            )
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_relevance_measures() -> None:
    """Units: a dense hit's relevance is 1 - its distance; a lexical-only hit's, the cosine of
    its stored embedding when the query is embedded, else its word coverage; clipped to 0..1."""
    from memsvc.retrieval.fusion import Fused
    from memsvc.retrieval.query import Hit
    from memsvc.retrieval.relevance import relevance
    from memsvc.storage.model import Scope

    def hit(score: float, **fields: object) -> Fused:
        h = Hit(
            kind=ItemKind.FACT,
            id="x",
            text="t",
            session_id="",
            occurred_at=datetime.now(UTC),
            scope=Scope("t", "u", "", ""),
            shared_all_agents=False,
            shared_all_personas=False,
            score=score,
            **fields,  # type: ignore[arg-type]
        )
        return Fused(h, 0.1, {})

    query = np.array([1.0, 0.0], dtype=np.float32)
    assert relevance(hit(0.25), query) == pytest.approx(0.75)
    assert relevance(hit(1.6), query) == 0.0  # opposite: clipped
    lexical = hit(3.0, coverage=0.5, embedding=np.array([1.0, 1.0], dtype=np.float32))
    assert relevance(lexical, query) == pytest.approx(2**-0.5)
    assert relevance(lexical, None) == 0.5
    assert relevance(hit(3.0, coverage=0.25), query) == 0.25  # not embedded yet


def test_filter_sql_numbers_parameters_in_filter_args_order() -> None:
    from memsvc.retrieval.sources import EPISODES, FACTS, MESSAGES

    since, until = datetime(2024, 1, 1, tzinfo=UTC), datetime(2025, 1, 1, tzinfo=UTC)
    f = RecallFilters(
        categories=("goal",), origins=("explicit",), session_ids=("s",), since=since, until=until
    )
    assert FACTS.filter_sql(f.shape, 9) == (
        " AND category = ANY($9::text[]) AND origin = ANY($10::text[])"
        " AND session_id = ANY($11::text[])"
        " AND (invalid_at IS NULL OR invalid_at > $12::timestamptz)"
        " AND valid_from < $13::timestamptz"
    )
    ranged = RecallFilters(session_ids=("s",), until=until)
    assert EPISODES.filter_sql(ranged.shape, 5) == (
        " AND session_id = ANY($5::text[]) AND started_at < $6::timestamptz"
    )
    assert MESSAGES.filter_sql(RecallFilters(since=since).shape, 8) == (
        " AND sent_at >= $8::timestamptz"
    )
    assert (
        RecallFilters().shape == (False,) * 6 and FACTS.filter_sql(RecallFilters().shape, 9) == ""
    )
    assert f.kinds((ItemKind.FACT, ItemKind.MESSAGE)) == (ItemKind.FACT,)


def test_episodes_have_their_own_default_minimum_and_a_callers_applies_to_all() -> None:
    """Unset min_score: facts and messages need MEMSVC_RECALL_MIN_RELEVANCE, episodes the
    lower MEMSVC_RECALL_MIN_RELEVANCE_EPISODE; a caller's min_score applies to every kind."""
    from memsvc.config import Settings
    from memsvc.server import validate_read
    from memsvc.storage.model import Scope

    settings = Settings(recall_min_relevance=0.2, recall_min_relevance_episode=0.05)
    where = Scope("t", "alice", "", "")
    default = validate_read.recall(pb.RecallRequest(query="coffee"), where, settings)
    assert default.minimum(ItemKind.FACT) == default.minimum(ItemKind.MESSAGE) == 0.2
    assert default.minimum(ItemKind.EPISODE) == 0.05
    chosen = pb.RecallRequest(query="coffee", filters=pb.RecallFilters(min_score=0.3))
    explicit = validate_read.recall(chosen, where, settings)
    assert [explicit.minimum(k) for k in ItemKind] == pytest.approx([0.3, 0.3, 0.3])
