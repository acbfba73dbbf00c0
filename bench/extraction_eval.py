"""What the extraction workers store, measured through the public gRPC API on LoCoMo (dev split).

    python -m bench.extraction_eval [--data ../shared/data/locomo] [--extractor rules|openai]
                                    [--limit-conversations N] [--deadline-ms 800]
                                    [--server-env MEMSVC_X=value ...] [--out results.json]

Ingest: every conversation session by session, one Ingest per session (end_of_session=true),
as a gateway would at the end of a call. Both speakers are USER senders, each with their own
user id `{sample_id}-{sender_id(speaker)}`; the Ingest scope (the session owner) is speaker A's,
so one conversation's jobs run one at a time, oldest first. The pipeline (`_speakers`) extracts
each USER sender's turns in that sender's own scope (user_id = sender_id, persona and agent
from the job's scope): a speaker's facts and episode land in that speaker's scope. A message's
id is the turn's dia_id ("D1:3"), so a fact's source_message_ids name turns; sent_at is the
session's date/time plus one second per turn; an image turn's text is the turn's text plus
` [shares {blip_caption}]`. Every Ingest is waited for (GetIngestStatus) until DONE or DEAD;
dead jobs are reported (and make the exit status 1, after the results are written).

Figures:
1. facts per session: current FACT memories (ListMemories over both speaker scopes, all pages),
   counted by the memory's session_id (or else the session of its source turns), divided by
   the number of sessions; next to the gold count of `observation` entries per session.
2. coverage: share of gold observations (per session and speaker: [text, dia_id or list])
   having a fact of the same speaker whose source_message_ids include one of its evidence turns.
3. evidence Recall@k (k = 5, 10, 25) of FACT+EPISODE and of FACT-only Recall: for each question,
   Recall in the scope of the one speaker it names (first name, case-insensitive), or in both
   scopes, the two ranked lists interleaved (a1, b1, a2, b2, ..., deduplicated), when it names
   both or neither. An item stands for the turns in its source_message_ids (an episode's come
   from ExportMemories: RecallItem does not carry them). R@k = share of the question's evidence
   turns among the top-k items' source turns; no evidence counts as 1 (the README protocol).
   Evidence strings are normalised to dia_ids ("D8:6; D9:17" is two, "D:11:26" is D11:26); one
   that holds no dia_id stays as it is and is never found.
4. Prefetch check: share of questions whose evidence turns are sources of a fact or episode in
   the Prefetch packet (hint = the question, default budget) of the same scope(s), union of the
   two packets for both/neither: `any` (one evidence turn), `all`, and `share` (mean fraction).
   A fact the per-user daily quota skipped (MEMSVC_DAILY_FACT_QUOTA) is missing from 1-4:
   the run ingests months of sessions within one server day, so the summary says how many
   were skipped; `--server-env MEMSVC_DAILY_FACT_QUOTA=100000` measures extraction alone.
5. throughput: messages of DONE jobs per second, from the first job's created_at to the last
   DONE job's finished_at (server clocks), and the jobs' count by final state.
Per category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial) and overall.
The data is read from the shared folder and never copied; the results hold no text of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import zip_longest
from pathlib import Path
from typing import Any

import grpc

from bench.harness import RESULTS_DIR, Target, embedded_stack, memsvc_server
from bench.locomo_eval import CATEGORIES, DEFAULT_DATA, KS, sender_id, sessions_of
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
MAX_MESSAGES_PER_INGEST = 200
RECALL_TYPES = {
    "fact+episode": [pb.ITEM_TYPE_FACT, pb.ITEM_TYPE_EPISODE],
    "fact": [pb.ITEM_TYPE_FACT],
}
STATES = {
    pb.INGEST_STATE_PENDING: "pending",
    pb.INGEST_STATE_PROCESSING: "processing",
    pb.INGEST_STATE_DONE: "done",
    pb.INGEST_STATE_DEAD: "dead",
}
DIA_ID = re.compile(r"D:?(\d+):(\d+)")


# -- the data -----------------------------------------------------------------------------------


def user_of(sample_id: str, speaker: str) -> str:
    return f"{sample_id}-{sender_id(speaker)}"


def session_key(sample_id: str, n: int) -> str:
    return f"{sample_id}/session_{n}"


def message_text(turn: dict[str, Any]) -> str:
    text = str(turn["text"])
    if turn.get("blip_caption"):
        text += f" [shares {turn['blip_caption']}]"
    return text


def dia_ids(raw: str | Sequence[str] | None) -> list[str]:
    """Evidence as dia_ids: a string or a list, each possibly several ids ("D8:6; D9:17");
    a malformed "D:11:26" reads D11:26; a string with no id stays as it is (never found)."""
    out: list[str] = []
    for part in [raw] if isinstance(raw, str) else list(raw or []):
        found = [f"D{a}:{b}" for a, b in DIA_ID.findall(str(part))]
        out += found or ([str(part)] if str(part).strip() else [])
    return list(dict.fromkeys(out))


def session_of_turn(dia_id: str) -> int | None:
    found = DIA_ID.fullmatch(dia_id)
    return int(found.group(1)) if found else None


@dataclass
class Conversation:
    sample: dict[str, Any]
    sample_id: str
    speakers: list[str]  # speaker_a, speaker_b
    users: dict[str, str]  # speaker -> user id
    said_by: dict[str, str]  # dia_id -> speaker
    sessions: list[int]

    @classmethod
    def of(cls, sample: dict[str, Any]) -> Conversation:
        conv = sample["conversation"]
        speakers = [conv["speaker_a"], conv["speaker_b"]]
        sid = sample["sample_id"]
        sessions = sessions_of(conv)
        said_by = {t["dia_id"]: t["speaker"] for _, _, turns in sessions for t in turns}
        return cls(
            sample,
            sid,
            speakers,
            {s: user_of(sid, s) for s in speakers},
            said_by,
            [n for n, _, _ in sessions],
        )

    def message(self, turn: dict[str, Any], sent_at: datetime) -> pb.Message:
        """A turn as its speaker's USER message, the dia_id as message id."""
        message = pb.Message(
            message_id=turn["dia_id"],
            sender_id=self.users[turn["speaker"]],
            sender_name=turn["speaker"],
            role=pb.MESSAGE_ROLE_USER,
            text=message_text(turn),
        )
        message.sent_at.FromDatetime(sent_at)
        return message

    def scope(self, speaker: str) -> pb.Scope:
        return pb.Scope(user_id=self.users[speaker])

    def named(self, question: str) -> list[str]:
        """The speakers a question names by first name; both when it names both or neither."""
        named = [
            s
            for s in self.speakers
            if re.search(rf"\b{re.escape(s.split()[0])}\b", question, re.IGNORECASE)
        ]
        return named if len(named) == 1 else list(self.speakers)

    def observations(self) -> list[tuple[int, str, list[str]]]:
        """Gold observations as (session, speaker, evidence turns)."""
        out = []
        for n in self.sessions:
            by_speaker = self.sample.get("observation", {}).get(f"session_{n}_observation", {})
            for speaker, entries in by_speaker.items():
                out += [(n, speaker, dia_ids(entry[1])) for entry in entries]
        return out


# -- the API ------------------------------------------------------------------------------------


@dataclass
class Job:
    ingest_id: str
    sample_id: str
    session: int
    messages: int
    status: pb.IngestStatus | None = None


async def ingest_all(stub: Any, md: Any, conversations: list[Conversation]) -> list[Job]:
    jobs: list[Job] = []
    for conv in conversations:
        owner = conv.scope(conv.speakers[0])
        for n, when, turns in sessions_of(conv.sample["conversation"]):
            # One second per turn keeps the session's order.
            messages = [conv.message(t, when + timedelta(seconds=k)) for k, t in enumerate(turns)]
            for start in range(0, len(messages), MAX_MESSAGES_PER_INGEST):
                chunk = messages[start : start + MAX_MESSAGES_PER_INGEST]
                reply = await stub.Ingest(
                    pb.IngestRequest(
                        scope=owner,
                        session_id=session_key(conv.sample_id, n),
                        messages=chunk,
                        end_of_session=start + len(chunk) >= len(messages),
                        idempotency_key=f"extraction-eval/{conv.sample_id}/{n}/{start}",
                    ),
                    metadata=md,
                    timeout=30,
                )
                jobs.append(Job(reply.ingest_id, conv.sample_id, n, len(chunk)))
    return jobs


async def wait_final(stub: Any, md: Any, jobs: list[Job], timeout_s: float) -> None:
    """Poll until every job is DONE or DEAD (or the timeout); each job keeps its last status."""
    pending = {job.ingest_id: job for job in jobs}
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for ingest_id, job in list(pending.items()):
            job.status = await stub.GetIngestStatus(
                pb.GetIngestStatusRequest(ingest_id=ingest_id), metadata=md, timeout=10
            )
            if job.status.state in (pb.INGEST_STATE_DONE, pb.INGEST_STATE_DEAD):
                del pending[ingest_id]
        if pending:
            await asyncio.sleep(0.5)


async def list_facts(
    stub: Any, md: Any, scope: pb.Scope, *, include_superseded: bool = False
) -> list[pb.Memory]:
    facts: list[pb.Memory] = []
    token = ""
    while True:
        page = await stub.ListMemories(
            pb.ListMemoriesRequest(
                scope=scope,
                page_size=500,
                page_token=token,
                include_superseded=include_superseded,
            ),
            metadata=md,
            timeout=30,
        )
        facts += page.memories
        token = page.next_page_token
        if not token:
            return facts


async def export_episodes(stub: Any, md: Any, scope: pb.Scope) -> dict[str, dict[str, Any]]:
    """episode_id -> the exported episode (ExportMemories: the only read naming its sources)."""
    episodes = {}
    async for record in stub.ExportMemories(
        pb.ExportMemoriesRequest(scope=scope), metadata=md, timeout=60
    ):
        if record.type == "episode":
            episode = json.loads(record.json)
            episodes[episode["episode_id"]] = episode
    return episodes


@dataclass
class Stored:
    """What extraction left in the speaker scopes, and every item's source turns."""

    facts: dict[str, list[pb.Memory]] = field(default_factory=dict)  # user id -> facts
    # user id -> every version: the current facts and those ended or replaced since.
    versions: dict[str, list[pb.Memory]] = field(default_factory=dict)
    episodes: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    sources: dict[str, frozenset[str]] = field(default_factory=dict)  # memory/episode id

    async def read(self, stub: Any, md: Any, conversations: list[Conversation]) -> None:
        for conv in conversations:
            for speaker in conv.speakers:
                user = conv.users[speaker]
                self.facts[user] = await list_facts(stub, md, conv.scope(speaker))
                self.versions[user] = await list_facts(
                    stub, md, conv.scope(speaker), include_superseded=True
                )
                self.episodes[user] = await export_episodes(stub, md, conv.scope(speaker))
                for m in self.facts[user]:
                    self.sources[m.memory_id] = frozenset(m.source_message_ids)
                for eid, e in self.episodes[user].items():
                    self.sources[eid] = frozenset(e["source_message_ids"])


# -- figures ------------------------------------------------------------------------------------


def spread(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "total": float(sum(values)),
        "mean": round(statistics.fmean(values), 2),
        "min": float(min(values)),
        "median": float(statistics.median(values)),
        "max": float(max(values)),
    }


def facts_per_session(conversations: list[Conversation], stored: Stored) -> dict[str, Any]:
    stored_counts: Counter[tuple[str, int]] = Counter()
    gold_counts: Counter[tuple[str, int]] = Counter()
    categories: Counter[str] = Counter()
    roles: Counter[str] = Counter()
    unattributed = 0
    for conv in conversations:
        by_key = {session_key(conv.sample_id, n): n for n in conv.sessions}
        for speaker in conv.speakers:
            for m in stored.facts[conv.users[speaker]]:
                categories[m.category] += 1
                roles[m.role] += 1
                n = by_key.get(m.session_id)
                if n is None:
                    turns = [session_of_turn(t) for t in m.source_message_ids]
                    n = min((t for t in turns if t is not None), default=None)
                if n is None:
                    unattributed += 1
                else:
                    stored_counts[conv.sample_id, n] += 1
        for n, _, _ in conv.observations():
            gold_counts[conv.sample_id, n] += 1
    keys = [(c.sample_id, n) for c in conversations for n in c.sessions]
    return {
        "sessions": len(keys),
        "stored": spread([stored_counts[k] for k in keys]),
        "gold_observations": spread([gold_counts[k] for k in keys]),
        "facts_total": sum(len(f) for f in stored.facts.values()),
        "facts_unattributed_to_a_session": unattributed,
        "by_category": dict(categories.most_common()),
        "by_role": dict(roles.most_common()),
        "episodes_total": sum(len(e) for e in stored.episodes.values()),
    }


# Predicates of which a person has one current value (memsvc.extraction.predicates).
SINGLE_VALUED = frozenset(
    {"name", "lives_in", "works_at", "occupation", "diet", "birthday", "origin", "age"}
    | {"relationship_status"}
)


def contradictions(stored: Stored) -> dict[str, Any]:
    """Contradictory current facts per speaker: two current values of one single-valued
    predicate of one subject (each extra value counts once), or a fact and its negation
    (the same subject and object under "p" and "not_p", or a negated fact whose content
    says it no longer holds next to the positive one) both current."""
    per_speaker: dict[str, int] = {}
    for user, facts in stored.facts.items():
        values: dict[tuple[str, str], set[str]] = defaultdict(set)
        triples: set[tuple[str, str, str]] = set()
        for m in facts:
            if not m.predicate:
                continue
            subject, obj = m.subject.casefold(), m.object.strip().casefold()
            triples.add((subject, m.predicate, obj))
            if m.predicate in SINGLE_VALUED:
                values[subject, m.predicate].add(obj)
        count = sum(len(v) - 1 for v in values.values() if len(v) > 1)
        count += sum(
            1
            for subject, predicate, obj in triples
            if predicate.startswith("not_") and (subject, predicate[4:], obj) in triples
        )
        per_speaker[user] = count
    counts = list(per_speaker.values())
    return {
        "total": sum(counts),
        "speakers": len(counts),
        "speakers_with_any": sum(1 for c in counts if c),
        "per_speaker_mean": round(statistics.fmean(counts), 3) if counts else 0.0,
    }


def coverage(conversations: list[Conversation], stored: Stored) -> dict[str, Any]:
    """Coverage by current facts (the figure quoted since the rules extractor), and by every
    version: a fact a later statement ended ("I sold my car" ends "drives a Toyota") or
    replaced is still memory of its turn (history, Recall as_of), so the second figure counts
    it too; `ended_only` says what ended the facts that alone covered an observation."""
    current = _coverage(conversations, stored.facts)
    every = _coverage(conversations, stored.versions)
    ended_only: Counter[str] = Counter()
    for conv in conversations:
        for speaker in conv.speakers:
            versions = stored.versions.get(conv.users[speaker], [])
            live = set().union(*(m.source_message_ids for m in stored.facts[conv.users[speaker]]))
            by_id = {m.memory_id: m for m in versions}
            for _, who, evidence in conv.observations():
                if who != speaker or any(e in live for e in evidence):
                    continue
                ended = [
                    m
                    for m in versions
                    if m.superseded_by_id or m.HasField("invalid_at")
                    if any(e in m.source_message_ids for e in evidence)
                ]
                if ended:
                    ended_only[_ended_by(ended[0], by_id)] += 1
    return current | {
        "including_ended": {k: every[k] for k in ("covered", "coverage_pct")},
        "ended_only": dict(ended_only.most_common()),
    }


def fact_reach(conversations: list[Conversation], stored: Stored) -> dict[str, float]:
    """The ceiling of FACT-only evidence recall: mean share of a question's evidence turns
    that are sources of some current fact of the speaker(s) it names, and of some version
    (current or ended). The gap between the two is what ending facts can cost R@k."""
    current: list[float] = []
    every: list[float] = []
    for conv in conversations:
        for qa in conv.sample["qa"]:
            evidence = dia_ids(qa.get("evidence"))
            users = [conv.users[s] for s in conv.named(str(qa["question"]))]
            current.append(
                evidence_share(
                    [frozenset(m.source_message_ids) for u in users for m in stored.facts[u]],
                    evidence,
                )
            )
            every.append(
                evidence_share(
                    [frozenset(m.source_message_ids) for u in users for m in stored.versions[u]],
                    evidence,
                )
            )
    return {
        "current_pct": round(100 * statistics.fmean(current), 1) if current else 0.0,
        "including_ended_pct": round(100 * statistics.fmean(every), 1) if every else 0.0,
    }


def _ended_by(fact: pb.Memory, by_id: dict[str, pb.Memory]) -> str:
    """What ended a fact: the predicate pair and whether the successor kept its value."""
    successor = by_id.get(fact.superseded_by_id)
    if successor is None:
        return f"{fact.predicate or 'free text'} closed (no successor)"
    same = successor.object == fact.object and successor.predicate == fact.predicate
    kind = "restated" if same else "changed"
    return f"{fact.predicate or 'free text'} -> {successor.predicate or 'free text'} ({kind})"


def _coverage(
    conversations: list[Conversation], facts: dict[str, list[pb.Memory]]
) -> dict[str, Any]:
    covered = total = attainable = covered_attainable = 0
    per_conv: dict[str, dict[str, int]] = {}
    for conv in conversations:
        sources = {
            s: set().union(*(m.source_message_ids for m in facts[conv.users[s]]))
            for s in conv.speakers
        }
        c_total = c_covered = 0
        for _, speaker, evidence in conv.observations():
            hit = speaker in sources and any(e in sources[speaker] for e in evidence)
            own = any(conv.said_by.get(e) == speaker for e in evidence)
            c_total += 1
            c_covered += hit
            attainable += own
            covered_attainable += hit and own
        per_conv[conv.sample_id] = {"observations": c_total, "covered": c_covered}
        total += c_total
        covered += c_covered
    return {
        "observations": total,
        "covered": covered,
        "coverage_pct": pct(covered, total),
        # Observations whose evidence holds a turn of that same speaker (the others cannot
        # be covered: a speaker's facts come from their own turns only).
        "attainable": attainable,
        "coverage_of_attainable_pct": pct(covered_attainable, attainable),
        "per_conversation": per_conv,
    }


def pct(part: float, whole: float) -> float:
    return round(100 * part / whole, 1) if whole else float("nan")


def evidence_share(found: Iterable[frozenset[str]], evidence: list[str]) -> float:
    if not evidence:
        return 1.0
    covered = set().union(*found)
    return sum(e in covered for e in evidence) / len(evidence)


def interleave(lists: Sequence[Sequence[Any]]) -> list[Any]:
    seen: set[str] = set()
    out = []
    for row in zip_longest(*lists):
        for item in row:
            if item is not None and item.id not in seen:
                seen.add(item.id)
                out.append(item)
    return out


def by_category(rows: list[tuple[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Mean of each metric (as a percentage) over all rows and per category, with n."""
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    for category, scores in rows:
        groups["all"].append(scores)
        groups[category].append(scores)
    order = ["all", *CATEGORIES.values()]
    return {
        cat: {
            m: round(100 * statistics.fmean(r[m] for r in groups[cat]), 1) for m in groups[cat][0]
        }
        | {"n": len(groups[cat])}
        for cat in sorted(groups, key=lambda c: order.index(c) if c in order else len(order))
    }


def latency(values: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values)
    if not ms:
        return {}
    return {
        "p50": round(ms[len(ms) // 2], 1),
        "p95": round(ms[min(len(ms) - 1, int(len(ms) * 0.95))], 1),
        "max": round(ms[-1], 1),
    }


@dataclass
class Calls:
    """Latency, degraded answers and oddities of one kind of read."""

    latencies: list[float] = field(default_factory=list)
    degraded: int = 0
    unmapped_items: int = 0
    items: int = 0
    # Distinct source turns behind the top 10 items (Recall) or the whole packet (Prefetch):
    # an episode stands for all its speaker's turns of the session.
    turns: list[int] = field(default_factory=list)
    extra: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": len(self.latencies),
            "degraded": self.degraded,
            "latency_ms": latency(self.latencies),
            "items": self.items,
            "items_without_sources": self.unmapped_items,
            "source_turns_mean": round(statistics.fmean(self.turns), 1) if self.turns else 0,
        } | dict(self.extra)


# A saturated server sheds a call at once (RESOURCE_EXHAUSTED, "retry shortly"): the eval
# asks again, as a client should, rather than dying an hour into a run on a shared machine.
SHED_RETRIES = 8


async def shed_retried(rpc: Any, request: Any, md: Any, deadline_s: float, calls: Calls) -> Any:
    """The call's answer, asked again with backoff (0.1 s doubling) while it is shed; the
    retries are counted in ``calls.extra["shed_retries"]``."""
    for attempt in range(SHED_RETRIES + 1):
        try:
            return await rpc(request, metadata=md, timeout=deadline_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or attempt == SHED_RETRIES:
                raise
            calls.extra["shed_retries"] += 1
            await asyncio.sleep(0.1 * 2**attempt)
    raise AssertionError("unreachable")


async def recall_questions(
    stub: Any,
    md: Any,
    conversations: list[Conversation],
    stored: Stored,
    deadline_s: float,
) -> dict[str, Any]:
    rows: dict[str, list[tuple[str, dict[str, float]]]] = defaultdict(list)
    calls: dict[str, Calls] = defaultdict(Calls)
    named: Counter[str] = Counter()
    for conv in conversations:
        for qa in conv.sample["qa"]:
            question = str(qa["question"])
            category = CATEGORIES.get(int(qa["category"]), str(qa["category"]))
            evidence = dia_ids(qa.get("evidence"))
            speakers = conv.named(question)
            named["one" if len(speakers) == 1 else "both or neither"] += 1
            for name, types in RECALL_TYPES.items():
                ranked = []
                for speaker in speakers:
                    started = time.perf_counter()
                    reply = await shed_retried(
                        stub.Recall,
                        pb.RecallRequest(
                            scope=conv.scope(speaker), query=question, top_k=max(KS), types=types
                        ),
                        md,
                        deadline_s,
                        calls[name],
                    )
                    calls[name].latencies.append(time.perf_counter() - started)
                    calls[name].degraded += reply.degraded
                    ranked.append(list(reply.items))
                items = interleave(ranked)[: max(KS)]
                found = [item_sources(item, stored, calls[name]) for item in items]
                calls[name].turns.append(len(set().union(*found[:10])))
                rows[name].append(
                    (category, {f"R@{k}": evidence_share(found[:k], evidence) for k in KS})
                )
            packets = []
            for speaker in speakers:
                started = time.perf_counter()
                packet = await shed_retried(
                    stub.Prefetch,
                    pb.PrefetchRequest(scope=conv.scope(speaker), hint=question),
                    md,
                    deadline_s,
                    calls["prefetch"],
                )
                calls["prefetch"].latencies.append(time.perf_counter() - started)
                calls["prefetch"].degraded += packet.degraded
                packets.append(packet)
            found = packet_sources(packets, stored, calls["prefetch"])
            share = evidence_share(found, evidence)
            covered = set().union(*found)
            calls["prefetch"].turns.append(len(covered))
            rows["prefetch"].append(
                (
                    category,
                    {
                        "any": float(not evidence or any(e in covered for e in evidence)),
                        "all": float(share == 1.0),
                        "share": share,
                    },
                )
            )
    return {
        "recall": {name: by_category(rows[name]) for name in RECALL_TYPES},
        "prefetch": by_category(rows["prefetch"]),
        "calls": {name: c.as_dict() for name, c in calls.items()},
        "questions_naming": dict(named),
    }


def item_sources(item: pb.RecallItem, stored: Stored, calls: Calls) -> frozenset[str]:
    calls.items += 1
    calls.extra[f"items_{pb.ItemType.Name(item.type).removeprefix('ITEM_TYPE_').lower()}"] += 1
    if item.type == pb.ITEM_TYPE_FACT and item.memory.source_message_ids:
        return frozenset(item.memory.source_message_ids)
    found = stored.sources.get(item.id)
    if found is None:
        calls.unmapped_items += 1
    return found or frozenset()


def packet_sources(
    packets: list[pb.PrefetchResponse], stored: Stored, calls: Calls
) -> list[frozenset[str]]:
    """Source turns of every fact and episode of the packets (looked up by id when the packet
    does not carry them)."""
    found = []
    for packet in packets:
        calls.extra["facts_shown"] += len(packet.facts)
        calls.extra["episodes_shown"] += len(packet.episodes)
        calls.extra[pb.CacheStatus.Name(packet.cache).lower()] += 1
        listed = [(m.memory_id, m.source_message_ids) for m in packet.facts] + [
            (e.episode_id, e.source_message_ids) for e in packet.episodes
        ]
        for item_id, sources in listed:
            calls.items += 1
            if sources:
                found.append(frozenset(sources))
                continue
            calls.extra["items_sources_looked_up"] += 1
            looked_up = stored.sources.get(item_id)
            if looked_up is None:
                calls.unmapped_items += 1
            found.append(looked_up or frozenset())
    return found


def throughput(jobs: list[Job], client_started: float) -> dict[str, Any]:
    states = Counter(STATES.get(j.status.state, "unknown") if j.status else "unknown" for j in jobs)
    done = [j for j in jobs if j.status and j.status.state == pb.INGEST_STATE_DONE]
    outcome: Counter[str] = Counter()
    for j in done:
        assert j.status is not None
        for f, value in j.status.outcome.ListFields():
            outcome[f.name] += value
    figures: dict[str, Any] = {
        "jobs": len(jobs),
        "jobs_by_state": dict(states),
        "messages": sum(j.messages for j in jobs),
        "messages_done": sum(j.messages for j in done),
        "attempts_max": max((j.status.attempts for j in jobs if j.status), default=0),
        "outcome_totals": dict(outcome),
        "dead": [
            {
                "ingest_id": j.ingest_id,
                "session": session_key(j.sample_id, j.session),
                "attempts": j.status.attempts,
                "last_error": j.status.last_error,
            }
            for j in jobs
            if j.status and j.status.state == pb.INGEST_STATE_DEAD
        ],
        "not_final": [
            session_key(j.sample_id, j.session)
            for j in jobs
            if not j.status or j.status.state not in (pb.INGEST_STATE_DONE, pb.INGEST_STATE_DEAD)
        ],
    }
    if done:
        first = min(j.status.created_at.ToDatetime() for j in jobs if j.status)
        last = max(j.status.finished_at.ToDatetime() for j in done if j.status)
        seconds = (last - first).total_seconds()
        figures |= {
            "seconds": round(seconds, 2),
            "messages_per_s": round(figures["messages_done"] / seconds, 2) if seconds else None,
            "client_seconds_ingest_to_all_final": round(time.time() - client_started, 1),
        }
    return figures


# -- run ----------------------------------------------------------------------------------------


async def run(
    target: Target, conversations: list[Conversation], args: argparse.Namespace
) -> dict[str, Any]:
    md = (("x-api-key", target.api_key),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        started = time.time()
        jobs = await ingest_all(stub, md, conversations)
        print(f"{len(jobs)} ingests queued in {time.time() - started:.1f}s", flush=True)
        await wait_final(stub, md, jobs, args.ingest_timeout_s)
        figures: dict[str, Any] = {"throughput": throughput(jobs, started)}
        t = figures["throughput"]
        print(f"jobs {t['jobs_by_state']} after {time.time() - started:.1f}s", flush=True)
        stored = Stored()
        await stored.read(stub, md, conversations)
        figures["facts_per_session"] = facts_per_session(conversations, stored)
        figures["coverage"] = coverage(conversations, stored)
        figures["fact_reach"] = fact_reach(conversations, stored)
        print(
            f"coverage: {figures['coverage']['coverage_pct']}%, with ended facts "
            f"{figures['coverage']['including_ended']}; ended only: "
            f"{figures['coverage']['ended_only']}; reach {figures['fact_reach']}",
            flush=True,
        )
        figures["contradictions"] = contradictions(stored)
        print(f"contradictory current facts: {figures['contradictions']}", flush=True)
        started = time.time()
        figures |= await recall_questions(stub, md, conversations, stored, args.deadline_ms / 1000)
        print(f"questions asked in {time.time() - started:.1f}s", flush=True)
        return figures


def git_commit() -> str:
    def git(*argv: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), *argv], capture_output=True, text=True, check=False
        ).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "HEAD") + (" dirty" if dirty else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def server_memsvc() -> str:
    """Where `memsvc serve` (same interpreter, environment and working directory as the
    harness gives it) imports memsvc from."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSVC_")}
    return subprocess.run(
        [sys.executable, "-c", "import memsvc; print(memsvc.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def server_settings(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    server_env = dict(pair.partition("=")[::2] for pair in args.server_env)
    chat = {k: v for k, v in os.environ.items() if k.startswith("MEMSVC_OPENAI_CHAT_")}
    extractor = (
        args.extractor
        or server_env.get("MEMSVC_EXTRACTOR")
        or (
            "openai"
            if "MEMSVC_OPENAI_CHAT_BASE_URL" in chat or "MEMSVC_OPENAI_CHAT_BASE_URL" in server_env
            else "rules"
        )
    )
    if extractor == "openai":
        # The harness gives the server no MEMSVC_* variable of ours: pass the chat ones on.
        server_env = chat | server_env
    return extractor, server_env | {"MEMSVC_EXTRACTOR": extractor}


def markdown(result: dict[str, Any]) -> str:
    f = result["figures"]
    fps, cov, tp = f["facts_per_session"], f["coverage"], f["throughput"]
    st, gold = fps["stored"], fps["gold_observations"]
    cats = ["all", *CATEGORIES.values()]
    lines = [
        f"# Extraction eval {result['stamp']}",
        "",
        f"commit {result['commit']}, extractor `{result['extractor']}`, "
        f"{result['conversations']} conversations, {fps['sessions']} sessions, "
        f"{result['questions']} questions; {result['cpu']}; run {result['run_seconds']:.0f} s",
        "",
        "| per session | mean | min | median | max | total |",
        "|---|---|---|---|---|---|",
    ]
    for label, s in (("stored facts", st), ("gold observations", gold)):
        lines.append(
            f"| {label} | {s.get('mean', 0):.2f} | {s.get('min', 0):.0f} "
            f"| {s.get('median', 0):.1f} | {s.get('max', 0):.0f} | {s.get('total', 0):.0f} |"
        )
    lines += [
        "",
        f"Coverage of gold observations: **{cov['coverage_pct']}%** "
        f"({cov['covered']}/{cov['observations']}; of the {cov['attainable']} attainable: "
        f"{cov['coverage_of_attainable_pct']}%). Episodes stored: {fps['episodes_total']}.",
        "",
        "Counting facts a later statement ended or replaced too (history): "
        f"**{cov['including_ended']['coverage_pct']}%** ({cov['including_ended']['covered']}/"
        f"{cov['observations']}); covered by an ended fact alone, by what ended it: "
        f"{cov['ended_only']}. Ceiling of FACT-only evidence recall (evidence turns that "
        f"are sources of a fact of the speaker(s) asked about): current facts "
        f"{f['fact_reach']['current_pct']}%, every version "
        f"{f['fact_reach']['including_ended_pct']}%.",
        "",
        f"Contradictory current facts: {f['contradictions']['total']} over "
        f"{f['contradictions']['speakers']} speakers "
        f"({f['contradictions']['speakers_with_any']} with any; "
        f"{f['contradictions']['per_speaker_mean']} per speaker).",
        "",
        "| % | " + " | ".join(cats) + " |",
        "|---|" + "---|" * len(cats),
    ]
    rows = [(f"{name} R@{k}", f["recall"][name], f"R@{k}") for name in RECALL_TYPES for k in KS]
    rows += [(f"prefetch {m}", f["prefetch"], m) for m in ("any", "all", "share")]
    for label, table, metric in rows:
        cells = [table.get(c, {}).get(metric, float("nan")) for c in cats]
        lines.append(f"| {label} | " + " | ".join(f"{v:.1f}" for v in cells) + " |")
    ns = [f["prefetch"].get(c, {}).get("n", 0) for c in cats]
    lines.append("| questions | " + " | ".join(str(n) for n in ns) + " |")
    calls = f["calls"]
    lines += [
        "",
        "Distinct source turns behind the top 10 items: "
        + ", ".join(f"{name} {calls[name]['source_turns_mean']}" for name in RECALL_TYPES)
        + f"; behind a question's Prefetch packet(s): {calls['prefetch']['source_turns_mean']}. "
        + "Degraded answers: "
        + ", ".join(f"{name} {c['degraded']}/{c['calls']}" for name, c in calls.items())
        + ".",
        "",
        _quota_note(tp),
        f"Throughput: **{tp.get('messages_per_s')} messages/s** ({tp['messages_done']} messages "
        f"of DONE jobs in {tp.get('seconds')} s); jobs by state {tp['jobs_by_state']}; "
        f"dead {len(tp['dead'])}.",
        "",
    ]
    return "\n".join(lines)


def _quota_note(throughput: dict[str, Any]) -> str:
    """The run packs months of sessions into one server day: a fact the per-user daily
    quota (MEMSVC_DAILY_FACT_QUOTA, 200 by default) skipped is a fact the same sessions on
    their own days would have stored. Coverage and recall of such a run are understated."""
    skipped = throughput.get("outcome_totals", {}).get("skipped_by_quota", 0)
    if not skipped:
        return "No fact was skipped by the daily quota.\n"
    return (
        f"**{skipped} extracted facts were skipped by the daily quota** (all sessions are "
        "ingested within one server day; pass `--server-env MEMSVC_DAILY_FACT_QUOTA=100000` "
        "to measure extraction rather than the quota).\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    flags: list[tuple[str, dict[str, Any]]] = [
        ("--data", {"type": Path, "default": DEFAULT_DATA}),
        ("--extractor", {"choices": ["rules", "openai"], "default": None}),
        ("--server-env", {"action": "append", "default": [], "metavar": "MEMSVC_X=value"}),
        ("--limit-conversations", {"type": int, "default": 0}),
        ("--deadline-ms", {"type": float, "default": 800}),
        ("--ingest-timeout-s", {"type": float, "default": 3600}),
        ("--out", {"type": Path, "default": None}),
    ]
    helps = [
        "folder holding locomo-dev.json (default: ../shared/data/locomo)",
        "MEMSVC_EXTRACTOR (default: openai when MEMSVC_OPENAI_CHAT_BASE_URL is set in the "
        "environment or in --server-env, else rules)",
        "extra server setting (repeatable), e.g. MEMSVC_WORKER_CONCURRENCY=4",
        "only the first N conversations (0: all)",
        "Recall and Prefetch deadline per call (chat preset: 800)",
        "how long to wait for the ingests to be DONE or DEAD",
        "JSON path (default bench/results/extraction-eval-<stamp>.json); the .md goes next to it",
    ]
    for (flag, options), text in zip(flags, helps, strict=True):
        parser.add_argument(flag, help=text, **options)
    args = parser.parse_args()
    extractor, server_env = server_settings(args)
    samples = json.loads((args.data / "locomo-dev.json").read_text())
    if args.limit_conversations:
        samples = samples[: args.limit_conversations]
    conversations = [Conversation.of(s) for s in samples]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or RESULTS_DIR / f"extraction-eval-{stamp}.json"
    import memsvc

    where = {"client": memsvc.__file__, "server": server_memsvc()}
    print(f"memsvc imported from {where}; extractor {extractor}", flush=True)
    started = time.time()
    with embedded_stack() as stack, memsvc_server(stack, server_env) as target:
        figures = asyncio.run(run(target, conversations, args))
    secret = re.compile(r"KEY|SECRET|TOKEN|PASSWORD", re.IGNORECASE)
    result = {
        "stamp": stamp,
        "commit": git_commit(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "memsvc_path": where,
        "extractor": extractor,
        "server_env": {k: "***" if secret.search(k) else v for k, v in server_env.items()},
        "args": {k: str(v) for k, v in vars(args).items()},
        "conversations": len(conversations),
        "questions": sum(len(c.sample["qa"]) for c in conversations),
        "run_seconds": round(time.time() - started, 1),
        "figures": figures,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    summary = markdown(result)
    out.with_suffix(".md").write_text(summary)
    print(f"\n{summary}\nwritten {out} and {out.with_suffix('.md')}")
    dead = figures["throughput"]["dead"]
    if dead or figures["throughput"]["not_final"]:
        print(f"ERROR: {len(dead)} dead ingest job(s): {dead}", file=sys.stderr)
        print(f"not final: {figures['throughput']['not_final']}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
