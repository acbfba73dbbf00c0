"""Fair turns across tenants, then users (issue 31, item 1): the order of the queue itself
(concurrency.fair_queue), the parser processes that use it (extraction.parser_process) and
the workers' embedder (embedding.fair). Order is asserted, never time."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from memsvc.concurrency.fair_queue import FairQueue, FairTurns
from memsvc.concurrency.owner import current_owner, working_for
from memsvc.embedding.base import Embedder
from memsvc.embedding.fair import FairEmbedder
from memsvc.extraction.parser_process import ParserPool

# -- the order ---------------------------------------------------------------------------------


def drain(queue: FairQueue[str], *, finish: bool = True) -> list[str]:
    """Everything queued, in the order it is served (one in hand at a time when ``finish``)."""
    order = []
    while (taken := queue.pop()) is not None:
        item, tenant, user = taken
        order.append(item)
        if finish:
            queue.done(tenant, user)
    return order


def test_a_tenants_backlog_does_not_go_before_anothers_first_item() -> None:
    queue: FairQueue[str] = FairQueue()
    for i in range(5):
        queue.push(f"a{i}", "A", f"u{i}")
    queue.push("b0", "B", "x")
    # A arrived first, so it goes first; B's one item is next, not after A's five.
    assert drain(queue) == ["a0", "b0", "a1", "a2", "a3", "a4"]


def test_tenants_take_turns_whatever_their_queue_lengths() -> None:
    queue: FairQueue[str] = FairQueue()
    for i in range(4):
        queue.push(f"a{i}", "A", "u")
    for i in range(2):
        queue.push(f"b{i}", "B", "u")
    queue.push("c0", "C", "u")
    assert drain(queue) == ["a0", "b0", "c0", "a1", "b1", "a2", "a3"]


def test_the_tenant_with_fewer_in_hand_goes_first() -> None:
    """A holds an item (a parse in hand): B's item, queued after A's next one, goes first."""
    queue: FairQueue[str] = FairQueue()
    queue.push("a0", "A", "u")
    assert queue.pop() == ("a0", "A", "u")  # in hand, not done
    queue.push("a1", "A", "u")
    queue.push("b0", "B", "u")
    assert queue.pop() == ("b0", "B", "u")
    assert queue.in_hand("A") == 1 and queue.in_hand("B") == 1
    queue.done("A", "u")
    assert queue.pop() == ("a1", "A", "u")


def test_users_of_one_tenant_take_turns() -> None:
    queue: FairQueue[str] = FairQueue()
    for i in range(3):
        queue.push(f"alice{i}", "A", "alice")
    queue.push("bob0", "A", "bob")
    queue.push("carol0", "A", "carol")
    assert drain(queue) == ["alice0", "bob0", "carol0", "alice1", "alice2"]


def test_a_user_with_an_item_in_hand_goes_after_the_tenants_other_users() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push("alice0", "A", "alice")
    queue.pop()
    queue.push("alice1", "A", "alice")
    queue.push("bob0", "A", "bob")
    assert drain(queue, finish=False) == ["bob0", "alice1"]


def test_skipped_items_are_dropped_and_done_needs_a_pop() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push("void", "A", "u")
    queue.push("kept", "A", "u")
    assert queue.pop(skip=lambda item: item == "void") == ("kept", "A", "u")
    queue.done("A", "u")
    assert len(queue) == 0 and queue.in_hand("A") == 0
    with pytest.raises(ValueError, match="without a matching pop"):
        queue.done("A", "u")


async def test_turns_let_tasks_in_by_the_fair_order() -> None:
    turns = FairTurns(slots=1)
    order: list[str] = []
    release = asyncio.Event()

    async def hold(tenant: str, user: str, name: str, until: asyncio.Event | None) -> None:
        async with turns.turn(tenant, user):
            order.append(name)
            if until is not None:
                await until.wait()

    first = asyncio.ensure_future(hold("A", "u", "a0", release))
    await asyncio.sleep(0)
    assert order == ["a0"]
    tasks = [asyncio.ensure_future(hold("A", "u", f"a{i}", None)) for i in range(1, 4)]
    tasks.append(asyncio.ensure_future(hold("B", "u", "b0", None)))
    gone = asyncio.ensure_future(hold("C", "u", "c0", None))
    await asyncio.sleep(0)
    gone.cancel()  # cancelled while waiting: its place is dropped, no slot leaks
    release.set()
    await asyncio.gather(first, *tasks)
    [gone_with] = await asyncio.gather(gone, return_exceptions=True)
    assert isinstance(gone_with, asyncio.CancelledError)
    assert order == ["a0", "b0", "a1", "a2", "a3"]
    async with turns.turn("D", "u"):  # the slot came back
        pass


# -- the parser processes ------------------------------------------------------------------


def _note(arg: tuple[Path, str]) -> str:
    """Runs in a parser process: appends its label to the log (one process: the order)."""
    log, label = arg
    with log.open("a") as f:
        f.write(label + "\n")
    return label


def _hold(arg: tuple[Path, Path]) -> str:
    """Runs in a parser process: says it started, then waits for the test's go."""
    started, go = arg
    started.touch()
    while not go.exists():
        pass
    return "held"


async def _owned(pool: ParserPool, owner: tuple[str, str], arg: tuple[Path, str]) -> str:
    working_for(*owner)  # as the worker does for a job's task
    return await asyncio.wrap_future(pool.submit(_note, arg, current_owner()))


async def test_another_tenants_parse_goes_next_behind_a_backlog(tmp_path: Path) -> None:
    """One parser held by tenant A; A queues four more parses (two users), then B one: B's
    runs next, and A's users alternate (bob, never served, before alice)."""
    pool = ParserPool(1)
    try:
        started, go, log = tmp_path / "started", tmp_path / "go", tmp_path / "log"
        held = asyncio.wrap_future(pool.submit(_hold, (started, go), ("A", "alice")))
        while not started.exists():  # noqa: ASYNC110 (another process writes it)
            await asyncio.sleep(0.01)
        queued = []
        for i in range(2):
            queued.append(asyncio.ensure_future(_owned(pool, ("A", "alice"), (log, f"alice{i}"))))
            await asyncio.sleep(0)
        for i in range(2):
            queued.append(asyncio.ensure_future(_owned(pool, ("A", "bob"), (log, f"bob{i}"))))
            await asyncio.sleep(0)
        queued.append(asyncio.ensure_future(_owned(pool, ("B", "x"), (log, "b"))))
        await asyncio.sleep(0)
        go.touch()
        assert await held == "held"
        await asyncio.gather(*queued)
        assert log.read_text().split() == ["b", "bob0", "alice0", "bob1", "alice1"]
    finally:
        pool.stop()


async def test_a_parse_cancelled_while_it_waits_never_runs(tmp_path: Path) -> None:
    pool = ParserPool(1)
    try:
        started, go, log = tmp_path / "started", tmp_path / "go", tmp_path / "log"
        held = asyncio.wrap_future(pool.submit(_hold, (started, go), ("A", "u")))
        while not started.exists():  # noqa: ASYNC110 (another process writes it)
            await asyncio.sleep(0.01)
        dropped = asyncio.ensure_future(_owned(pool, ("A", "u"), (log, "dropped")))
        kept = asyncio.ensure_future(_owned(pool, ("A", "u"), (log, "kept")))
        await asyncio.sleep(0)
        dropped.cancel()
        go.touch()
        await held
        assert await kept == "kept"
        assert dropped.cancelled()
        assert log.read_text().split() == ["kept"]
    finally:
        pool.stop()


async def test_a_second_parser_takes_another_tenants_parse_while_one_is_held(
    tmp_path: Path,
) -> None:
    pool = ParserPool(2)
    try:
        started, go, log = tmp_path / "started", tmp_path / "go", tmp_path / "log"
        held = asyncio.wrap_future(pool.submit(_hold, (started, go), ("A", "u")))
        while not started.exists():  # noqa: ASYNC110 (another process writes it)
            await asyncio.sleep(0.01)
        # Finishes while A's parse is still held: only the second parser can run it.
        assert await _owned(pool, ("B", "x"), (log, "b")) == "b"
        assert not held.done()
        go.touch()
        assert await held == "held"
    finally:
        pool.stop()


# -- the workers' embedder ---------------------------------------------------------------------


async def test_the_fair_embedder_gives_the_backends_vectors(embedder: Embedder) -> None:
    fair = FairEmbedder(embedder)
    texts = ["I live in Lisbon.", "My sister is a nurse.", "I like sailing."]
    expected = await embedder.embed(texts)
    got = await fair.embed(texts)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert (await fair.embed([])).shape[0] == 0
