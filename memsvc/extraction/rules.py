"""The default extractor: spaCy's parse of what the user said, turned into standalone facts.

Offline and deterministic. Each sentence that states something about the speaker (or someone
or something of theirs) becomes a third-person fact with absolute dates, keeping the
subject-predicate-object triple of profile facts (triples.py); questions, requests, small
talk and injection attempts yield nothing (sentences.py).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from spacy.tokens import Doc

from memsvc.extraction.assertions import (
    hypothetical,
    reported,
    retracts,
    retracts_previous,
    sarcastic,
)
from memsvc.extraction.base import (
    CandidateFact,
    DecisionResult,
    Ends,
    ExistingFact,
    Extraction,
    ExtractionInput,
    Reading,
    Turn,
)
from memsvc.extraction.changes import endings, taken_back
from memsvc.extraction.coref import Mentions
from memsvc.extraction.endings import names
from memsvc.extraction.episodes import Mention, subject_mentions, summarize
from memsvc.extraction.headlines import headline
from memsvc.extraction.language import LanguageModel, load_language_model, verify_installed_model
from memsvc.extraction.parser_process import parse_elsewhere
from memsvc.extraction.sentences import (
    FIRST_PLURAL,
    FIRST_SINGULAR,
    INJECTION,
    Statement,
    analyse,
    clauses,
    informative,
    lemma,
    remember_request,
    render,
    restore_subject,
    salience,
)
from memsvc.extraction.topics import Term, fallback_terms, rank, terms_of
from memsvc.extraction.triples import Triple, triples_of

_CATEGORY = {
    "diet": ("preference", "core"),
    "avoids": ("preference", "core"),
    "likes": ("preference", "context"),
    "dislikes": ("preference", "context"),
    "family": ("relationship", "core"),
    "pet": ("relationship", "core"),
    "has": ("relationship", "core"),
    "relationship_status": ("relationship", "core"),
    "lived_in": ("profile", "temporal"),
    "worked_at": ("profile", "temporal"),
    "was": ("profile", "temporal"),
    "plans": ("goal", "context"),
    "goal": ("goal", "context"),
    "note": ("context", "core"),
}
_OPINION_VERBS = frozenset({"like", "love", "enjoy", "hate", "prefer", "feel", "think", "find"})
_SENTENCES_PER_TURN = 2
_HEDGES = frozenset({"maybe", "probably", "perhaps", "might", "possibly", "guess"})


@dataclass(frozen=True)
class _Said:
    turn: Turn
    text: str  # what is parsed: the turn, less an explicit "remember that"
    explicit: bool


def _kind(statement: Statement, predicate: str) -> tuple[str, str]:
    """(category, role) of a fact."""
    if predicate:
        return _CATEGORY.get(predicate, ("profile", "core"))
    if statement.explicit:
        return "context", "core"  # "remember that …": the user wants it always at hand
    if statement.planned:
        return "goal", "context"
    root = statement.root
    opinion = lemma(root) in _OPINION_VERBS or any(c.dep_ == "acomp" for c in root.children)
    if opinion and root.tag_ != "VBD":
        return "preference", "context"
    if root.tag_ in ("VBD", "VBN") or statement.dates:
        return "event", "temporal"
    return "context", "detail"


def _confidence(statement: Statement, triple: Triple | None) -> float:
    if statement.explicit:
        return 0.95
    hedged = any(t.lower_ in _HEDGES for t in statement.sent)
    base = 0.9 if triple is not None else 0.8
    if statement.planned:
        base -= 0.1
    return base - 0.25 if hedged else base


def facts_of_statement(
    statement: Statement, turn: Turn, mentions: Mentions | None = None
) -> list[CandidateFact]:
    """One fact per clause ("I live in Lisbon and I'm allergic to peanuts" is two): the
    clause's own words with its first triple, plus the canonical sentence of every further
    triple ("… for a job at Siemens" -> "The user works at Siemens.")."""
    parts = clauses(statement, turn.sent_at, mentions)
    seen: list[Triple] = []
    if len(parts) > 1 and any(_about_something(p) for p in parts):
        # A clause about no one named ("Volunteering made me feel great", "… it was a
        # misdiagnosis") does not stand alone: the sentence stays one fact, with the triples
        # of its clauses.
        for part in parts:
            seen.extend(t for t in triples_of(part) if t not in seen)
        return _facts_of_clause(statement, seen, turn, split=False)
    out: list[CandidateFact] = []
    for clause in parts:
        triples = [t for t in triples_of(clause) if t not in seen]
        seen.extend(triples)
        out.extend(_facts_of_clause(clause, triples, turn, split=len(parts) > 1))
    if not out and len(parts) > 1 and _speaker_says_something(statement, parts):
        # No clause stands alone, yet together they tell of the speaker ("I have something
        # special too - this is my lucky charm, a ring from my grandmother"): one fact.
        return _facts_of_clause(statement, seen, turn, split=False)
    return out


def _speaker_says_something(statement: Statement, parts: Sequence[Statement]) -> bool:
    """A clause has the speaker as its subject, none is taken back, and the sentence names
    a thing (not only moods and pronouns)."""
    if any(taken_back(p) for p in parts) or not informative(statement.sent, statement.words()):
        return False
    return any(
        c.dep_ in ("nsubj", "nsubjpass") and c.lower_ in FIRST_SINGULAR | FIRST_PLURAL
        for p in parts
        for c in p.root.children
    )


def _about_something(clause: Statement) -> bool:
    """A clause about a thing or an activity ("Volunteering made me feel great"), not about
    someone named nor a pointer back ("it was a misdiagnosis", "that's where I live")."""
    if clause.subject:
        return False
    subj = next((c for c in clause.root.children if c.dep_ in ("nsubj", "nsubjpass")), None)
    return subj is None or subj.lower_ not in ("it", "that", "this", "there", "which", "what")


def _facts_of_clause(
    clause: Statement, triples: list[Triple], turn: Turn, *, split: bool
) -> list[CandidateFact]:
    if clause.imperative:
        triples = [t for t in triples if t.predicate == "name"]
        if not triples:
            return []
    ends = endings(clause)
    # "My cat Luna passed away": the pet it names is what ends, not a pet said again.
    triples = [t for t in triples if not any(_names_ended(e, t) for e in ends)]
    primary = triples[0] if triples else None
    if split and not clause.subject:
        return []  # "… it was a misdiagnosis", "when the results are in": about no one named
    if taken_back(clause):
        return []  # "I said Boston earlier" beside "but I meant Austin"
    if (
        split
        and primary is None
        and not ends
        and not informative(clause.sent, clause.words(), clause.root)
    ):
        return []  # "I'm so excited" beside "I just got a dog"
    content = render(clause, turn.sent_at)
    out: list[CandidateFact] = []
    if primary is not None and primary.predicate in _OWN_WORDS:
        # The name in its own words; the sentence as well when it says more ("I'm Jordan
        # from accounting"), as a fact of its own without a triple.
        if (
            primary.predicate == "name"
            and not clause.imperative
            and len(content.split()) > len(primary.canonical.split())
        ):
            out.append(_fact(content, None, clause, turn, ends))
            ends = ()
        content = primary.canonical
    elif primary is not None and split and _FRAGMENT.match(content):
        content = primary.canonical  # "that's where I live" -> not "Where the user lives"
    elif (
        primary is not None
        and clause.subject not in ("user", "")
        and split
        and (primary.subject == clause.subject)
    ):
        content = primary.canonical  # "… and she lives in Madrid": whose it is, named
    if len(content.split()) < 3:
        return out
    out.append(_fact(content, primary, clause, turn, ends))
    out.extend(_fact(t.canonical, t, clause, turn) for t in triples[1:])
    return out


def _names_ended(ends: Ends, triple: Triple) -> bool:
    if not ends.predicates or triple.predicate not in ends.predicates:
        return False
    return any(names(triple.object, term) for term in ends.terms)


# A clause that reads as a fragment on its own ("Where the user lives").
_FRAGMENT = re.compile(r"(?:where|when|which|that|because|since)\b", re.IGNORECASE)

# Predicates whose fact is their canonical sentence, never the sentence said ("My mom's
# birthday is on March 3rd" would otherwise read as a date of next year).
_OWN_WORDS = frozenset({"name", "birthday", "anniversary"})


def _stated_time(statement: Statement, turn: Turn) -> datetime:
    """When the clause says it happened ("last Friday", "three years ago"), else when it was
    said. A plan's date is not a valid time."""
    if statement.planned:
        return turn.sent_at
    past = [d.when for _, d in statement.dates if d.when.date() <= turn.sent_at.date()]
    if not past:
        return turn.sent_at
    when = past[0]
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _fact(
    content: str,
    triple: Triple | None,
    statement: Statement,
    turn: Turn,
    ends: tuple[Ends, ...] = (),
) -> CandidateFact:
    predicate = triple.predicate if triple else ""
    category, role = _kind(statement, predicate)
    return CandidateFact(
        content=content,
        category=category,
        role=role,
        confidence=_confidence(statement, triple),
        source_message_ids=(turn.message_id,),
        subject=triple.subject if triple else (statement.subject or "user"),
        predicate=predicate,
        object=triple.object if triple else "",
        historical=triple.historical if triple else statement.historical,
        negated=triple.negated if triple else statement.negated,
        planned=triple.planned if triple else statement.planned,
        valid_from=_stated_time(statement, turn),
        said_at=turn.sent_at,
        ends=ends,
    )


def _note(said: _Said) -> CandidateFact | None:
    """An explicit "remember that the gate code is on the fridge": kept as said."""
    text = said.text.strip().rstrip(".!")
    if len(text.split()) < 3 or text.endswith("?"):
        return None
    return CandidateFact(
        content=text[:1].upper() + text[1:] + ".",
        category="context",
        role="core",
        confidence=0.95,
        source_message_ids=(said.turn.message_id,),
        predicate="note",
        object=text.lower(),
        valid_from=said.turn.sent_at,
    )


def facts_of_turn(
    said: _Said,
    doc: Doc,
    mentions: Mentions | None = None,
    titles: list[tuple[int, str]] | None = None,
    terms: list[Term] | None = None,
    speaker: str = "",
) -> list[CandidateFact]:
    """At most _SENTENCES_PER_TURN of a turn's sentences as facts (the most salient, in the
    order said), plus every profile triple and every change of the others. A sentence's
    pronouns resolve to the people and pets named before them in the turn; a joke taken back
    ("just kidding") takes the whole turn with it. `mentions`: those carried from the
    speaker's turn before; this turn's are added to it. `titles`, when given, receives
    (salience, headline) of each sentence that gave facts (the episode's title candidates),
    and `terms` what those sentences were about (its topic candidates). `speaker`: the
    speaker's name for the titles, "" when unknown."""
    if INJECTION.search(said.turn.text) or retracts(said.turn.text):
        return []
    mentions = mentions if mentions is not None else Mentions()
    statements: list[Statement] = []
    for sent in doc.sents:
        mentions.observe(sent)
        found = analyse(sent, said.turn.sent_at, explicit=said.explicit, mentions=mentions)
        if found is not None:
            statements.append(found)
    ranked = sorted(range(len(statements)), key=lambda i: (-salience(statements[i]), i))
    # The most salient sentence, and a second one only when it too stands on its own.
    keep = set(ranked[:1]) | {
        i for i in ranked[1:_SENTENCES_PER_TURN] if salience(statements[i]) >= 3
    }
    facts: list[CandidateFact] = []
    for i, statement in enumerate(statements):
        found_facts = facts_of_statement(statement, said.turn, mentions)
        if i not in keep:
            found_facts = [
                f for f in found_facts if (f.predicate and f.predicate != "plans") or f.ends
            ]
        facts.extend(found_facts)
        if (
            titles is not None
            and found_facts
            and (title := headline(statement, speaker)) is not None
        ):
            titles.append((salience(statement), title))
        if terms is not None and found_facts:
            terms.extend(terms_of(statement.sent, statement.words()))
    if not facts and said.explicit and (note := _note(said)) is not None:
        facts.append(note)
    return facts


def _unasserted(said: _Said, doc: Doc) -> list[tuple[str, str]]:
    """(message id, text) of what the turn says without asserting it: the whole turn when
    it takes itself back ("just kidding"), else each wish, condition, report of someone
    else's words and sarcastic sentence."""
    if retracts(said.turn.text):
        return [(said.turn.message_id, said.turn.text)]
    return [
        (said.turn.message_id, sent.text)
        for sent in doc.sents
        if sarcastic(sent) or hypothetical(sent) or reported(sent, FIRST_SINGULAR | FIRST_PLURAL)
    ]


def _fit(fact: CandidateFact, categories: Sequence[str], roles: Sequence[str]) -> CandidateFact:
    """A tenant's own vocabularies may lack a category or role: 'context' is always there."""
    category = fact.category if fact.category in categories else "context"
    role = fact.role if fact.role in roles else "context"
    if (category, role) == (fact.category, fact.role):
        return fact
    return replace(fact, category=category, role=role)


# Characters of a job parsed at a time: the longest a cancelled job keeps the parser
# process, and another job waits for it. spaCy and the rules take about 1 s for 1,500
# characters on a busy core (bench/fairness.py); a smaller chunk costs a round trip more.
PARSE_CHUNK_CHARS = 1_500


@dataclass(frozen=True)
class Parsed:
    """What the parse of some turns gives: facts in turn order, subject mentions."""

    facts: tuple[CandidateFact, ...]
    mentions: tuple[Mention, ...]
    # (salience, headline) of the sentences that gave facts, in turn order.
    titles: tuple[tuple[int, str], ...] = ()
    # (message id, text) of what was said without being asserted (Reading.unasserted).
    unasserted: tuple[tuple[str, str], ...] = ()
    # What the sentences that gave facts were about, in turn order (topic candidates).
    terms: tuple[Term, ...] = ()


def _chunks(data: ExtractionInput, max_chars: int) -> list[ExtractionInput]:
    """The turns in consecutive runs of at most ``max_chars`` characters (or one turn)."""
    chunks: list[ExtractionInput] = []
    run: list[Turn] = []
    size = 0
    for turn in data.turns:
        if run and size + len(turn.text) > max_chars:
            chunks.append(replace(data, turns=tuple(run)))
            run, size = [], 0
        run.append(turn)
        size += len(turn.text)
    if run:
        chunks.append(replace(data, turns=tuple(run)))
    return chunks


def _assemble(data: ExtractionInput, parts: Sequence[Parsed]) -> Extraction:
    """One extraction from the parses of consecutive chunks of the turns."""
    facts: list[CandidateFact] = []
    seen: set[str] = set()
    for part in parts:
        for fact in part.facts:
            key = fact.content.casefold()
            if key not in seen:
                seen.add(key)
                facts.append(_fit(fact, data.categories, data.roles))
    facts = facts[: data.max_facts]
    mentions = [mention for part in parts for mention in part.mentions]
    titles = [title for part in parts for title in part.titles]
    episode = summarize(data.turns, facts, mentions, titles)
    # The speaker's own name is who talked, not what about ("I'm Dana").
    names = [f.object for f in facts if f.subject == "user" and f.predicate == "name"]
    topics = rank(
        [term for part in parts for term in part.terms], leave_out=[data.speaker_name, *names]
    )
    if not topics:
        # No statement gave a fact: the things talked about most name the conversation.
        topics = rank(fallback_terms(mentions), leave_out=[data.speaker_name, *names])
    return Extraction(episode=episode, facts=tuple(facts), topics=topics)


class RulesExtractor:
    """Deterministic, offline extraction; it has no model, so gray-zone decisions use rules."""

    def __init__(
        self,
        language: LanguageModel | None = None,
        *,
        offload: bool = True,
        chunk_chars: int = PARSE_CHUNK_CHARS,
    ) -> None:
        """`offload`: parse in the parser process (off this process's GIL); a given
        `language`, or offload=False, parses in a thread of this process. `chunk_chars`:
        characters parsed at a time (see `extract`)."""
        self._language = language
        self._chunk_chars = chunk_chars
        self._offload = offload and language is None
        if self._offload:
            verify_installed_model()  # fail at start-up, not at the first job
        elif self._language is None:
            self._language = load_language_model()

    @property
    def name(self) -> str:
        return "rules"

    def extract_sync(self, data: ExtractionInput) -> Extraction:
        """The work of `extract` at once, for a thread (parsing is CPU-bound)."""
        if not data.turns:
            return Extraction(episode=None)
        return _assemble(data, [self.parse_sync(data)])

    def parse_sync(self, data: ExtractionInput) -> Parsed:
        """The CPU-bound part for some turns: their facts and subject mentions."""
        said = []
        for turn in data.turns:
            text = restore_subject(turn.text.replace("\u2019", "'").replace("\u2018", "'"))
            inner = remember_request(text)
            said.append(_Said(turn, inner if inner is not None else text, inner is not None))
        if self._language is None:
            self._language = load_language_model()
        docs = self._language.parse([s.text for s in said])
        facts: list[CandidateFact] = []
        previous: str | None = None
        said_before = ""
        mentions = Mentions()
        titles: dict[str, list[tuple[int, str]]] = {}
        terms: dict[str, list[Term]] = {}
        # Coreference and "jk" reach back within the chunk parsed (a job's turns up to
        # PARSE_CHUNK_CHARS), not across chunks.
        unasserted: list[tuple[str, str]] = []
        for item, doc in zip(said, docs, strict=True):
            if retracts_previous(item.turn.text) and previous is not None:
                # "I'm a billionaire." / "jk": the joke of the turn before is taken back.
                facts = [f for f in facts if previous not in f.source_message_ids]
                titles.pop(previous, None)
                terms.pop(previous, None)
                unasserted.append((previous, said_before))
            unasserted.extend(_unasserted(item, doc))
            previous, said_before = item.turn.message_id, item.turn.text
            mentions = mentions.carried()
            own = titles.setdefault(item.turn.message_id, [])
            about = terms.setdefault(item.turn.message_id, [])
            facts.extend(facts_of_turn(item, doc, mentions, own, about, data.speaker_name))
        return Parsed(
            tuple(facts),
            tuple(subject_mentions(docs)),
            tuple(title for own in titles.values() for title in own),
            tuple(unasserted),
            tuple(term for about in terms.values() for term in about),
        )

    async def extract(self, data: ExtractionInput) -> Extraction:
        """Parsed a chunk of turns at a time (at most ``chunk_chars`` characters, or one
        turn): a job cancelled (its deadline, its deletion, a shutdown) stops parsing after
        the chunk in hand, and the parser process takes the chunks of concurrent jobs in
        turn instead of one whole job after another."""
        if not data.turns:
            return Extraction(episode=None)
        parts = []
        for chunk in _chunks(data, self._chunk_chars):
            parts.append(await self._parse_chunk(chunk))
        return _assemble(data, parts)

    async def read(self, data: ExtractionInput) -> Reading:
        """Every fact the rules read in the turns, as read (no episode, no cap, no
        vocabulary fitting), and what was said without being asserted: what another
        extractor's facts are held to (grounding.py)."""
        facts: list[CandidateFact] = []
        unasserted: list[tuple[str, str]] = []
        for chunk in _chunks(data, self._chunk_chars):
            parsed = await self._parse_chunk(chunk)
            facts.extend(parsed.facts)
            unasserted.extend(parsed.unasserted)
        return Reading(tuple(facts), tuple(unasserted))

    async def _parse_chunk(self, chunk: ExtractionInput) -> Parsed:
        if self._offload:
            return await parse_elsewhere(_parse_in_parser_process, chunk)
        return await asyncio.to_thread(self.parse_sync, chunk)

    async def decide(
        self, candidate: CandidateFact, existing: Sequence[ExistingFact]
    ) -> DecisionResult | None:
        return None

    async def aclose(self) -> None:
        return None


_IN_PARSER_PROCESS: RulesExtractor | None = None


def _parse_in_parser_process(data: ExtractionInput) -> Parsed:
    """Runs in the parser process: one extractor (and one loaded model) for its lifetime."""
    global _IN_PARSER_PROCESS
    if _IN_PARSER_PROCESS is None:
        _IN_PARSER_PROCESS = RulesExtractor(offload=False)
    return _IN_PARSER_PROCESS.parse_sync(data)
