"""A simulated phone call against memsvc, as a voice gateway would make it.

Call setup: Prefetch (the packet goes into the system prompt). Each user turn: the previous
exchange goes to ``ingest_nowait`` (the turn never waits on a write), and a Recall races the
model's start; memory is used only if it arrived first. End of call: Ingest with
``end_of_session``. Prints what memory cost each turn.

    make run                                   # another terminal: memsvc dev on :50051
    .venv/bin/python examples/voice_gateway.py
    .venv/bin/python examples/voice_gateway.py --address host:50051 --api-key KEY
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Sequence

from memsvc.client import IngestFailure, MemoryClient, MemsvcCallError, message, scope
from memsvc.v1 import memory_pb2 as pb

# What this caller told the agent in earlier calls (stored with Remember unless --no-seed).
KNOWN_FACTS = (
    ("Is allergic to peanuts", "profile"),
    ("Takes no sugar in coffee", "preference"),
    ("Daughter is named Maya", "relationship"),
)
# (what the user says, what the agent answers): the agent's words are canned here.
TURNS = (
    ("Hi, I'd like to order dinner for tonight", "Sure! What would you like?"),
    ("Something with peanut sauce maybe?", "Careful: you told us you're allergic to peanuts."),
    ("Right. And a coffee for after", "No sugar, as usual?"),
    ("Yes. Also something for my daughter", "Of course, something Maya likes?"),
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--address", default="127.0.0.1:50051", help="memsvc host:port")
    p.add_argument("--api-key", default=None, help="x-api-key (memsvc dev runs without auth)")
    p.add_argument("--user", default="caller-555-0100", help="the caller's user id")
    p.add_argument("--agent", default="", help="agent id (empty: not tied to one agent)")
    p.add_argument(
        "--model-start-ms",
        type=float,
        default=300.0,
        help="when the simulated model would emit its first token without memory",
    )
    p.add_argument("--no-seed", action="store_true", help="do not Remember the sample facts")
    return p.parse_args(argv)


def ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


async def model_first_token(delay_ms: float) -> None:
    """Stands in for speech-to-text finalisation and the model's time to first token."""
    await asyncio.sleep(delay_ms / 1000)


async def turn(
    client: MemoryClient,
    who: pb.Scope,
    session_id: str,
    number: int,
    user_text: str,
    previous: list[pb.Message],
    model_start_ms: float,
) -> None:
    started = time.perf_counter()
    user_msg = message(user_text, sender_id=who.user_id, message_id=f"{session_id}-u{number}")
    # The previous exchange plus what the user just said: stored after the turn, never awaited.
    client.ingest_nowait(
        pb.IngestRequest(
            session_id=session_id,
            scope=who,
            messages=[*previous, user_msg],
            idempotency_key=f"{session_id}-turn-{number}",
        )
    )
    handed_ms = ms_since(started)
    recall = asyncio.create_task(
        client.recall(pb.RecallRequest(scope=who, query=user_text, top_k=3), preset="voice")
    )
    model = asyncio.create_task(model_first_token(model_start_ms))
    done, _ = await asyncio.wait({recall, model}, return_when=asyncio.FIRST_COMPLETED)
    recall_ms = ms_since(started)
    if recall in done:
        try:
            reply = recall.result()
            used = [item.text for item in reply.items]
            note = f"recall {recall_ms:6.1f} ms: {len(used)} item(s)"
            if reply.degraded:
                note += f", degraded (missing {','.join(reply.missing_legs)})"
        except MemsvcCallError as exc:
            used, note = [], f"recall failed {exc.code.name} after {recall_ms:6.1f} ms"
    else:
        # Too late for this turn: stop it rather than let it hold a server slot.
        recall.cancel()
        used, note = [], f"recall still running at {recall_ms:6.1f} ms: dropped"
    await model
    first_token_ms = ms_since(started)
    # The turn waited on memory only for the hand-over: the Recall ran while the model was
    # starting anyway, and a late one is dropped instead of awaited.
    headroom = f"{first_token_ms - recall_ms:6.1f} ms to spare" if recall in done else "late"
    print(
        f"turn {number}: ingest handed over in {handed_ms:5.2f} ms | {note} | "
        f"first token at {first_token_ms:6.1f} ms ({headroom}) | "
        f"memory cost {handed_ms:5.2f} ms | memory {'used' if used else 'not used'}"
    )
    for text in used:
        print(f"          - {text}")


async def call(args: argparse.Namespace) -> int:
    who = scope(args.user, agent_id=args.agent)
    session_id = f"call-{uuid.uuid4().hex[:8]}"
    failures: list[IngestFailure] = []

    def on_ingest_failure(failure: IngestFailure) -> None:
        # A real gateway logs and counts this; the call goes on either way.
        failures.append(failure)
        reason = failure.error.code.name if failure.error else failure.reason
        print(f"   (background ingest {failure.reason}: {reason})")

    client = MemoryClient(
        args.address,
        api_key=args.api_key,
        default_preset="voice",
        on_ingest_failure=on_ingest_failure,
    )
    try:
        if not args.no_seed:
            for content, category in KNOWN_FACTS:
                await client.remember(
                    pb.RememberRequest(scope=who, content=content, category=category),
                    preset="chat",
                )
        started = time.perf_counter()
        packet = await client.prefetch(
            pb.PrefetchRequest(scope=who, session_id=session_id, hint=TURNS[0][0]),
            preset="voice",
        )
        cache = pb.CacheStatus.Name(packet.cache)
        print(
            f"setup: prefetch {ms_since(started):6.1f} ms, cache {cache}"
            f", {len(packet.facts)} fact(s), {len(packet.text)} chars for the system prompt"
            + (", degraded" if packet.degraded else "")
        )
        previous: list[pb.Message] = []
        for number, (user_text, agent_text) in enumerate(TURNS, start=1):
            await turn(client, who, session_id, number, user_text, previous, args.model_start_ms)
            previous = [
                message(
                    agent_text,
                    sender_id="agent",
                    role="assistant",
                    message_id=f"{session_id}-a{number}",
                )
            ]
        client.ingest_nowait(
            pb.IngestRequest(
                session_id=session_id,
                scope=who,
                messages=previous,
                end_of_session=True,
                idempotency_key=f"{session_id}-end",
            )
        )
        print("end of call: last exchange handed over with end_of_session")
    except MemsvcCallError as exc:
        print(f"memsvc call failed: {exc}")
        return 1
    finally:
        await client.aclose(flush_timeout_s=5.0)
    stats = client.ingest_stats
    print(
        f"ingest queue: {stats.sent} sent, {stats.failed} failed, "
        f"{stats.overflowed} overflowed, {stats.abandoned} abandoned"
    )
    return 0 if not failures else 2


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(call(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
