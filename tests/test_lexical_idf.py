"""The lexical leg weighs each query word by its rarity in the scope (BM25's IDF)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg

from memsvc.concurrency.deadline import Budget
from memsvc.retrieval.lexical import lexical_hits
from memsvc.retrieval.query import ItemKind
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.read_helpers import StartServer, pscope, stub_for
from tests.read_helpers import start_server as start_server  # fixture
from tests.test_message_speakers import ingest, turn

# Five turns about coffee, then one about a knee: "coffee" is common in this user's
# messages, "knee" rare. Their neighbours also put "coffee" in every coffee turn's context;
# two turns in between keep it out of the knee turn's.
TURNS = [
    "I drink coffee at breakfast",
    "More coffee after lunch",
    "Coffee with milk, no sugar",
    "An espresso coffee at four",
    "Decaf coffee in the evening",
    "Nice weather today",
    "Yes, sunny and warm",
    "My knee hurts after running",
]
KNEE = "m7"
QUERY = "coffee for my knee"


async def seeded(caller: Caller, drain: Callable[[], Awaitable[int]], user: str) -> None:
    await ingest(caller, [turn(i, text, "u-1") for i, text in enumerate(TURNS)], user=user)
    assert await drain() >= 1


async def idf_recall(caller: Caller, start_server: StartServer) -> pb.RecallResponse:
    """A lexical Recall of QUERY in the owner's scope, on a server with MEMSVC_LEXICAL_IDF."""
    _, channel = await start_server(lexical_idf=True)
    reply: pb.RecallResponse = await stub_for(channel, caller).Recall(
        pb.RecallRequest(
            query=QUERY,
            scope=pscope("owner"),
            types=[pb.ITEM_TYPE_MESSAGE],
            mode=pb.RECALL_MODE_LEXICAL,
        )
    )
    return reply


async def test_a_rare_query_word_outranks_a_common_one(
    caller: Caller, drain: Callable[[], Awaitable[int]], start_server: StartServer
) -> None:
    await seeded(caller, drain, "owner")
    reply = await idf_recall(caller, start_server)
    assert reply.items[0].id == KNEE


async def test_without_idf_every_query_word_counts_alike(
    caller: Caller, pool: asyncpg.Pool, drain: Callable[[], Awaitable[int]]
) -> None:
    """The setting's other side (MEMSVC_LEXICAL_IDF=false): today's single ts_rank, where
    the coffee turns, with coffee around them too, come first."""
    await seeded(caller, drain, "owner")
    scope = Scope(caller.tenant_id, "owner")

    async def first(idf: bool) -> str:
        async with pool.acquire() as conn:
            hits = await lexical_hits(
                conn,
                scope,
                QUERY,
                [ItemKind.MESSAGE],
                limit=10,
                exact_max_rows=2_000,
                as_of=None,
                budget=Budget(10),
                idf=idf,
            )
        return hits[0].id

    assert await first(idf=True) == KNEE
    assert await first(idf=False) != KNEE


async def test_the_statistics_are_the_scopes_own(
    caller: Caller, drain: Callable[[], Awaitable[int]], start_server: StartServer
) -> None:
    """Another user's many knee messages make "knee" common there, not here."""
    await seeded(caller, drain, "owner")
    await ingest(
        caller,
        [turn(i, f"My knee is sore, day {i}", "u-2") for i in range(30)],
        user="other",
    )
    assert await drain() >= 1
    reply = await idf_recall(caller, start_server)
    assert reply.items[0].id == KNEE
