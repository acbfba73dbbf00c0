"""The rules extractor alone on the LoCoMo dev split: coverage of the gold observations without
a database, a server or the daily quota, for iterating on extraction rules in minutes.

    python -m bench.extraction_rules [--data ../shared/data/locomo] [--names]
                                     [--limit-conversations N] [--out covered.json]

Each session's turns of each speaker are one extraction job, as bench/extraction_eval.py
sends them (same turn texts, same sent_at); the pipeline's phatic gate and confidence floor
apply. An observation is covered when a fact's source turns include one of its evidence
turns (extraction_eval's coverage). `--names`: the speaker's name as sender_name (it shapes
titles and topics, not facts). It also prints the extractor's CPU time per job and per turn
(the process's, every thread's: spinning BLAS threads count), which load on the machine
barely moves, unlike wall time. `--out`: the covered observations as (user, evidence dia_ids)
and each turn's fact count, to diff two commits; no text of the data set is written.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta
from pathlib import Path

from bench.extraction_eval import Conversation, message_text
from bench.locomo_eval import DEFAULT_DATA, sessions_of
from memsvc.config import Settings
from memsvc.extraction.base import ExtractionInput, Turn
from memsvc.extraction.gate import is_phatic
from memsvc.extraction.rules import RulesExtractor


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--names", action="store_true")
    parser.add_argument("--limit-conversations", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    samples = json.loads((args.data / "locomo-dev.json").read_text())
    if args.limit_conversations:
        samples = samples[: args.limit_conversations]
    settings = Settings.from_env({})
    extractor = RulesExtractor(offload=False)
    conversations = [Conversation.of(s) for s in samples]
    sources: dict[str, set[str]] = {}
    facts_per_turn: dict[str, int] = {}
    jobs = turns_read = 0
    cpu_s = 0.0
    for conv in conversations:
        for n, when, turns in sessions_of(conv.sample["conversation"]):
            for speaker in conv.speakers:
                # One second per turn of the session, as the eval sends them.
                mine = [
                    Turn(t["dia_id"], message_text(t), when + timedelta(seconds=k))
                    for k, t in enumerate(turns)
                    if t["speaker"] == speaker and not is_phatic(message_text(t))
                ]
                if not mine:
                    continue
                user = conv.users[speaker]
                started = time.process_time()
                out = extractor.extract_sync(
                    ExtractionInput(
                        user,
                        f"{conv.sample_id}/{n}",
                        tuple(mine),
                        settings.categories,
                        settings.roles,
                        settings.max_facts_per_episode,
                        speaker_name=speaker if args.names else "",
                    )
                )
                cpu_s += time.process_time() - started
                jobs += 1
                turns_read += len(mine)
                for fact in out.facts:
                    if fact.confidence < settings.confidence_floor:
                        continue
                    sources.setdefault(user, set()).update(fact.source_message_ids)
                    for turn in fact.source_message_ids:
                        key = f"{user}/{turn}"
                        facts_per_turn[key] = facts_per_turn.get(key, 0) + 1
    covered = [
        (conv.users[speaker], evidence)
        for conv in conversations
        for _, speaker, evidence in conv.observations()
        if any(e in sources.get(conv.users[speaker], set()) for e in evidence)
    ]
    total = sum(len(conv.observations()) for conv in conversations)
    print(f"covered {len(covered)}/{total} ({100 * len(covered) / total:.1f}%)", flush=True)
    # The first job also loads the model (about a second): a small share of a whole run's.
    print(
        f"extractor CPU: {1000 * cpu_s / max(jobs, 1):.1f} ms per job, "
        f"{1000 * cpu_s / max(turns_read, 1):.1f} ms per turn ({jobs} jobs, {turns_read} turns)",
        flush=True,
    )
    if args.out:
        args.out.write_text(json.dumps({"covered": covered, "facts_per_turn": facts_per_turn}))


if __name__ == "__main__":
    main()
