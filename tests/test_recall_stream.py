"""RecallStream end to end over gRPC: interims worked ahead, finals answered as Recall answers,
validation and tenancy as Recall's, the per-stream interim rate."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

import grpc
import pytest
from prometheus_client import REGISTRY

from memsvc.client import MemoryClient, MemsvcCallError
from memsvc.server.app import MemsvcServer
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import Caller
from tests.read_helpers import StartServer, pscope
from tests.read_helpers import start_server as start_server  # fixture
from tests.test_explicit_memory import remember

FACT, EPISODE = pb.ITEM_TYPE_FACT, pb.ITEM_TYPE_EPISODE
# Generous for a shared test machine: equality with Recall is the point, not speed.
FINAL_TIMEOUT_S = 5.0


def answer(reply: pb.RecallResponse) -> list[tuple[int, str, str]]:
    """What the caller acts on: the items, in order (scores carry the time of ranking)."""
    return [(item.type, item.id, item.text) for item in reply.items]


def ahead_count(outcome: str) -> float:
    value = REGISTRY.get_sample_value("memsvc_recall_ahead_total", {"outcome": outcome})
    return value or 0.0


@pytest.fixture
async def client(server: MemsvcServer, caller: Caller) -> AsyncIterator[MemoryClient]:
    async with MemoryClient(f"127.0.0.1:{server.port}", api_key=caller.key) as c:
        yield c


async def seed(caller: Caller) -> None:
    for content in (
        "Takes no sugar in coffee",
        "Daughter is named Maya",
        "Works as a nurse in Lisbon",
        "Plays the cello on Sundays",
        "Allergic to peanuts",
    ):
        await remember(caller, content)


async def speak(
    client: MemoryClient, words: Sequence[str], final: str, **fields: object
) -> tuple[pb.RecallResponse, pb.RecallResponse]:
    """One utterance streamed word by word, and a plain Recall of its final text."""
    request = pb.RecallStreamRequest(scope=pscope(), **fields)  # type: ignore[arg-type]
    async with client.recall_stream(request, final_timeout=FINAL_TIMEOUT_S) as stream:
        for n in range(1, len(words) + 1):
            await stream.interim(" ".join(words[:n]))
        streamed = await stream.final(final)
    plain_request = pb.RecallRequest(scope=pscope(), query=final, **fields)  # type: ignore[arg-type]
    plain = await client.recall(plain_request, timeout=FINAL_TIMEOUT_S)
    return streamed, plain


async def test_final_answer_equals_recall(caller: Caller, client: MemoryClient) -> None:
    await seed(caller)
    text = "what does she drink in the morning"
    before = ahead_count("ready") + ahead_count("awaited")
    streamed, plain = await speak(client, text.split(), text)
    assert answer(streamed) == answer(plain) and answer(plain)
    assert answer(streamed)[0][2] == "Takes no sugar in coffee"
    assert streamed.degraded == plain.degraded and streamed.route == plain.route
    # The final was the last interim's text: it was answered from the work done ahead.
    assert ahead_count("ready") + ahead_count("awaited") == before + 1


async def test_revised_and_longer_finals_equal_recall(caller: Caller, client: MemoryClient) -> None:
    await seed(caller)
    # The transcriber revised a word: the final is not the last interim.
    streamed, plain = await speak(
        client, ["who", "is", "Maya", "to", "hurt"], "who is Maya to her", top_k=3
    )
    assert answer(streamed) == answer(plain) and answer(plain)
    # Filters and kinds travel with the first request.
    streamed, plain = await speak(
        client,
        ["which", "instrument"],
        "which instrument does she play",
        types=[FACT, EPISODE],
        mode=pb.RECALL_MODE_LEXICAL,
    )
    assert answer(streamed) == answer(plain)
    assert [text for _, _, text in answer(streamed)] == ["Plays the cello on Sundays"]


async def test_one_stream_carries_several_utterances(caller: Caller, client: MemoryClient) -> None:
    await seed(caller)
    request = pb.RecallStreamRequest(scope=pscope(), top_k=2)
    async with client.recall_stream(request, final_timeout=FINAL_TIMEOUT_S) as stream:
        finals = []
        for utterance in ("is she allergic to anything", "where does she work"):
            words = utterance.split()
            for n in range(1, len(words) + 1):
                await stream.interim(" ".join(words[:n]))
            finals.append(await stream.final(utterance))
    assert finals[0].items[0].text == "Allergic to peanuts"
    assert finals[1].items[0].text == "Works as a nurse in Lisbon"
    assert all(len(f.items) <= 2 for f in finals)


async def test_another_tenants_stream_sees_nothing(
    caller: Caller, new_caller: Callable[[], object], server: MemsvcServer
) -> None:
    await seed(caller)
    other: Caller = await new_caller()  # type: ignore[misc]
    async with MemoryClient(f"127.0.0.1:{server.port}", api_key=other.key) as client:
        # The same user id in the other tenant: a scope never reaches across tenants.
        streamed, plain = await speak(client, ["is", "Maya"], "is Maya her daughter")
    assert answer(streamed) == [] and answer(plain) == []


async def refused(
    client: MemoryClient, first: pb.RecallStreamRequest, *later: pb.RecallStreamRequest
) -> MemsvcCallError:
    """The error a stream of ``first`` then ``later`` (raw requests) ends with."""
    stub = client._stub
    metadata = (("x-api-key", client._api_key or ""),)
    call = stub.RecallStream(iter([first, *later]), metadata=metadata, timeout=FINAL_TIMEOUT_S)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    return MemsvcCallError(
        info.value.code(), info.value.details() or "", rpc="RecallStream", request_id="", attempts=1
    )


@pytest.mark.parametrize(
    ("first", "later", "field"),
    [
        (pb.RecallStreamRequest(query="tea", final=True), [], "scope"),
        (pb.RecallStreamRequest(scope=pscope(), query="tea", top_k=9999), [], "top_k"),
        (pb.RecallStreamRequest(scope=pscope(), query="tea", types=[77]), [], "types[0]"),
        (pb.RecallStreamRequest(scope=pscope(user="x" * 5000), query="tea"), [], "scope"),
        (pb.RecallStreamRequest(scope=pscope(), final_deadline_ms=9_999_999), [], "final_deadline"),
        # Shorter than the server keeps back to answer (and any answer takes).
        (pb.RecallStreamRequest(scope=pscope(), final_deadline_ms=1), [], "final_deadline"),
        (
            pb.RecallStreamRequest(scope=pscope(), query="tea"),
            [pb.RecallStreamRequest(scope=pscope(user="bob"), query="tea leaves")],
            "scope: only the first request",
        ),
        (
            pb.RecallStreamRequest(scope=pscope(), query="tea"),
            [pb.RecallStreamRequest(query="", final=True)],
            "query: required",
        ),
        (
            pb.RecallStreamRequest(scope=pscope(), query="tea"),
            [pb.RecallStreamRequest(query="x" * 3000, final=True)],
            "query: at most",
        ),
    ],
)
async def test_a_bad_request_ends_the_stream_naming_the_field(
    client: MemoryClient,
    first: pb.RecallStreamRequest,
    later: list[pb.RecallStreamRequest],
    field: str,
) -> None:
    error = await refused(client, first, *later)
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in error.details
    assert "xxxx" not in error.details and "9999" not in error.details


async def test_a_stream_without_a_valid_key_is_refused(server: MemsvcServer) -> None:
    # Repeated: the server refuses while the client still writes, and grpc's client then
    # reports its failed write as INTERNAL (grpc/grpc#36066) unless the client keeps the
    # server's status (memsvc/client/stream_status.py); 4 calls in 5 did before.
    async with MemoryClient(f"127.0.0.1:{server.port}", api_key="wrong") as client:
        for _ in range(30):
            stream = client.recall_stream(pb.RecallStreamRequest(scope=pscope()))
            for n in range(1, 6):
                await stream.interim(" ".join(["hello"] * n))
            with pytest.raises(MemsvcCallError) as info:
                await stream.final("hello there")
            await stream.aclose()
            assert info.value.code == grpc.StatusCode.UNAUTHENTICATED, info.value.details


async def test_interims_beyond_the_rate_are_not_worked_ahead_and_the_final_is_answered(
    caller: Caller, start_server: StartServer
) -> None:
    srv, _ = await start_server(recall_stream_interims_per_s=1.0)
    await remember(caller, "I keep bees on the roof", scope=pscope())
    before = ahead_count("over_rate")
    async with MemoryClient(f"127.0.0.1:{srv.port}", api_key=caller.key) as client:
        stream = client.recall_stream(
            pb.RecallStreamRequest(scope=pscope()), final_timeout=FINAL_TIMEOUT_S
        )
        # A burst of one second's worth (one) is worked ahead; the five after it this soon
        # are not, and the stream goes on.
        words = ["where", "do", "I", "keep", "the", "bees"]
        for n in range(1, len(words) + 1):
            await stream.interim(" ".join(words[:n]))
        reply = await stream.final(" ".join(words))
        await stream.aclose()
    assert any("bees" in item.text for item in reply.items)
    # Timing-free: whatever the machine's pace, most of six interims sent at once are over.
    assert ahead_count("over_rate") - before >= 3
