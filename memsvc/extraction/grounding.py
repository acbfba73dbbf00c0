"""A chat model's facts held to what the rules read in the same turns (issue 29 item 7).

A model may store "I don't work at Google anymore" as "works at Google", file the sister's
city as the user's, record a new employer without ending the old one, or date "last Friday"
at the moment it ran. The rules extractor reads each of those off spaCy's parse (polarity,
whose statement it is, the states a change ends, the stated time), so each fact the model
proposes is matched with the rules' reading of the same turn and takes from it what the
model cannot be trusted with:

- polarity: a statement the rules read as negated is never kept as a positive triple;
- subject: a fact the rules file under someone else ("user's sister Rita") is theirs, never
  the user's;
- tense: a statement the rules read as past ("used to") or planned is not the current value;
- what a change ends (``ends``, and the triple of a change the model left as free text:
  "got a new job at Stripe" is ``works_at Stripe``, which supersedes the old employer);
- valid time: a time the utterance states ("last Friday") is the fact's ``valid_from``;
- assertion: a fact about the user that the rules have no reading of and that comes from
  what was said without being asserted ("If I lived in Paris …", "my friend said she loves
  jazz", "Oh great, I just LOVE traffic", a joke taken back) is dropped.

Any other fact the rules have no reading of (they read less than a model does) is kept as
the model gave it, after the shape checks of the model's own extractor, with one rule of its
own: a fact whose own sentence is negated ("The user does not eat pork.") never carries a
positive triple. Its triple is dropped and its sentence kept: a negated triple could end a
true fact when the "not" belongs to another part of the sentence ("… Google, which is not in
London"), while a fact without a triple ends nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from memsvc.extraction.base import CandidateFact, Reading

# Words every fact shares ("The user is …"): no evidence that two facts say the same thing.
_COMMON = frozenset(
    {"the", "user", "user's", "a", "an", "is", "are", "was", "to", "at", "in", "of", "and"}
    | {"their", "on", "for", "with", "has", "have", "does", "not", "no", "s", "they", "by"}
)
# A fact's words for matching: lower-case letters and digits (a closed, well-shaped thing).
_WORD = re.compile(r"[a-z0-9]+")
# How alike the words of two facts without a common object must be to be one statement.
_SAME_WORDS = 0.6
# A negation in a fact's own sentence ("does not", "doesn't", "never", "no longer").
_NEGATION = re.compile(r"\b(?:not|never|no\s+longer)\b|n't\b", re.IGNORECASE)


def held_to(proposed: Sequence[CandidateFact], read: Reading) -> tuple[CandidateFact, ...]:
    """``proposed`` (a model's facts) with what ``read`` (the rules' reading of the same
    turns) says of the same statements enforced; order kept, and a fact that came to say
    what an earlier one says is kept once."""
    held: dict[str, CandidateFact] = {}
    for fact in proposed:
        reading = _reading(fact, read.facts)
        if reading is None and fact.subject == "user" and _unasserted(fact, read.unasserted):
            continue
        fact = _held(fact, reading)
        held.setdefault(fact.content.casefold(), fact)
    return tuple(held.values())


def _unasserted(fact: CandidateFact, unasserted: Sequence[tuple[str, str]]) -> bool:
    """Whether the fact comes from something its source turns say without asserting it:
    that text names the fact's object, or holds most of its words."""
    words = _words(fact.content.casefold())
    for message_id, text in unasserted:
        if message_id not in fact.source_message_ids:
            continue
        said = text.casefold()
        if fact.object and _mentions(said, fact.object):
            return True
        if words and len(words & _words(said)) / len(words) >= _SAME_WORDS:
            return True
    return False


def _reading(fact: CandidateFact, read: Sequence[CandidateFact]) -> CandidateFact | None:
    """The rules' fact of the same statement: from one of its source turns, naming the same
    thing (best match first, then first read)."""
    sources = set(fact.source_message_ids)
    best: tuple[float, CandidateFact] | None = None
    for candidate in read:
        if not sources & set(candidate.source_message_ids):
            continue
        score = _likeness(fact, candidate)
        if score is not None and (best is None or score > best[0]):
            best = (score, candidate)
    return best[1] if best is not None else None


def _likeness(fact: CandidateFact, reading: CandidateFact) -> float | None:
    """How surely two facts are one statement; None when they are not."""
    content, said = fact.content.casefold(), reading.content.casefold()
    words, read_words = _words(content), _words(said)
    overlap = len(words & read_words) / max(len(words | read_words), 1)
    named = 0.0
    if fact.object and reading.object and fact.object.casefold() == reading.object.casefold():
        named += 3
    names = [reading.object] if reading.object else []
    names += [term for ends in reading.ends for term in ends.terms]
    if any(_mentions(content, name) for name in names if name):
        named += 2
    if fact.object and _mentions(said, fact.object):
        named += 2
    if named == 0 and overlap < _SAME_WORDS:
        return None
    return named + overlap


def _mentions(text: str, name: str) -> bool:
    words = _WORD.findall(name.casefold())
    return bool(words) and re.search(r"\b" + r"\W+".join(words) + r"\b", text) is not None


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text)) - _COMMON


def _held(fact: CandidateFact, reading: CandidateFact | None) -> CandidateFact:
    if reading is None:
        if fact.predicate and not fact.negated and _NEGATION.search(fact.content):
            # "The user does not eat pork." as `eats pork`: the sentence stands, not the
            # triple that says the opposite.
            return replace(fact, predicate="", object="")
        return fact
    whose = fact.subject.casefold() != reading.subject.casefold()
    flipped = reading.negated and not fact.negated
    tense = (reading.historical and not fact.historical) or (reading.planned and not fact.planned)
    if whose or flipped or tense:
        # The model's sentence says what the statement does not ("The user works at
        # Google"): the rules' own sentence and triple stand instead.
        fact = replace(
            fact,
            content=reading.content,
            subject=reading.subject,
            predicate=reading.predicate,
            object=reading.object,
            negated=reading.negated,
            historical=reading.historical,
            planned=reading.planned,
        )
    elif not fact.predicate and reading.predicate:
        # A change the model left as free text ("The user got a new job at Stripe."): its
        # triple is what reconciles it with the current facts.
        fact = replace(
            fact, predicate=reading.predicate, object=reading.object, negated=reading.negated
        )
    if reading.ends:
        fact = replace(fact, ends=tuple(dict.fromkeys((*fact.ends, *reading.ends))))
    stated = (
        reading.valid_from is not None
        and reading.said_at is not None
        and reading.valid_from != reading.said_at
        and not fact.planned
    )
    if stated:
        fact = replace(fact, valid_from=reading.valid_from)
    return fact
