"""A synthetic but realistic read-path corpus, bulk-loaded with COPY.

Users get memories (facts), messages in sessions, episodes, topics and the edges between
them, with real all-MiniLM-L6-v2 embeddings. Embedding 150,000 texts would take ~10 minutes
on the 2-core reference box, so a bank of distinct sentences is embedded once (a few
thousand) and each row reuses the vector of its sentence; every row's text is exactly its
sentence, so text and vector always agree. A user never holds the same fact twice.
The HNSW indexes are dropped for the load and rebuilt once at the end (bulk builds are
several times faster than row-by-row index inserts); the schema is unchanged afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import numpy as np
import numpy.typing as npt
from pgvector.asyncpg import register_vector

from memsvc.embedding.onnx_minilm import OnnxMiniLMEmbedder

TENANT = "bench"
NAMES = ["Maya", "Leo", "Sam", "Nora", "Ravi", "Ines", "Tom", "Aiko", "Omar", "Lena", "Jonas"]
CITIES = ["Lisbon", "Kyoto", "Berlin", "Austin", "Lagos", "Oslo", "Lima", "Hanoi", "Porto"]
FOODS = ["ramen", "paella", "tacos", "dumplings", "risotto", "falafel", "pho", "curry"]
DRINKS = ["black coffee", "green tea", "oat latte", "espresso", "chai", "sparkling water"]
HOBBIES = ["climbing", "chess", "pottery", "sailing", "running", "baking", "birdwatching"]
INSTRUMENTS = ["cello", "guitar", "piano", "violin", "drums", "ukulele"]
RELATIONS = ["daughter", "son", "sister", "brother", "mother", "father", "partner", "friend"]
JOBS = ["nurse", "teacher", "architect", "pilot", "chef", "accountant", "developer"]
LANGUAGES = ["Japanese", "Spanish", "German", "Portuguese", "Korean", "Italian"]
MONTHS = ["January", "March", "May", "July", "September", "November"]
DAYS = ["Mondays", "Wednesdays", "Fridays", "Saturdays", "Sundays"]
ALLERGENS = ["peanuts", "shellfish", "pollen", "cats", "penicillin", "gluten"]
TOPICS = ["travel", "food", "family", "work", "music", "health", "sport", "books", "money"]

FACT_TEMPLATES = [
    "Drinks {drink} every morning",
    "Is allergic to {allergen}",
    "Has a {relation} named {name}",
    "Works as a {job} in {city}",
    "Is planning a trip to {city} in {month}",
    "Plays the {instrument} on {day}",
    "Is learning {language} for a move to {city}",
    "Favourite food is {food} from a place in {city}",
    "Goes {hobby} with {name} on {day}",
    "Her {relation} {name} has a birthday in {month}",
    "Wants to finish a {hobby} course by {month}",
    "Does not eat {food} since a trip to {city}",
]
MESSAGE_TEMPLATES = [
    "I had {food} with {name} in {city} yesterday",
    "Can you remind me to call my {relation} on {day}?",
    "We should plan the {city} trip for {month}",
    "My {instrument} lesson moved to {day}",
    "I think I'm getting better at {hobby}",
    "{name} recommended a {language} tutor to me",
    "Work as a {job} is exhausting this month",
    "I switched from {drink} to something lighter",
]
QUERY_TEMPLATES = [
    "what does she drink in the morning",
    "is she allergic to {allergen}",
    "who is {name}",
    "what does her {relation} do",
    "where is she travelling in {month}",
    "which instrument does she play on {day}",
    "what language is she learning",
    "what food does she like in {city}",
    "who does she go {hobby} with",
    "when is her {relation}'s birthday",
    "what was the plan for {city}",
    "did she mention {food} or {drink}",
]


def _fill(template: str, rng: random.Random) -> str:
    return template.format(
        drink=rng.choice(DRINKS),
        allergen=rng.choice(ALLERGENS),
        relation=rng.choice(RELATIONS),
        name=rng.choice(NAMES),
        job=rng.choice(JOBS),
        city=rng.choice(CITIES),
        month=rng.choice(MONTHS),
        instrument=rng.choice(INSTRUMENTS),
        day=rng.choice(DAYS),
        language=rng.choice(LANGUAGES),
        food=rng.choice(FOODS),
        hobby=rng.choice(HOBBIES),
    )


def distinct_sentences(templates: list[str], count: int, rng: random.Random) -> list[str]:
    seen: dict[str, None] = {}
    attempts = 0
    while len(seen) < count and attempts < count * 50:
        seen[_fill(rng.choice(templates), rng)] = None
        attempts += 1
    return list(seen)


def queries(count: int, seed: int) -> list[str]:
    """Natural-language questions, distinct where the templates allow (a reworded suffix
    keeps them distinct beyond that, so every one costs a real embedding)."""
    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < count:
        q = _fill(rng.choice(QUERY_TEMPLATES), rng)
        if q in out:
            q = f"{q} {rng.choice(['again', 'lately', 'these days', 'now', 'recently'])}"
            q += f" ({len(out)})"
        out[q] = None
    return list(out)


@dataclass(frozen=True)
class Corpus:
    users: int
    memories: int
    messages: int
    episodes: int
    topics: int
    seconds: float
    distinct_fact_texts: int
    distinct_message_texts: int
    # Seconds to build each HNSW index over the loaded rows (bulk, after the COPY).
    index_build_s: dict[str, float] = field(default_factory=dict)


async def _embed(embedder: OnnxMiniLMEmbedder, texts: list[str]) -> npt.NDArray[np.float32]:
    out = np.empty((len(texts), embedder.dimension), dtype=np.float32)
    for i in range(0, len(texts), 256):
        out[i : i + 256] = await embedder.embed(texts[i : i + 256])
    return out


async def seed(
    dsn: str,
    *,
    users: int,
    memories_per_user: int,
    messages_per_user: int,
    sessions_per_user: int = 5,
    topics_per_user: int = 3,
    seed_value: int = 7,
) -> Corpus:
    started = time.perf_counter()
    rng = random.Random(seed_value)
    embedder = OnnxMiniLMEmbedder(intra_op_threads=2, max_workers=1)
    facts = distinct_sentences(FACT_TEMPLATES, max(memories_per_user * 20, 2000), rng)
    messages = distinct_sentences(MESSAGE_TEMPLATES, 3000, rng)
    fact_vecs = await _embed(embedder, facts)
    msg_vecs = await _embed(embedder, messages)
    topic_vecs = await _embed(embedder, TOPICS)
    model_id = embedder.model_id
    await embedder.aclose()

    now = datetime.now(UTC)
    mem_rows: list[tuple[Any, ...]] = []
    msg_rows: list[tuple[Any, ...]] = []
    ep_rows: list[tuple[Any, ...]] = []
    topic_rows: list[tuple[Any, ...]] = []
    te_rows: list[tuple[Any, ...]] = []
    em_rows: list[tuple[Any, ...]] = []
    roles = ["context"] * 6 + ["detail"] * 2 + ["temporal", "causal"]
    categories = ["preference", "profile", "relationship", "goal", "event", "context"]
    for u in range(users):
        user = f"user-{u:05d}"
        picks = rng.sample(range(len(facts)), memories_per_user)
        mem_ids: list[uuid.UUID] = []
        for j, f in enumerate(picks):
            mid = uuid.uuid4()
            mem_ids.append(mid)
            at = now - timedelta(days=rng.uniform(0, 365))
            role = "core" if j < max(1, memories_per_user // 20) else rng.choice(roles)
            content = facts[f]
            mem_rows.append(
                (
                    TENANT, user, mid, mid, content, hashlib.sha256(content.encode()).digest(),
                    rng.choice(categories), role, round(rng.uniform(0.6, 1.0), 2),
                    j % 40 == 0, at, at, "extraction", fact_vecs[f], model_id, "ok",
                )
            )  # fmt: skip
        topic_ids = []
        for name in rng.sample(TOPICS, topics_per_user):
            tid = uuid.uuid4()
            topic_ids.append(tid)
            seen_at = now - timedelta(days=rng.uniform(0, 90))
            topic_rows.append(
                (TENANT, user, tid, name, float(rng.randint(1, 5)), seen_at,
                 topic_vecs[TOPICS.index(name)], model_id, "ok")
            )  # fmt: skip
        per_session = max(1, messages_per_user // sessions_per_user)
        for s in range(sessions_per_user):
            session = f"s{s}"
            start = now - timedelta(days=rng.uniform(1, 120))
            lines = rng.sample(range(len(messages)), per_session)
            for k, m in enumerate(lines):
                msg_rows.append(
                    (TENANT, user, session, f"m{k}", uuid.uuid4(), user, "user", messages[m],
                     start + timedelta(minutes=k), msg_vecs[m], model_id, "ok")
                )  # fmt: skip
            eid = uuid.uuid4()
            first = messages[lines[0]]
            ep_rows.append(
                (TENANT, user, eid, session, f"Chat about {rng.choice(TOPICS)}", first,
                 start, start + timedelta(minutes=per_session), msg_vecs[lines[0]], model_id, "ok")
            )  # fmt: skip
            for tid in rng.sample(topic_ids, min(2, len(topic_ids))):
                te_rows.append((TENANT, user, tid, eid, 1.0))
            for mid in rng.sample(mem_ids, min(10, len(mem_ids))):
                em_rows.append((TENANT, user, eid, mid, 1.0))

    dims = fact_vecs.shape[1]
    conn = await asyncpg.connect(dsn)
    try:
        await register_vector(conn)
        await conn.execute("SET maintenance_work_mem = '1GB'")
        for table in ("memories", "messages", "episodes"):
            await conn.execute(f"DROP INDEX IF EXISTS {table}_embedding_hnsw")
        await conn.copy_records_to_table(
            "memories",
            records=mem_rows,
            columns=[
                "tenant_id", "user_id", "memory_id", "lineage_id", "content", "content_hash",
                "category", "role", "confidence", "pinned", "valid_from", "recorded_at",
                "origin", "embedding", "embedding_model", "embedding_state",
            ],
            timeout=3600,
        )  # fmt: skip
        await conn.copy_records_to_table(
            "messages",
            records=msg_rows,
            columns=[
                "tenant_id", "user_id", "session_id", "message_id", "ingest_id", "sender_id",
                "role", "text", "sent_at", "embedding", "embedding_model", "embedding_state",
            ],
            timeout=3600,
        )  # fmt: skip
        await conn.copy_records_to_table(
            "episodes",
            records=ep_rows,
            columns=[
                "tenant_id", "user_id", "episode_id", "session_id", "title", "summary",
                "started_at", "ended_at", "embedding", "embedding_model", "embedding_state",
            ],
            timeout=3600,
        )  # fmt: skip
        await conn.copy_records_to_table(
            "topics",
            records=topic_rows,
            columns=[
                "tenant_id", "user_id", "topic_id", "name", "weight", "last_episode_at",
                "embedding", "embedding_model", "embedding_state",
            ],
            timeout=3600,
        )  # fmt: skip
        await conn.copy_records_to_table(
            "topic_episodes",
            records=te_rows,
            columns=["tenant_id", "user_id", "topic_id", "episode_id", "weight"],
            timeout=3600,
        )
        await conn.copy_records_to_table(
            "episode_memories",
            records=em_rows,
            columns=["tenant_id", "user_id", "episode_id", "memory_id", "weight"],
            timeout=3600,
        )
        await conn.execute(
            "INSERT INTO scope_versions (tenant_id, user_id, version)"
            " SELECT DISTINCT tenant_id, user_id, nextval('scope_version_seq') FROM"
            " (SELECT DISTINCT tenant_id, user_id FROM memories WHERE tenant_id = $1) u"
            " ON CONFLICT (tenant_id, user_id) DO UPDATE SET version = EXCLUDED.version",
            TENANT,
        )
        # The migration's index definitions, rebuilt in bulk.
        index_build_s: dict[str, float] = {}
        for table in ("memories", "messages", "episodes"):
            building = time.perf_counter()
            await conn.execute(
                f"CREATE INDEX {table}_embedding_hnsw ON {table}"
                " USING hnsw (embedding vector_cosine_ops)",
                timeout=3600,
            )
            index_build_s[f"{table}_embedding_hnsw"] = round(time.perf_counter() - building, 2)
        await conn.execute("VACUUM ANALYZE", timeout=3600)
    finally:
        await conn.close()
    assert dims == 384
    return Corpus(
        users=users,
        memories=len(mem_rows),
        messages=len(msg_rows),
        episodes=len(ep_rows),
        topics=len(topic_rows),
        seconds=time.perf_counter() - started,
        distinct_fact_texts=len(facts),
        distinct_message_texts=len(messages),
        index_build_s=index_build_s,
    )


def add_arguments(
    parser: argparse.ArgumentParser, *, users: int, memories_per_user: int, messages_per_user: int
) -> None:
    """The corpus's size flags, with a benchmark's defaults."""
    parser.add_argument("--users", type=int, default=users)
    parser.add_argument("--memories-per-user", type=int, default=memories_per_user)
    parser.add_argument("--messages-per-user", type=int, default=messages_per_user)


async def seeded_before(dsn: str) -> Corpus | None:
    """The corpus a kept data folder holds already (bench/scale.py --data-dir), if any."""
    conn = await asyncpg.connect(dsn)
    try:
        counts = await conn.fetchrow(
            "SELECT (SELECT count(DISTINCT user_id) FROM memories WHERE tenant_id = $1) AS users,"
            " (SELECT count(*) FROM memories WHERE tenant_id = $1) AS memories,"
            " (SELECT count(*) FROM messages WHERE tenant_id = $1) AS messages,"
            " (SELECT count(*) FROM episodes WHERE tenant_id = $1) AS episodes,"
            " (SELECT count(*) FROM topics WHERE tenant_id = $1) AS topics",
            TENANT,
        )
    finally:
        await conn.close()
    if counts is None or not counts["memories"]:
        return None
    return Corpus(
        users=counts["users"],
        memories=counts["memories"],
        messages=counts["messages"],
        episodes=counts["episodes"],
        topics=counts["topics"],
        seconds=0.0,
        distinct_fact_texts=0,
        distinct_message_texts=0,
    )


def seed_from_args(dsn: str, args: argparse.Namespace) -> Corpus:
    """Seed the corpus the flags of ``add_arguments`` describe, and say what was seeded."""
    seeded = asyncio.run(
        seed(
            dsn,
            users=args.users,
            memories_per_user=args.memories_per_user,
            messages_per_user=args.messages_per_user,
        )
    )
    print(f"corpus: {seeded}")
    return seeded
