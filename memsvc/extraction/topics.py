"""An episode's topics: the specific things its statements were about, cased as said.

"We moved to Porto last month" -> "Porto"; "I got a new job at Stripe" -> "Stripe job"; "My
cat Luna passed away" -> "Luna"; "I baked sourdough bread" -> "sourdough bread". Names come
before common nouns, the most mentioned first; a conversation has at most a few. A topic's
words are words of the statement it came from, so a fact's content names them too: erasure
relies on that (storage.erasure.fed_topics) to drop the topics an erased fact alone fed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from spacy.tokens import Span, Token

from memsvc.extraction.predicates import PETS, RELATIVES

# Entity kinds a person looks a conversation up by (spaCy's English labels).
_NAMED = frozenset(
    {"PERSON", "GPE", "LOC", "ORG", "FAC", "EVENT", "WORK_OF_ART", "PRODUCT", "NORP"} | {"LANGUAGE"}
)
# Places and organisations that make a compound with the noun they follow: "a job at
# Stripe" -> "Stripe job", "a trip to Japan" -> "Japan trip" (not people: "dinner with Sara";
# not "in": "a bakery in Porto" is about Porto and a bakery, and Porto stays one topic
# across the conversations that name it).
_COMPOUNDING = frozenset({"GPE", "LOC", "ORG", "FAC", "EVENT"})
_COMPOUNDING_PREPS = frozenset({"at", "to"})
# Nouns that name nothing a person would look a conversation up by, or only a relation
# (the person named beside it is the topic: "my sister Rita" -> "Rita").
_VAGUE = frozenset(
    {"thing", "things", "lot", "time", "way", "bit", "stuff", "kind", "sort", "one", "day"}
    | {"idea", "point", "question", "thanks", "today", "everything", "something", "anything"}
    | {"nothing", "people", "guy", "guys", "fun", "sure", "part", "lol", "haha", "wow", "hey"}
    | {"week", "month", "year", "morning", "evening", "night", "weekend", "while", "moment"}
    | {"name", "life", "friend", "friends", "family", "kid", "kids", "child", "children"}
    | {"someone", "anyone", "everyone", "nobody", "person", "man", "woman", "user"}
)
_SKIPPED_DEPS = frozenset({"det", "poss", "case", "predet", "nummod", "punct", "amod", "advmod"})
_TIME_ENTITIES = frozenset({"DATE", "TIME", "CARDINAL", "ORDINAL", "QUANTITY", "PERCENT"})
# Named topics before common nouns.
NAMED, COMMON = 0, 1
MAX_TOPICS = 4


@dataclass(frozen=True)
class Term:
    """A thing a statement was about: ``display`` as said ("Porto", "sourdough bread")."""

    display: str
    kind: int  # NAMED or COMMON

    @property
    def key(self) -> str:
        return self.display.casefold()


def terms_of(sent: Span, own: Iterable[Token] | None = None) -> list[Term]:
    """The things one sentence (its ``own`` tokens, when it is a clause) is about, in the
    order said."""
    allowed = {t.i for t in (own if own is not None else sent)}
    out: list[Term] = []
    taken: set[int] = set()
    for chunk in sent.noun_chunks:
        root = chunk.root
        if root.i not in allowed or root.i in taken:
            continue
        term = _term(chunk, root, allowed, taken)
        if term is not None:
            out.append(term)
    # Names the chunks did not hold ("Sara's birthday": Sara is a possessive).
    for ent in sent.ents:
        if ent.label_ in _NAMED and all(t.i in allowed and t.i not in taken for t in ent):
            taken.update(t.i for t in ent)
            out.append(Term(_words(list(ent)), NAMED))
    return [t for t in out if t.display]


def _term(chunk: Span, root: Token, allowed: set[int], taken: set[int]) -> Term | None:
    if root.pos_ == "PROPN" or root.ent_type_ in _NAMED:
        if root.ent_type_ in _TIME_ENTITIES:
            return None
        span = _entity_of(root) or [t for t in chunk if t.pos_ == "PROPN" or t.i == root.i]
        taken.update(t.i for t in span)
        return Term(_words(span), NAMED)
    if root.pos_ != "NOUN" or root.ent_type_ in _TIME_ENTITIES:
        return None
    lower = root.lemma_.lower()
    if lower in _VAGUE or root.lower_ in _VAGUE or lower in RELATIVES or lower in PETS:
        return None
    head = [t for t in chunk if t.i in allowed and _compounds_into(t, root)]
    taken.update(t.i for t in head)
    place = _compounding_place(root, allowed)
    if place:
        taken.update(t.i for t in place)
        return Term(f"{_words(place)} {_words(head, lower_common=True)}", NAMED)
    named = any(t.pos_ == "PROPN" for t in head)
    return Term(_words(head, lower_common=True), NAMED if named else COMMON)


def _compounds_into(token: Token, root: Token) -> bool:
    """The root itself, or a word of a compound that ends in it ("Santa Maria hospital")."""
    while token.i != root.i:
        if token.dep_ != "compound" or token.head.i == token.i:
            return False
        token = token.head
    return True


def _compounding_place(root: Token, allowed: set[int]) -> list[Token]:
    """The place or organisation of "a job at Stripe", "a trip to Japan", if any."""
    for prep in root.children:
        if prep.dep_ != "prep" or prep.lower_ not in _COMPOUNDING_PREPS:
            continue
        obj = next((c for c in prep.children if c.dep_ == "pobj"), None)
        if obj is not None and obj.i in allowed and obj.ent_type_ in _COMPOUNDING:
            return _entity_of(obj) or [obj]
    return []


def _entity_of(token: Token) -> list[Token]:
    """The tokens of the named entity holding ``token``, without a leading "the"."""
    for ent in token.doc.ents:
        if ent.start <= token.i < ent.end:
            return [t for t in ent if t.dep_ not in ("det", "case") and t.lower_ != "the"]
    return []


def _words(tokens: Sequence[Token], *, lower_common: bool = False) -> str:
    """The words as said; a common noun keeps no capital it has only for starting the
    sentence ("Bread is…" -> "bread")."""
    words = [
        t.lower_ if lower_common and t.pos_ != "PROPN" else t.text
        for t in tokens
        if t.dep_ not in _SKIPPED_DEPS or t.pos_ == "PROPN"
        if not t.is_punct and t.lower_ not in ("the", "a", "an")
    ]
    return " ".join(words).replace(" 's", "").replace(" - ", "-").strip()


def fallback_terms(mentions: Sequence[tuple[str, int, str]]) -> list[Term]:
    """Terms of a conversation none of whose sentences gave a fact: its noun chunks
    (episodes.subject_mentions: key, weight, display), a name where a word is capitalized
    past the sentence start (the mentions keep only such capitals)."""
    return [
        Term(display, NAMED if any(w[:1].isupper() for w in display.split()) else COMMON)
        for _, _, display in mentions
    ]


def rank(
    terms: Sequence[Term], *, leave_out: Iterable[str] = (), limit: int = MAX_TOPICS
) -> tuple[str, ...]:
    """The ``limit`` topics of a conversation: names first, then the most mentioned, then
    the first mentioned; a common noun a named topic already holds ("job" beside "Stripe
    job") and the speaker's own name (``leave_out``) are not topics of their own."""
    left_out = {w.casefold() for w in leave_out if w}
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    shown: dict[str, Term] = {}
    for position, term in enumerate(terms):
        if term.key in left_out:
            continue
        counts[term.key] = counts.get(term.key, 0) + 1
        first.setdefault(term.key, position)
        shown.setdefault(term.key, term)
    named_words = {w for k, t in shown.items() if t.kind == NAMED for w in k.split()}
    keys = [k for k, t in shown.items() if t.kind == NAMED or not set(k.split()) <= named_words]
    keys.sort(key=lambda k: (shown[k].kind, -counts[k], first[k]))
    return tuple(shown[k].display for k in keys[:limit])
