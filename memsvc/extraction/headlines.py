"""An episode's title: the gist of its most telling statement, as a cased noun phrase.

"We moved to Porto last month" -> "Moving to Porto"; "My cat Luna passed away this morning"
-> "Luna passing away"; "I don't work at Google anymore" -> "No longer working at Google";
"I said Boston earlier but I meant Austin" -> "Correcting Boston to Austin".
With the speaker's name (when the caller sent one): "Dana's move to Porto", "Dana's cat Luna
passing away", "Dana no longer working at Google". The words are the speaker's own, with
their casing (names stay capitalized); times are left out (the episode has its dates), and so
are hedges and fillers.
"""

from __future__ import annotations

import functools

from lemminflect import getInflection
from spacy.tokens import Span, Token

from memsvc.extraction.changes import said_before, said_then_taken_back
from memsvc.extraction.sentences import (
    FIRST_PLURAL,
    FIRST_SINGULAR,
    Statement,
    clause_roots,
    is_negated,
    lemma,
)

# What follows the verb in a title: its objects, complements and prepositional phrases.
_KEPT = frozenset({"dobj", "prep", "prt", "attr", "acomp", "xcomp", "dative", "oprd", "agent"})
# Words a title does without ("I just got", "I finally sold").
_FILLERS = frozenset({"just", "finally", "actually", "really", "so", "very", "also", "too"})
_FILLERS |= frozenset({"already", "still", "even", "anymore", "longer", "again", "now", "here"})
_FILLERS |= frozenset({"no", "not", "n't", "never"})
# Verbs of liking: the title is what is liked ("I love hiking in the Alps" -> "Hiking in
# the Alps"), not "Loving hiking".
_LIKING = frozenset({"like", "love", "enjoy", "adore", "prefer"})
_ENDED = frozenset({"anymore", "longer"})
_TIME_ENTITIES = frozenset({"DATE", "TIME"})
# Subjects that point back or name no one: no title of their own.
_POINTING = frozenset({"it", "this", "that", "they", "there", "these", "those", "what", "which"})
_SUBJECTS = frozenset({"nsubj", "nsubjpass"})
_MAX_WORDS = 9
_MIN_WORDS = 2
# Verbs whose event has a noun of its own, for a title with the speaker's name: "Dana's move
# to Porto" rather than "Dana moving to Porto". A closed list: English derivation is a
# lexicon question (move -> move, retire -> retirement), and a verb not listed reads well
# as a gerund.
_EVENT_NOUNS = {
    "move": "move",
    "relocate": "relocation",
    "retire": "retirement",
    "graduate": "graduation",
    "visit": "visit",
    "return": "return",
    "switch": "switch",
    "transfer": "transfer",
    "trip": "trip",
    "travel": "travels",
    "divorce": "divorce",
    "recover": "recovery",
    "arrive": "arrival",
    "hike": "hike",
    "climb": "climb",
}


def headline(statement: Statement, speaker: str = "") -> str | None:
    """The statement as a title: its first clause that makes one ("I got a new job at
    Stripe, I start Monday" -> "Getting a new job at Stripe"), or None (a command, a
    sentence about "it", a bare verb). ``speaker``: the speaker's name, when known ("Dana
    getting a new job at Stripe")."""
    if statement.imperative:
        return None
    own = {t.i for t in statement.words()}
    roots = sorted([statement.root, *clause_roots(statement)], key=lambda t: t.i)
    for root in roots:
        if said_then_taken_back(root, statement.sent):
            continue  # "I said Boston earlier": the "but I meant Austin" says what it was
        allowed = {t.i for t in root.subtree} & own
        for other in roots:
            if other.i != root.i and other.i in allowed:
                allowed -= {t.i for t in other.subtree}
        title = _clause_title(root, allowed, dict(statement.refs), speaker, statement.sent)
        if title is not None:
            return title
    return None


def _clause_title(
    root: Token, allowed: set[int], refs: dict[int, str], speaker: str, sent: Span
) -> str | None:
    if root.pos_ not in ("VERB", "AUX"):
        return None
    who = _who(root, allowed, refs, speaker)
    if who is None:
        return None
    verb = lemma(root)
    negated = is_negated(root)
    if verb == "mean" and not negated and (said := said_before(root, sent)) is not None:
        # "… but I meant Austin": a correction of what was said.
        meant = next((c for c in root.children if c.dep_ in ("dobj", "attr")), None)
        if meant is not None:
            words = [_word(t, speaker) for t in _phrase(meant, allowed)]
            return _title([*who, "correcting", said.text, "to", *words]) if words else None
    if verb in _LIKING and not negated:
        # What is liked is the title, whoever likes it ("Hiking in the Alps").
        liked = next((c for c in root.children if c.dep_ in ("dobj", "xcomp")), None)
        words = [_word(t, speaker) for t in _phrase(liked, allowed)] if liked is not None else []
        return _title(words) if words else None
    head = _gerund(verb)
    if head is None:
        return None
    tail: list[str] = []
    for child in root.children:
        purpose = child.dep_ == "advcl" and any(c.lower_ == "to" for c in child.children)
        if child.i > root.i and (child.dep_ in _KEPT or purpose) and child.i in allowed:
            tail.extend(_word(t, speaker) for t in _phrase(child, allowed))
    if not tail and verb in ("be", "have", "do", "get"):
        return None  # "Being", "Having": says nothing
    if verb == "be" and any(c.ent_type_ == "PERSON" for c in root.children if c.dep_ == "attr"):
        return None  # "I'm Dana": a name, not what the conversation was about
    noun = _EVENT_NOUNS.get(verb)
    prepositional = all(c.dep_ != "dobj" for c in root.children if c.i in allowed)
    if who == [speaker] and speaker and noun and not negated and tail and prepositional:
        return _title([f"{speaker}'s", noun, *tail])  # "Dana's move to Porto"
    words = [*who, head, *tail]
    if negated:
        ended = any(root.doc[i].lower_ in _ENDED for i in allowed)
        words.insert(len(who), "no longer" if ended else "not")
    if len(words) < _MIN_WORDS:
        return None
    return _title(words)


def _who(root: Token, allowed: set[int], refs: dict[int, str], speaker: str) -> list[str] | None:
    """The title's subject: the speaker's name, or nothing when it is not known; a name (or
    "the user's sister") for someone else; None when it points back unresolved ("it",
    "they")."""
    subj = next((c for c in root.children if c.dep_ in _SUBJECTS), None)
    if subj is None or subj.lower_ in FIRST_SINGULAR | FIRST_PLURAL:
        # "Just got back from Paris", "We moved to Porto": the speaker.
        return [speaker] if speaker else []
    if subj.i in refs:
        return _named(refs[subj.i].split(), speaker)
    if subj.lower_ in _POINTING or subj.pos_ == "PRON":
        return None
    phrase = [t for t in subj.subtree if t.i in allowed and not t.is_punct]
    names = [t.text for t in phrase if t.pos_ == "PROPN"]
    if names and not any(t.dep_ == "conj" for t in phrase):
        if speaker and any(t.lower_ in ("my", "our") for t in phrase):
            return [_word(t, speaker) for t in phrase]  # "Dana's cat Luna"
        return names  # "My cat Luna" -> "Luna"
    return [_word(t, speaker) for t in phrase]


def _named(relation: list[str], speaker: str) -> list[str]:
    """ "user's sister Rita" -> ["Rita"] (with the speaker's name: ["Dana's", "sister",
    "Rita"]); "user's mom" -> ["the user's", "mom"]."""
    if relation and relation[0] == "user's":
        relation = relation[1:]
        if speaker:
            return [f"{speaker}'s", *relation]
        named = [w for w in relation if w[:1].isupper()]
        return named or ["the user's", *relation]
    return relation


def _phrase(token: Token, allowed: set[int]) -> list[Token]:
    """The token's subtree within the clause, without times, fillers, punctuation and
    embedded clauses."""
    out: list[Token] = []
    # A time that is the object is the thing itself ("had a bad day", "I'm 43").
    times_are_words = token.dep_ in ("dobj", "attr") and token.ent_type_ in _TIME_ENTITIES
    # "Austin, not Boston", "43, not 34": the value taken back is no part of the title.
    denied = {
        d.i
        for t in token.subtree
        if t.dep_ in ("appos", "conj") and _after_not(t)
        for d in t.subtree
    }
    for t in token.subtree:
        timed = t.ent_type_ in _TIME_ENTITIES and not times_are_words
        if t.i not in allowed or t.i in denied or timed or t.is_punct or t.is_space:
            continue
        if t.lower_ in _FILLERS or (
            t.i != token.i and t.dep_ in ("relcl", "advcl", "ccomp", "npadvmod")
        ):
            continue
        if any(a.dep_ in ("relcl", "advcl", "ccomp", "npadvmod") for a in _heads(t, token)):
            continue
        out.append(t)
    # A phrase ends at a preposition left without its object (its object was a time).
    while out and out[-1].dep_ in ("prep", "cc", "det"):
        out.pop()
    return out


def _after_not(token: Token) -> bool:
    """ "not Boston": the token's own "not", or one just before it (spaCy hangs it on either
    side)."""
    if any(c.dep_ == "neg" for c in token.children):
        return True
    return token.i > 0 and token.doc[token.i - 1].dep_ == "neg"


def _heads(token: Token, stop: Token) -> list[Token]:
    """The token's heads up to (not including) ``stop``."""
    chain = []
    while token.i != stop.i and token.head.i not in (token.i, stop.i):
        token = token.head
        chain.append(token)
    return chain


def _word(token: Token, speaker: str = "") -> str:
    """A token as a title says it: "my" reads "the user's" (or "Dana's")."""
    lower = token.lower_
    if lower in ("my", "our", "mine", "ours"):
        return f"{speaker}'s" if speaker else "the user's"
    if lower in ("i", "me", "us", "we", "myself", "ourselves"):
        return speaker or "the user"
    return token.text


@functools.lru_cache(maxsize=4096)
def _gerund(verb: str) -> str | None:
    """ "move" -> "moving", "get" -> "getting" (lemminflect's spelling rules)."""
    if verb == "be":
        return "being"
    found = getInflection(verb, tag="VBG")
    return str(found[0]) if found else None


def _title(words: list[str]) -> str:
    """The words as a title: at most _MAX_WORDS, the first capitalized, the rest as said."""
    text = " ".join(w for w in words if w).split()[:_MAX_WORDS]
    joined = " ".join(text).replace(" 's", "'s").replace(" n't", "n't").strip(" ,;:-")
    return joined[:1].upper() + joined[1:]
