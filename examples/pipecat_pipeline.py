"""A Pipecat pipeline with memsvc's memory (needs ``pipecat-ai``), no API keys needed.

    make run                                   # another terminal: memsvc dev on :50051
    .venv/bin/python examples/pipecat_pipeline.py
    .venv/bin/python examples/pipecat_pipeline.py --address host:50051 --api-key KEY

The pipeline is a real Pipecat one with scripted stand-ins where a call has audio services:

    ScriptedUser  ->  memory.transcripts  ->  memory.context  ->  ScriptedLLM
    (an STT's interims and final, then the user aggregator's LLMContextFrame)

``memory.transcripts`` streams the interims to RecallStream; ``memory.context`` puts the
Prefetch packet (at the first turn) and each turn's memories into the LLM context, and ingests
the finished turns in the background. ScriptedLLM prints what memory added to its context and
answers with a canned line (added to the context as the assistant aggregator would). Each turn
prints the time memory added to it: from the context frame entering ``memory.context`` to
leaving it. With memsvc stopped the turns go on without memory, each within the recall budget.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
import uuid
import warnings
from collections.abc import Sequence

with warnings.catch_warnings():
    # Pipecat's audio utilities import audioop, deprecated since Python 3.11.
    warnings.simplefilter("ignore", DeprecationWarning)
    from pipecat.frames.frames import (
        EndWorkerFrame,
        Frame,
        InterimTranscriptionFrame,
        LLMContextFrame,
        StartFrame,
        TranscriptionFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.workers.runner import WorkerRunner

from memsvc.client import MemoryClient, scope
from memsvc.client.pipecat import PACKET_HEADER, RECALL_HEADER, MemsvcMemory
from memsvc.v1 import memory_pb2 as pb

KNOWN_FACTS = (
    ("Is allergic to peanuts", "profile"),
    ("Takes no sugar in coffee", "preference"),
    ("Daughter is named Maya", "relationship"),
)
TURNS = (
    ("I'd like to order dinner for tonight", "Sure! What would you like?"),
    ("something with peanut sauce maybe", "Careful: you told us you're allergic to peanuts."),
    ("and a coffee for after", "No sugar, as usual?"),
    ("also something for my daughter", "Of course, something Maya likes?"),
)
# The speaker's pace: an interim per word, ~150 words a minute.
WORD_S = 0.4


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--address", default="127.0.0.1:50051", help="memsvc host:port")
    p.add_argument("--api-key", default=None, help="x-api-key (memsvc dev runs without auth)")
    p.add_argument("--user", default="caller-555-0100", help="the caller's user id")
    p.add_argument("--no-seed", action="store_true", help="do not Remember the sample facts")
    p.add_argument("--word-ms", type=float, default=WORD_S * 1000, help="time per spoken word")
    return p.parse_args(argv)


class ScriptedUser(FrameProcessor):
    """Stands in for the STT and the user aggregator: speaks each turn word by word
    (interims), then sends the final transcript and the turn's context."""

    def __init__(self, context: LLMContext, replies: asyncio.Queue[None], word_s: float) -> None:
        super().__init__(name="ScriptedUser")
        self._context = context
        self._replies = replies
        self._word_s = word_s

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, StartFrame):
            self.create_task(self._speak(), name="scripted-user")

    async def _speak(self) -> None:
        for text, _reply in TURNS:
            words = text.split()
            for n in range(1, len(words)):
                await asyncio.sleep(self._word_s)
                await self.push_frame(
                    InterimTranscriptionFrame(" ".join(words[:n]), "user", timestamp="")
                )
            await asyncio.sleep(self._word_s)
            await self.push_frame(TranscriptionFrame(text, "user", timestamp=""))
            self._context.add_message({"role": "user", "content": text})
            await self.push_frame(LLMContextFrame(context=self._context))
            await self._replies.get()  # the bot answered
        await self.push_frame(EndWorkerFrame())


class ScriptedLLM(FrameProcessor):
    """Stands in for the LLM (and the assistant aggregator): prints what memory added, and
    answers each turn with its canned reply."""

    def __init__(self, replies: asyncio.Queue[None], entered: dict[int, float]) -> None:
        super().__init__(name="ScriptedLLM")
        self._replies = replies
        self._entered = entered
        self._turn = 0
        self.added_ms: list[float] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if not isinstance(frame, LLMContextFrame):
            await self.push_frame(frame, direction)
            return
        added_ms = (time.perf_counter() - self._entered.pop(id(frame))) * 1000
        self.added_ms.append(added_ms)
        messages = [m for m in frame.context.get_messages() if isinstance(m, dict)]
        packet = any(str(m["content"]).startswith(PACKET_HEADER) for m in messages)
        recalled = [
            str(m["content"]).count("\n- ")
            for m in messages
            if str(m["content"]).startswith(RECALL_HEADER)
        ]
        user_text, reply = TURNS[self._turn]
        self._turn += 1
        print(
            f"turn {self._turn}: memory added {added_ms:6.1f} ms | "
            f"packet {'in context' if packet else 'absent'} | "
            f"{recalled[0] if recalled else 0} memory item(s) | user: {user_text!r}"
        )
        frame.context.add_message({"role": "assistant", "content": reply})
        await self._replies.put(None)


class Stopwatch(FrameProcessor):
    """Notes when each context frame enters memory.context."""

    def __init__(self, entered: dict[int, float]) -> None:
        super().__init__(name="Stopwatch")
        self._entered = entered

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMContextFrame):
            self._entered[id(frame)] = time.perf_counter()
        await self.push_frame(frame, direction)


async def call(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    who = scope(args.user)
    client = MemoryClient(args.address, api_key=args.api_key, default_preset="voice")
    try:
        if not args.no_seed:
            for content, category in KNOWN_FACTS:
                try:
                    await client.remember(
                        pb.RememberRequest(scope=who, content=content, category=category),
                        preset="chat",
                    )
                except Exception as exc:  # memsvc down: the call still runs, without memory
                    print(f"seeding failed ({type(exc).__name__}): memsvc is not reachable")
                    break
        memory = MemsvcMemory(
            client, who, session_id=f"call-{uuid.uuid4().hex[:8]}", prefetch_hint=TURNS[0][0]
        )
        context = LLMContext([{"role": "system", "content": "You are a friendly order-taker."}])
        replies: asyncio.Queue[None] = asyncio.Queue()
        entered: dict[int, float] = {}
        llm = ScriptedLLM(replies, entered)
        pipeline = Pipeline(
            [
                ScriptedUser(context, replies, args.word_ms / 1000),
                memory.transcripts,
                Stopwatch(entered),
                memory.context,
                llm,
            ]
        )
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(PipelineWorker(pipeline, cancel_on_idle_timeout=False))
        await runner.run()
        if llm.added_ms:
            print(
                f"memory added per turn: median {statistics.median(llm.added_ms):.1f} ms, "
                f"max {max(llm.added_ms):.1f} ms over {len(llm.added_ms)} turns"
            )
    finally:
        await client.aclose(flush_timeout_s=5.0)
    stats = client.ingest_stats
    print(f"ingest queue: {stats.sent} sent, {stats.failed} failed")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(call(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
