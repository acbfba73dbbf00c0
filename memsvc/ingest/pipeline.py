"""One ingest job, end to end: index messages, partition speakers, extract, guard, decide, write.

Each human speaker is processed in its own transaction, keyed by (job, speaker) so a re-run
adds nothing; one speaker's failure never rolls back another's, and the worker decides from
the failures whether the job is retried (ingest.failures). Only the errors a step is expected
to raise are caught here: anything else is a bug and ends the attempt at once. Every pool
acquire is bounded by ``acquire_timeout_s``; every statement by the pool's command_timeout;
the whole job by the worker's deadline.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

import asyncpg
import numpy as np
import numpy.typing as npt

from memsvc.cache.invalidation import PacketInvalidator
from memsvc.config import WORKER_ACQUIRE_TIMEOUT_S, from_setting
from memsvc.embedding import Embedder, EmbeddingError
from memsvc.extraction.base import (
    CandidateEpisode,
    CandidateFact,
    Decision,
    ExistingFact,
    Extraction,
    ExtractionInput,
    Extractor,
    Turn,
)
from memsvc.extraction.endings import ended_by, reason_of
from memsvc.extraction.episodes import UNTITLED
from memsvc.extraction.gate import is_phatic
from memsvc.extraction.guardrails import (
    Thresholds,
    Verdict,
    classify,
    guard_decision,
    passes_floor,
    rules_decision,
)
from memsvc.extraction.predicates import HISTORICAL_OF, OPPOSITE, negation_of
from memsvc.governance.compaction import CoreCompactor
from memsvc.governance.guard import PiiGuard
from memsvc.governance.pii import (
    Screened,
    effective_action,
    placeholder_kinds,
    tidy_placeholders,
)
from memsvc.governance.policy import REJECT
from memsvc.ingest.failures import SPEAKER_ERRORS, InvalidExtraction, SpeakerFailures
from memsvc.ingest.payload import JobPayload, parse_payload
from memsvc.observability import metrics
from memsvc.storage import changes, memories, messages, retention
from memsvc.storage import extraction as store
from memsvc.storage.connection import Connection
from memsvc.storage.locks import lock_user
from memsvc.storage.model import NewMemory, Scope
from memsvc.storage.normalize import content_hash, normalize_content
from memsvc.storage.outbox import Job

log = logging.getLogger(__name__)

_TOPIC_VECTORS_MAX = 4_096
# Texts per call to the embedder (see ExtractionPipeline._embed_texts).
_EMBED_PIECE = 8
# The episode's vector is of its title and the head of its summary (the opening: what was
# talked about, and when). A session ingested turn by turn grows its summary with every job,
# and one embedding took 68 ms at 1,000 characters against 21 ms at 300 on this machine; the
# lexical leg still indexes the whole summary.
_EPISODE_EMBED_CHARS = 300
DEFAULT_USER_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}"


@dataclass
class Outcome:
    """What an extraction did; the counters GetIngestStatus reports."""

    added: int = 0
    reinforced: int = 0
    updated: int = 0
    conflicts_resolved: int = 0
    skipped_by_quota: int = 0
    dropped_by_gates: int = 0
    speakers: int = 0
    episodes: int = 0
    topics: int = 0
    messages_indexed: int = 0
    redacted: int = 0
    pii_rejected: int = 0
    core_demoted: int = 0

    def add(self, other: Outcome | dict[str, int]) -> None:
        values = other if isinstance(other, dict) else other.as_dict()
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + int(values.get(f.name, 0)))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class PipelineSettings:
    categories: tuple[str, ...] = field(metadata=from_setting("categories"))
    roles: tuple[str, ...] = field(metadata=from_setting("roles"))
    thresholds: Thresholds = field(default_factory=Thresholds)
    max_facts_per_episode: int = field(default=50, metadata=from_setting("max_facts_per_episode"))
    daily_quota: int = field(default=200, metadata=from_setting("daily_fact_quota"))
    user_id_pattern: str = field(
        default=DEFAULT_USER_ID_PATTERN, metadata=from_setting("user_id_pattern")
    )
    nearest_k: int = 5
    embed_timeout_s: float = field(default=10.0, metadata=from_setting("worker_embed_timeout_s"))
    goal_category: str = "goal"
    goal_role: str = "core"
    # MEMSVC_WORKER_ACQUIRE_TIMEOUT_MS, longer than a call's wait for a connection: a busy
    # pool is no reason to spend one of the job's attempts.
    acquire_timeout_s: float = field(
        default=WORKER_ACQUIRE_TIMEOUT_S, metadata=from_setting("worker_acquire_timeout_ms")
    )


@dataclass
class _Speaker:
    scope: Scope
    turns: list[Turn] = field(default_factory=list)
    goals: tuple[str, ...] = ()
    # The name the caller last sent for this speaker (Message.sender_name), "" when none.
    name: str = ""


@dataclass(frozen=True)
class _Prepared:
    """One speaker's screened extraction with its vectors, ready to be written."""

    candidates: list[CandidateFact]
    fact_vectors: np.ndarray
    topics: tuple[str, ...]
    topic_vectors: list[np.ndarray]
    episode: CandidateEpisode | None
    episode_vector: np.ndarray | None
    previous: asyncpg.Record | None


def _recorded(done: Mapping[str, int]) -> Outcome:
    """The outcome a run already committed (a retried or raced speaker)."""
    result = Outcome()
    result.add(dict(done))
    return result


class ExtractionPipeline:
    """Runs one claimed job. Stateless between jobs; safe to run jobs of different users at once."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        embedder: Embedder,
        extractor: Extractor,
        invalidator: PacketInvalidator,
        settings: PipelineSettings,
        guard: PiiGuard | None = None,
        *,
        compactor: CoreCompactor | None = None,
    ) -> None:
        # The core-memory limit (None: no limit), enforced in each speaker's transaction.
        self._compactor = compactor
        self._pool = pool
        self._embedder = embedder
        self._extractor = extractor
        self._invalidator = invalidator
        # Each write (extraction, a session's end) wakes the user's change watchers where the
        # trigger cannot (Citus).
        self._waker = changes.Waker()
        self._settings = settings
        # The PII screen of extracted facts and episodes (default: redact every kind).
        self._guard = guard or PiiGuard.default()
        self._user_id = re.compile(settings.user_id_pattern)
        # Embeddings of topic names, most recently added last (a bounded LRU by insertion).
        self._topic_vectors: OrderedDict[str, np.ndarray] = OrderedDict()

    async def run(self, job: Job) -> Outcome:
        """Process the job; raises on failure (the worker classifies it), never leaves half a
        speaker."""
        payload = parse_payload(job.payload)
        outcome = Outcome()
        if payload.end_of_session:
            await self._end_session(job, payload)
        async with self._acquire() as conn:
            rows = await messages.messages_of_ingest(conn, job.scope, job.ingest_id)
        outcome.messages_indexed = await self._index_messages(job.scope, rows)
        failures: dict[str, BaseException] = {}
        for speaker in self._speakers(job, payload, rows):
            try:
                outcome.add(await self._process_speaker(job, speaker))
            except SPEAKER_ERRORS as exc:
                log.warning(
                    "extraction failed for a speaker of ingest %s: %s",
                    job.ingest_id,
                    type(exc).__name__,
                )
                failures[speaker.scope.user_id] = exc
        if failures:
            raise SpeakerFailures(failures)
        return outcome

    def _acquire(self) -> asyncpg.pool.PoolAcquireContext:
        return self._pool.acquire(timeout=self._settings.acquire_timeout_s)

    # -- steps ---------------------------------------------------------------------------------

    async def _end_session(self, job: Job, payload: JobPayload) -> None:
        """The session ended: its SESSION memories go (in the owner's scope, and the
        counterpart persona's when the session was with one). Idempotent, so retries are free."""
        scopes = [job.scope]
        persona = payload.counterpart_persona_id
        if persona and persona != job.scope.persona_id:
            scopes.append(replace(job.scope, persona_id=persona))
        async with self._acquire() as conn, conn.transaction():
            deleted = await retention.end_session(conn, scopes, job.session_id)
            # Bumped even when nothing was deleted: the session's episode is now an earlier
            # conversation in Prefetch (queries._finished), so a cached packet is stale.
            await self._waker.bump(conn, job.scope.tenant_id, job.scope.user_id)
        await self._invalidator.drop_user(job.scope.tenant_id, job.scope.user_id)
        if deleted:
            metrics.EXPIRED.labels("memory").inc(deleted)

    async def _index_messages(self, scope: Scope, rows: Sequence[asyncpg.Record]) -> int:
        """Make the job's messages searchable: the lexical context index (with their session
        neighbours), then embeddings. An embedding failure leaves them marked missing (the
        reconcile task repairs them); it does not hold up extraction."""
        by_session: dict[str, list[str]] = {}
        for r in rows:
            by_session.setdefault(r["session_id"], []).append(r["message_id"])
        async with self._acquire() as conn:
            for session_id, ids in by_session.items():
                await messages.index_session_context(conn, scope, session_id, ids)
        todo = [r for r in rows if r["embedding_state"] != "ok" and r["text"].strip()]
        if not todo:
            return 0
        try:
            # The unit: `{name} said, "{text}"` (storage.messages.UNIT_SQL).
            vectors = await self._embed_texts([r["unit"] for r in todo])
        except EmbeddingError as exc:
            log.warning("message embedding failed, left for reconcile: %s", type(exc).__name__)
            return 0
        async with self._acquire() as conn:
            await messages.set_message_embeddings(
                conn,
                scope,
                [(r["session_id"], r["message_id"]) for r in todo],
                vectors,
                self._embedder.model_id,
            )
        return len(todo)

    def _speakers(
        self, job: Job, payload: JobPayload, rows: Sequence[asyncpg.Record]
    ) -> list[_Speaker]:
        """Human speakers only: USER role and a well-formed user id. Bots, assistants, system
        and malformed ids are excluded by construction. Every row is stamped with the
        counterpart persona when the session was with one."""
        persona = payload.counterpart_persona_id or job.scope.persona_id
        by_sender: dict[str, _Speaker] = {}
        for r in rows:
            sender = r["sender_id"]
            if r["role"] != "user" or not self._user_id.fullmatch(sender):
                continue
            speaker = by_sender.get(sender)
            if speaker is None:
                speaker = _Speaker(Scope(job.scope.tenant_id, sender, persona, job.scope.agent_id))
                by_sender[sender] = speaker
            speaker.turns.append(Turn(r["message_id"], r["text"], r["sent_at"]))
            # Only a name the caller sent: a sender_id is a handle ("bob", "alice"), and a
            # name screened out at Ingest is a placeholder, no name.
            name = (r["sender_name"] or "").strip()
            if name and not placeholder_kinds(name):
                speaker.name = name
        goals = payload.goals
        if goals:
            owner = job.scope.user_id
            if owner not in by_sender:
                by_sender[owner] = _Speaker(
                    Scope(job.scope.tenant_id, owner, persona, job.scope.agent_id)
                )
            by_sender[owner].goals = goals
        return list(by_sender.values())

    async def _process_speaker(self, job: Job, speaker: _Speaker) -> Outcome:
        """Extract and embed outside any transaction, then write under the user's lock."""
        scope = speaker.scope
        async with self._acquire() as conn:
            done = await store.run_outcome(conn, scope, job.ingest_id)
        if done is not None:
            return _recorded(done)
        outcome = Outcome(speakers=1)
        prepared = await self._prepare(job, speaker, outcome)
        async with self._acquire() as conn, conn.transaction():
            await lock_user(conn, scope.tenant_id, scope.user_id)
            if not await store.sources_remain(
                conn,
                job.scope,
                job.ingest_id,
                job.session_id,
                [t.message_id for t in speaker.turns],
            ):
                # Erased while we were extracting: write nothing back.
                return Outcome()
            if not await store.claim_run(conn, scope, job.ingest_id, job.session_id):
                # Another worker committed this speaker meanwhile (a lease takeover race).
                return _recorded(await store.run_outcome(conn, scope, job.ingest_id) or {})
            await self._write(conn, job, speaker, prepared, outcome)
        await self._invalidator.drop_user(scope.tenant_id, scope.user_id)
        return outcome

    async def _prepare(self, job: Job, speaker: _Speaker, outcome: Outcome) -> _Prepared:
        """What the speaker said, extracted, screened (gates, floor, PII) and embedded."""
        scope = speaker.scope
        kept = [t for t in speaker.turns if not is_phatic(t.text)]
        outcome.dropped_by_gates += len(speaker.turns) - len(kept)
        extraction = Extraction(episode=None)
        if kept:
            extraction = self._checked(
                await self._extractor.extract(
                    ExtractionInput(
                        speaker_id=scope.user_id,
                        session_id=job.session_id,
                        turns=tuple(kept),
                        categories=self._settings.categories,
                        roles=self._settings.roles,
                        max_facts=self._settings.max_facts_per_episode,
                        speaker_name=speaker.name,
                    )
                )
            )
        candidates = self._screen(extraction.facts, kept, outcome) + self._goal_facts(speaker)
        # Cased as said ("Porto", "Stripe job"); one of each whatever its casing.
        firsts: dict[str, str] = {}
        for t in extraction.topics:
            name = " ".join(t.split())[:80]
            if name:
                firsts.setdefault(name.casefold(), name)
        topics = tuple(firsts.values())
        policy = await self._guard.policy(scope.tenant_id)
        candidates = self._screen_pii(candidates, policy, outcome)
        topics = self._screen_topics(topics, policy)
        async with self._acquire() as conn:
            previous = await store.episode_summary(conn, scope, job.session_id)
        episode = _merge_episode(previous, extraction.episode)
        # Placeholders of this job's messages (Ingest redacted them) in the fresh episode.
        fresh = extraction.episode
        holds_redacted = fresh is not None and any(
            placeholder_kinds(t) for t in (fresh.title, fresh.summary, fresh.excerpt)
        )
        episode = self._screen_episode(episode, policy, outcome, holds_redacted=holds_redacted)
        return await self._embed(candidates, topics, episode, previous)

    async def _embed_texts(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """The texts' vectors, _EMBED_PIECE texts a call: the background embedder takes its
        calls in turn, so another job's small call waits for one piece of a big job's
        embeddings, not all of them (issue 31)."""
        if not texts:
            return np.zeros((0, self._embedder.dimension), dtype=np.float32)
        pieces = [
            await self._embedder.embed(
                texts[i : i + _EMBED_PIECE], timeout_s=self._settings.embed_timeout_s
            )
            for i in range(0, len(texts), _EMBED_PIECE)
        ]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    async def _embed(
        self,
        candidates: list[CandidateFact],
        topics: tuple[str, ...],
        episode: CandidateEpisode | None,
        previous: asyncpg.Record | None,
    ) -> _Prepared:
        """One embedding call for the facts, the topics not seen yet and a changed episode."""
        # Topic names repeat across jobs and users ("interests", "work"): embedded once.
        new_topics = [t for t in dict.fromkeys(topics) if t not in self._topic_vectors]
        texts = [c.content for c in candidates] + new_topics
        episode_text = _episode_text(episode) if episode is not None else ""
        reused = self._same_episode_vector(previous, episode_text)
        if episode is not None and reused is None:
            texts.append(episode_text)
        vectors = await self._embed_texts(texts)
        for name, vec in zip(
            new_topics, vectors[len(candidates) : len(candidates) + len(new_topics)], strict=True
        ):
            self._topic_vectors[name] = vec
            if len(self._topic_vectors) > _TOPIC_VECTORS_MAX:
                self._topic_vectors.popitem(last=False)
        episode_vector = reused
        if episode is not None and reused is None:
            episode_vector = vectors[-1]
        return _Prepared(
            candidates=candidates,
            fact_vectors=vectors[: len(candidates)],
            topics=topics,
            topic_vectors=[self._topic_vectors[t] for t in topics],
            episode=episode,
            episode_vector=episode_vector,
            previous=previous,
        )

    async def _write(
        self,
        conn: Connection,
        job: Job,
        speaker: _Speaker,
        prepared: _Prepared,
        outcome: Outcome,
    ) -> None:
        """Facts (then the core limit), the episode with its topics, the version, the run."""
        scope = speaker.scope
        touched: list[uuid.UUID] = []
        core_written: list[uuid.UUID] = []
        for candidate, vector in zip(prepared.candidates, prepared.fact_vectors, strict=True):
            memory_id = await self._apply(conn, job, scope, candidate, vector, outcome)
            if memory_id is not None:
                touched.append(memory_id)
                if self._compactor and self._compactor.limits.in_block(
                    pinned=False, role=candidate.role
                ):
                    core_written.append(memory_id)
        if self._compactor is not None and core_written:
            # Under the user's lock the caller took, like every core writer.
            compacted = await self._compactor.enforce(
                conn, scope, protect=set(core_written), path="extraction"
            )
            outcome.core_demoted += len(compacted.demoted)
        if prepared.episode is not None:
            await self._write_episode(conn, job, speaker, prepared, touched, outcome)
        await self._waker.bump(conn, scope.tenant_id, scope.user_id)
        await store.finish_run(conn, scope, job.ingest_id, outcome.as_dict())

    async def _write_episode(
        self,
        conn: Connection,
        job: Job,
        speaker: _Speaker,
        prepared: _Prepared,
        memory_ids: list[uuid.UUID],
        outcome: Outcome,
    ) -> None:
        """The session's episode, its expiry, its topics and its links to the facts."""
        assert prepared.episode is not None
        scope, previous = speaker.scope, prepared.previous
        times = [t.sent_at for t in speaker.turns]
        started = min([*times, *([previous["started_at"]] if previous else [])])
        episode_id = await store.upsert_episode(
            conn,
            scope,
            job.session_id,
            prepared.episode,
            started_at=started,
            ended_at=max(times) if times else started,
            embedding=prepared.episode_vector,
            embedding_model=self._embedder.model_id,
        )
        # It expires with the last of its source messages.
        await retention.stamp_episode(conn, job.scope, scope, job.session_id)
        topic_ids = [
            await store.upsert_topic(
                conn,
                scope,
                name,
                seen_at=max(times) if times else started,
                embedding=vec,
                embedding_model=self._embedder.model_id,
            )
            for name, vec in zip(prepared.topics, prepared.topic_vectors, strict=True)
        ]
        await store.link(
            conn, scope, episode_id=episode_id, topic_ids=topic_ids, memory_ids=memory_ids
        )
        outcome.episodes += 1
        outcome.topics += len(topic_ids)

    def _checked(self, extraction: object) -> Extraction:
        """The extractor's result, when it has the shape the protocol promises. A plug-in that
        answers otherwise does so again on the same turns: InvalidExtraction is permanent."""
        if not isinstance(extraction, Extraction):
            raise InvalidExtraction(f"{self._extractor.name} returned {type(extraction).__name__}")
        episode_ok = extraction.episode is None or isinstance(extraction.episode, CandidateEpisode)
        facts_ok = all(
            isinstance(f, CandidateFact)
            and isinstance(f.content, str)
            and isinstance(f.confidence, int | float)
            for f in extraction.facts
        )
        if not (episode_ok and facts_ok and all(isinstance(t, str) for t in extraction.topics)):
            raise InvalidExtraction(f"{self._extractor.name} returned a malformed Extraction")
        return extraction

    def _screen(
        self, facts: Sequence[CandidateFact], kept: Sequence[Turn], outcome: Outcome
    ) -> list[CandidateFact]:
        """Closed vocabularies, the per-episode cap and the confidence floor, in that order.
        A fact is valid from when it was said (its latest source message's ``sent_at``)
        unless the extractor names another date: never from when it was ingested."""
        sent_at = {t.message_id: t.sent_at for t in kept}
        screened: list[CandidateFact] = []
        for fact in facts:
            content = normalize_content(fact.content)[:2_000]
            sources = tuple(s for s in fact.source_message_ids if s in sent_at)
            if (
                not content
                or fact.role not in self._settings.roles
                or fact.category not in self._settings.categories
                or not sources
            ):
                outcome.dropped_by_gates += 1
                continue
            if len(screened) >= self._settings.max_facts_per_episode:
                outcome.dropped_by_gates += 1
                continue
            confidence = min(1.0, max(0.0, fact.confidence))
            if not passes_floor(replace(fact, confidence=confidence), self._settings.thresholds):
                outcome.dropped_by_gates += 1
                continue
            screened.append(
                replace(
                    fact,
                    content=content,
                    confidence=confidence,
                    source_message_ids=sources,
                    valid_from=fact.valid_from or max(sent_at[s] for s in sources),
                    said_at=fact.said_at or max(sent_at[s] for s in sources),
                )
            )
        return screened

    def _screen_pii(
        self, candidates: Sequence[CandidateFact], policy: Mapping[str, str], outcome: Outcome
    ) -> list[CandidateFact]:
        """The PII screen, before embedding and dedup: personal data in a fact's content,
        subject and object is redacted, or the fact is dropped when the tenant rejects it.
        A fact already holding a placeholder (its message was redacted at Ingest) counts as
        redacted, or is dropped when the tenant rejects that kind: a rejected kind never
        becomes a fact, not even as its placeholder."""
        kept: list[CandidateFact] = []
        found: list[Screened] = []
        for fact in candidates:
            core = self._guard.is_core(fact.role, pinned=False)
            texts = [tidy_placeholders(t) for t in (fact.content, fact.subject, fact.object)]
            content, subject, obj = (self._guard.screen(t, policy, core=core) for t in texts)
            found += (content, subject, obj)
            earlier = {k for t in texts for k in placeholder_kinds(t)}
            if (
                content.rejected_kinds
                or subject.rejected_kinds
                or obj.rejected_kinds
                or any(effective_action(policy, k, core=core) == REJECT for k in earlier)
            ):
                outcome.pii_rejected += 1
                continue
            if earlier or content.redactions or subject.redactions or obj.redactions:
                outcome.redacted += 1
            if (content.text, subject.text, obj.text) != (fact.content, fact.subject, fact.object):
                fact = replace(fact, content=content.text, subject=subject.text, object=obj.text)
            kept.append(fact)
        self._guard.record("extraction", found)
        return kept

    def _screen_topics(self, topics: Sequence[str], policy: Mapping[str, str]) -> tuple[str, ...]:
        """A topic name holding personal data the tenant does not store (or a placeholder of
        it) is not linked."""
        screened = [self._guard.screen(t, policy) for t in topics]
        self._guard.record("extraction", screened)
        return tuple(
            t
            for t, s in zip(topics, screened, strict=True)
            if s.text == t and not placeholder_kinds(t)
        )

    def _screen_episode(
        self,
        episode: CandidateEpisode | None,
        policy: Mapping[str, str],
        outcome: Outcome,
        *,
        holds_redacted: bool = False,
    ) -> CandidateEpisode | None:
        """An episode's title, summary and excerpt are redacted (a rejected kind too: the
        episode itself is kept). ``holds_redacted``: this job's part of it already holds
        placeholders (its messages were redacted at Ingest); it counts as redacted."""
        if episode is None:
            return None
        title, summary, excerpt = (
            self._guard.screen(tidy_placeholders(text), policy, may_reject=False)
            for text in (episode.title, episode.summary, episode.excerpt)
        )
        self._guard.record("extraction", [title, summary, excerpt])
        if holds_redacted or title.redactions or summary.redactions or excerpt.redactions:
            outcome.redacted += 1
        if (title.text, summary.text, excerpt.text) == (
            episode.title,
            episode.summary,
            episode.excerpt,
        ):
            return episode
        return replace(episode, title=title.text, summary=summary.text, excerpt=excerpt.text)

    def _goal_facts(self, speaker: _Speaker) -> list[CandidateFact]:
        """Terminal session goals become core facts of the session owner (structured evidence)."""
        category = self._settings.goal_category
        if category not in self._settings.categories:
            category = "context"
        role = (
            self._settings.goal_role
            if self._settings.goal_role in self._settings.roles
            else "context"
        )
        # A session goal holds from the speaker's last turn (the end of the session).
        said = max((t.sent_at for t in speaker.turns), default=None)
        return [
            CandidateFact(
                content=f"Goal: {normalize_content(goal)[:300]}",
                category=category,
                role=role,
                confidence=1.0,
                source_message_ids=(),
                predicate="goal",
                object=normalize_content(goal).lower()[:300],
                valid_from=said,
            )
            for goal in speaker.goals
            if normalize_content(goal)
        ]

    async def _apply(
        self,
        conn: Connection,
        job: Job,
        scope: Scope,
        candidate: CandidateFact,
        vector: np.ndarray,
        outcome: Outcome,
    ) -> uuid.UUID | None:
        """Dedup, decide and write one candidate; returns the memory id it ended up as."""
        digest = content_hash(candidate.content)
        predicates = [candidate.predicate, negation_of(candidate.predicate)]
        if candidate.historical and candidate.predicate in HISTORICAL_OF:
            predicates.append(HISTORICAL_OF[candidate.predicate])
        if candidate.predicate in OPPOSITE:
            predicates.append(OPPOSITE[candidate.predicate])
        verdict = classify(
            candidate,
            exact=await store.exact_active(conn, scope, digest),
            same_predicate=(
                await store.active_with_predicates(conn, scope, candidate.subject, predicates)
                if candidate.predicate
                else []
            ),
            nearest=await store.nearest_active(conn, scope, vector, self._settings.nearest_k),
            thresholds=self._settings.thresholds,
        )
        if verdict.gray and verdict.target is not None:
            verdict = await self._decide_gray(candidate, verdict)
        if verdict.decision is Decision.NOOP and verdict.target is not None:
            await store.reinforce(
                conn,
                scope,
                verdict.target.memory_id,
                candidate.source_message_ids,
                job.session_id,
            )
            outcome.reinforced += 1
            return verdict.target.memory_id
        # Everything below inserts a row: it needs quota. Skipped candidates leave no trace.
        if not await store.take_quota(
            conn, scope.tenant_id, scope.user_id, self._settings.daily_quota
        ):
            outcome.skipped_by_quota += 1
            return None
        new = NewMemory(
            content=candidate.content,
            category=candidate.category,
            role=candidate.role,
            confidence=candidate.confidence,
            subject=candidate.subject,
            # A negation is stored under its negated predicate: never a positive triple.
            predicate=(
                negation_of(candidate.predicate) if candidate.negated else candidate.predicate
            ),
            object=candidate.object,
            source_message_ids=candidate.source_message_ids,
            session_id=job.session_id,
            valid_from=candidate.valid_from,
            origin="extraction",
        )
        target_id = (
            verdict.target.memory_id
            if verdict.decision in (Decision.UPDATE, Decision.CONFLICT) and verdict.target
            else None
        )
        reason = f"{verdict.decision.value}: {verdict.reason}"
        # The states a change ends ("I sold my car" ends "drives a Toyota"), besides its target.
        ended = [f.memory_id for f in await self._ended(conn, scope, candidate)]
        ended = [i for i in ended if i != target_id]
        if target_id is None and ended:
            target_id, reason = ended.pop(0), f"ended: {reason_of(candidate)}"
        elif ended:
            reason += f"; ended: {reason_of(candidate)}"
        old = None
        if target_id is not None:
            old = await memories.get_owned(conn, scope, target_id, for_update=True)
        if old is not None and old.invalid_at is None:
            new_id = uuid.uuid4()
            await memories.mark_superseded(conn, old, new_id, invalid_at=candidate.valid_from)
            record, _ = await memories.insert_or_reinforce(
                conn,
                scope,
                new,
                content_hash=digest,
                embedding=vector,
                embedding_model=self._embedder.model_id,
                memory_id=new_id,
                lineage_id=old.lineage_id,
                supersedes_id=old.memory_id,
                correction_reason=reason[:500],
                ingest_id=job.ingest_id,
            )
            if verdict.decision is Decision.UPDATE:
                outcome.updated += 1
            else:
                outcome.conflicts_resolved += 1
            await self._end_also(conn, scope, ended, record.memory_id, candidate, outcome)
            return record.memory_id
        record, reinforced = await memories.insert_or_reinforce(
            conn,
            scope,
            new,
            content_hash=digest,
            embedding=vector,
            embedding_model=self._embedder.model_id,
            ingest_id=job.ingest_id,
        )
        if reinforced:
            outcome.reinforced += 1
        else:
            outcome.added += 1
        return record.memory_id

    async def _ended(
        self, conn: Connection, scope: Scope, candidate: CandidateFact
    ) -> list[ExistingFact]:
        """The current facts a statement of change ends (endings.py)."""
        if not candidate.ends:
            return []
        facts: list[ExistingFact] = []
        for subject in dict.fromkeys(e.subject for e in candidate.ends):
            facts += await store.active_of_subject(conn, scope, subject)
        return ended_by(candidate, facts)

    async def _end_also(
        self,
        conn: Connection,
        scope: Scope,
        ended: Sequence[uuid.UUID],
        new_id: uuid.UUID,
        candidate: CandidateFact,
        outcome: Outcome,
    ) -> None:
        """Further states the change ended: each superseded by the change's fact, as of the
        time the change happened (kept in history, never deleted)."""
        for memory_id in ended:
            old = await memories.get_owned(conn, scope, memory_id, for_update=True)
            if old is not None and old.invalid_at is None:
                await memories.mark_superseded(conn, old, new_id, invalid_at=candidate.valid_from)
                outcome.conflicts_resolved += 1

    def _same_episode_vector(self, previous: asyncpg.Record | None, text: str) -> np.ndarray | None:
        """The stored vector of the session's episode when the text it was made of is
        unchanged (a summary grows at its end; its vector is of its head)."""
        if previous is None or previous["embedding_state"] != "ok":
            return None
        if previous["embedding_model"] != self._embedder.model_id:
            return None
        if _episode_text_of(previous["title"], previous["summary"]) != text:
            return None
        vector: np.ndarray = previous["embedding"].to_numpy().astype(np.float32)
        return vector

    async def _decide_gray(self, candidate: CandidateFact, verdict: Verdict) -> Verdict:
        assert verdict.target is not None
        result = await self._extractor.decide(candidate, [verdict.target])
        if result is None or (
            result.decision is not Decision.ADD and result.target_id != verdict.target.memory_id
        ):
            result = rules_decision(candidate, verdict.target)
        result = guard_decision(candidate, verdict.target, result)
        return Verdict(result.decision, verdict.target, reason=result.reason or "gray zone")


def _episode_text_of(title: str, summary: str) -> str:
    return f"{title}. {summary}"[:_EPISODE_EMBED_CHARS]


def _episode_text(episode: CandidateEpisode) -> str:
    """What an episode's vector is made of."""
    return _episode_text_of(episode.title, episode.summary)


def _merge_episode(
    previous: asyncpg.Record | None, fresh: CandidateEpisode | None
) -> CandidateEpisode | None:
    """A session ingested turn by turn keeps one episode that grows with each turn."""
    if fresh is None:
        return None
    if previous is None:
        return fresh
    summary = f"{previous['summary']} {fresh.summary}".strip()
    if len(summary) > 2_000:
        summary = "…" + summary[-1_999:]
    sources = tuple(dict.fromkeys([*previous["source_message_ids"], *fresh.source_message_ids]))
    return CandidateEpisode(
        title=(fresh.title if previous["title"] in ("", UNTITLED) else previous["title"]),
        summary=summary,
        excerpt=previous["excerpt"] or fresh.excerpt,
        source_message_ids=sources,
    )
