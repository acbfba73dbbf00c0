"""Which sentences of a turn state something about the speaker, and how they read standalone.

A statement becomes a fact in the third person ("I went there yesterday" said on 8 May 2023 ->
"The user went there on 7 May 2023."), with its time, negation and modality (plan, past)
read off spaCy's dependency parse. Questions, requests to the assistant, talk about the other
party and sentences with nothing in them but feelings about the conversation yield nothing.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from lemminflect import getInflection, getLemma
from spacy.tokens import Span, Token

from memsvc.extraction.assertions import (
    asserted_clause,
    hypothetical,
    reported,
    sarcastic,
    stated_reason,
    told_clause,
)
from memsvc.extraction.coref import PRONOUNS, Mentions
from memsvc.extraction.dates import ResolvedDate, day_text, is_relative, resolve
from memsvc.extraction.predicates import PETS, RELATIVES, REQUEST_VERBS
from memsvc.governance.placeholders import placeholder_spans

FIRST_SINGULAR = frozenset({"i", "me", "my", "mine", "myself"})
FIRST_PLURAL = frozenset({"we", "us", "our", "ours", "ourselves"})
SECOND = frozenset({"you", "your", "yours", "yourself", "yourselves", "ya", "u", "y'all"})
# Nouns too general to make a sentence informative by themselves.
_GENERIC = frozenset(
    {
        "thing",
        "lot",
        "time",
        "way",
        "bit",
        "stuff",
        "kind",
        "sort",
        "one",
        "idea",
        "point",
        "question",
        "thanks",
        "today",
        "day",
        "everything",
        "something",
        "anything",
        "nothing",
        "lol",
        "haha",
        "wow",
    }
)
_FAMILY_WORDS = frozenset(
    {"kid", "kids", "child", "children", "family", "husband", "wife", "partner", "son"}
    | {"daughter", "daughters", "sons", "dog", "cat", "puppy", "parents", "mom", "dad"}
)
_UNIT = re.compile(r"(?:second|minute|hour|day|night|week|month|year|decade)s?$", re.I)
_PREPOSITIONS = frozenset({"on", "in", "by", "since", "until", "from", "during", "at", "over"})
_DURATION = re.compile(
    r"\b(?:\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|a few"
    r"|several|many|couple of) (?:days?|weeks?|months?|years?|decades?)\b",
    re.IGNORECASE,
)
# An attempt to instruct the system through what it remembers: a closed set of phrasings.
INJECTION = re.compile(
    r"\b(?:ignore|disregard|forget) (?:all |any |the |your )*(?:previous|prior|above|earlier"
    r"|system)? ?(?:instructions|prompts?|rules|messages)\b|\bsystem prompt\b|\bdeveloper mode\b"
    r"|\bjailbreak|\byou are now\b|\bact as (?:an? )?(?:admin|administrator|root|developer)"
    r"|\bi(?:'m| am) (?:the|an|your) (?:admin|administrator|owner|developer|creator|root"
    r"|superuser|operator)\b|\b(?:admin|root|sudo|superuser) (?:access|privileges|rights|mode)\b"
    # Rules for the memory itself: "new rule: …", "every fact you store about me must …".
    r"|\bnew (?:rules?|instructions?)\s*:"
    r"|\b(?:every|each|all|any) (?:facts?|memor(?:y|ies)|things?|notes?) (?:that )?(?:you|u) "
    r"(?:store|save|record|keep|write|remember)(?: about (?:me|us|the user))? (?:must|should"
    r"|shall|will|has to|have to|needs? to)\b",
    re.IGNORECASE,
)
_REMEMBER = re.compile(
    r"^(?:please |could you |can you |i want you to |i need you to )?(?:remember|note|keep in mind"
    r"|don't forget|do not forget|never forget)(?: that)?[,:]?\s+",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Statement:
    """One sentence about the speaker, analysed."""

    sent: Span
    root: Token
    subject: str  # "user", "user's mom", "user's wife Ana"
    negated: bool
    planned: bool
    historical: bool
    dates: tuple[tuple[Span, ResolvedDate], ...]
    explicit: bool  # "remember that …"
    # "Call me Liz": an imperative that still says something about the speaker; only its
    # triples are facts, never its own words.
    imperative: bool = False
    # The clause's own words (token indices) when the sentence holds several statements;
    # None: the whole sentence.
    tokens: frozenset[int] | None = None
    # Pronouns resolved to whom they name (token index -> "user's sister Rita").
    refs: tuple[tuple[int, str], ...] = ()

    def words(self) -> list[Token]:
        """The statement's own tokens, in order."""
        if self.tokens is None:
            return list(self.sent)
        return [t for t in self.sent if t.i in self.tokens]


# Spoken transcripts drop the subject of a sentence that starts with these ("Gonna continue my
# studies", "Just got back from Paris"): a closed set of openings, so a pattern is enough.
_DROPPED_SUBJECT = re.compile(
    r"(^|[.!?]\s+)(gonna|going to|planning to|hoping to|trying to|thinking (?:of|about)"
    r"|looking forward to)\b",
    re.IGNORECASE,
)
_DROPPED_SUBJECT_PAST = re.compile(
    r"(^|[.!?]\s+)((?:just )?(?:got|went|finished|started|joined|signed up|took|had|made"
    r"|bought|moved|ran|visited))\b",
    re.IGNORECASE,
)
_GONNA = re.compile(r"\bgonna\b", re.IGNORECASE)
_WANNA = re.compile(r"\bwanna\b", re.IGNORECASE)


# Typed and transcribed first person without its apostrophe or capital ("im", "ive", "i").
_BARE_I = re.compile(r"\b(?:(?P<im>im)|(?P<ive>ive)|(?P<i>i))\b(?=\s)", re.IGNORECASE)
_BEEN = re.compile(r"(^|[.!?]\s+)been\b", re.IGNORECASE)


def _bare_i(match: re.Match[str]) -> str:
    if match["im"]:
        return "I'm"
    if match["ive"]:
        return "I've"
    return "I" if match["i"] in ("i", "I") else match[0]


def restore_subject(text: str) -> str:
    """Put back the "I" a spoken sentence dropped ("gonna" read as "going to")."""
    text = _BARE_I.sub(_bare_i, text)
    text = _BEEN.sub(lambda m: m.group(1) + "I've been", text)
    text = _DROPPED_SUBJECT.sub(lambda m: m.group(1) + "I'm " + m.group(2).lower(), text)
    text = _DROPPED_SUBJECT_PAST.sub(lambda m: m.group(1) + "I " + m.group(2).lower(), text)
    return _WANNA.sub("want to", _GONNA.sub("going to", text))


def remember_request(text: str) -> str | None:
    """The statement inside an explicit "remember that …" request, else None."""
    match = _REMEMBER.match(text.strip())
    return text.strip()[match.end() :] if match else None


def _lower(token: Token) -> str:
    return token.lower_.replace("\u2019", "'")


def lemma(token: Token) -> str:
    """The lower-case lemma; verbs by lemminflect, which spaCy's lookup gets wrong at times
    ("hates" -> "hat")."""
    if token.pos_ in ("VERB", "AUX"):
        return _verb_lemma(token.lower_) or token.lemma_.lower()
    return token.lemma_.lower()


@functools.lru_cache(maxsize=8192)
def _verb_lemma(word: str) -> str:
    found = getLemma(word, upos="VERB")
    return str(found[0]).lower() if found else ""


def is_question(sent: Span) -> bool:
    return sent.text.rstrip().endswith("?")


def is_request(sent: Span) -> bool:
    """An imperative addressed to the assistant ("book me a table", "call me tomorrow")."""
    first = next((t for t in sent if t.pos_ not in ("INTJ", "PUNCT", "SPACE")), None)
    root = sent.root
    if first is None:
        return True
    if _lower(first) in ("please", "let", "kindly"):
        return True
    has_subject = any(c.dep_ in ("nsubj", "nsubjpass", "expl") for c in root.children)
    return root.tag_ == "VB" and not has_subject and first.i == root.i


def mentions_addressee(sent: Span) -> bool:
    return any(_lower(t) in SECOND for t in sent)


def first_person(sent: Span) -> bool:
    return any(_lower(t) in FIRST_SINGULAR or _lower(t) in FIRST_PLURAL for t in sent)


def _vocative(t: Token) -> bool:
    """The other speaker addressed by name: "Caroline, …" or "…, Mel!"."""
    if t.ent_type_ != "PERSON":
        return False
    sent = t.sent
    prev = t.doc[t.i - 1] if t.i > sent.start else None
    nxt = t.doc[t.i + 1] if t.i + 1 < sent.end else None
    return (prev is None or prev.is_punct or prev.pos_ == "INTJ") and (nxt is None or nxt.is_punct)


# Verbs of talk about the conversation itself ("I agree", "I know", "I can't wait").
_CHATTER = frozenset(
    {"agree", "know", "see", "guess", "mean", "think", "hope", "wish", "wait", "understand"}
    | {"get", "bet", "suppose", "believe", "feel", "miss", "remember", "forget", "say"}
    | {"tell", "ask", "wonder", "imagine", "appreciate", "try", "do", "have", "be", "go"}
    | {"come", "want", "need", "thank", "hear", "admit", "promise", "swear", "love", "like"}
    | {"bet", "figure", "totally", "look", "sound", "seem", "make", "let", "care", "glad"}
)
# Adjectives of the moment, not traits ("I'm so happy" says nothing lasting).
_MOODS = frozenset(
    {"happy", "glad", "sad", "sorry", "excited", "thrilled", "grateful", "thankful", "sure"}
    | {"good", "great", "fine", "okay", "ok", "tired", "busy", "ready", "proud", "lucky"}
    | {"blessed", "stoked", "curious", "interested", "amazed", "impressed", "honored"}
    | {"nervous", "worried", "scared", "afraid", "bored", "here", "back", "down", "up"}
    | {"right", "wrong", "alright", "inspired", "touched", "jealous", "relieved", "pumped"}
    | {"psyched", "eager", "keen", "determined", "motivated", "overwhelmed", "awesome"}
    | {"hungry", "thirsty", "sleepy", "cold", "hot", "sick", "ill", "full", "late", "early"}
    | {"home", "out", "off", "on", "free", "available", "confused", "lost", "done", "stuck"}
)


def informative(
    sent: Span,
    tokens: Sequence[Token] | None = None,
    root: Token | None = None,
    *,
    theirs: bool = False,
) -> bool:
    """Something that stands: a thing, a name, a place, a number, a deed ("I don't smoke")
    or a trait ("I'm left-handed"), beyond pronouns, generic nouns and moods. `tokens` and
    `root`: one clause of the sentence."""
    for t in sent if tokens is None else tokens:
        proper = t.pos_ in ("PROPN", "NUM") and not t.is_stop and not _vocative(t)
        if proper and _lower(t) not in _MOODS:
            return True
        if t.ent_type_ in ("NORP", "GPE", "ORG", "LOC", "FAC", "EVENT", "LANGUAGE"):
            return True
        if t.pos_ == "NOUN" and lemma(t) not in _GENERIC and not t.is_stop:
            return True
    root = sent.root if root is None else root
    if not theirs and not any(_lower(c) in FIRST_SINGULAR | FIRST_PLURAL for c in root.children):
        return False
    if root.pos_ == "VERB" and lemma(root) not in _CHATTER:
        return True
    if lemma(root) in ("love", "like", "enjoy", "hate", "prefer") and any(
        c.dep_ in ("xcomp", "dobj") and c.tag_ == "VBG" for c in root.children
    ):
        return True  # "I love hiking"
    return lemma(root) == "be" and any(
        c.dep_ in ("acomp", "attr") and c.pos_ == "ADJ" and _lower(c) not in _MOODS
        for c in root.children
    )


def subject_of(sent: Span, root: Token, mentions: Mentions | None = None) -> str:
    """Whom the clause is about: "user", someone of theirs ("user's wife Ana", "user's
    sister's husband"), another person by name ("Rita"), or "" (someone or something else,
    or a pronoun that names no one the turn mentioned). Only the speaker is ever "user"
    ("You can call me Dr. Okafor" is about the speaker)."""
    mentions = mentions or Mentions()
    if _calls_me(root):
        return "user"
    subj = next((c for c in root.children if c.dep_ in ("nsubj", "nsubjpass")), None)
    if subj is None and root.dep_ in ("conj", "xcomp"):
        subj = next((c for c in root.head.children if c.dep_ in ("nsubj", "nsubjpass")), None)
    if subj is None:
        return "user"
    word = _lower(subj)
    if word in FIRST_SINGULAR | FIRST_PLURAL:
        return "user"
    if any(c.dep_ == "conj" and _lower(c) in FIRST_SINGULAR | FIRST_PLURAL for c in subj.children):
        return "user"  # "my wife and I"
    if word in PRONOUNS:
        found = mentions.resolve(subj)
        return found.subject if found is not None else ""
    if subj.pos_ == "PROPN":
        found = mentions.named(subj.text)
        return found.subject if found is not None else subj.text
    if subj.pos_ != "NOUN":
        return ""
    owner = mentions.owner(subj)
    if owner is None:
        return ""
    relation = lemma(subj) if subj.tag_ == "NNS" else subj.lower_
    compound = " ".join(c.lower_ for c in subj.children if c.dep_ == "compound")
    relation = f"{compound} {relation}" if compound else relation
    name = next((c for c in subj.children if c.dep_ == "appos" and c.pos_ == "PROPN"), None)
    if name is None and (relation in RELATIVES or relation in PETS):
        known = next((r for r in reversed(mentions.seen) if r.at == subj.i and r.name), None)
        return known.subject if known is not None else f"{owner}'s {relation}"
    return f"{owner}'s {relation}" + (f" {name.text}" if name is not None else "")


_VALUES = frozenset({"attr", "acomp", "dobj", "npadvmod", "appos", "oprd", "prep", "pobj"})


def contrastive(neg: Token) -> bool:
    """The "not" of "X, not Y" ("I'm a nurse now, not a teacher", "I'm 34 not 43"): it
    denies Y, not the clause."""
    head = neg.head
    if neg.i <= head.i:
        return False
    if neg.i > 0 and neg.doc[neg.i - 1].text in (",", ";", "-"):
        return True
    if neg.i + 1 >= len(neg.doc):
        return False
    after = neg.doc[neg.i + 1]
    value = after if after.head.i == head.i else after.head  # "not a teacher": its det
    earlier = any(c.dep_ in _VALUES and c.i < neg.i for c in head.children)
    return earlier and value.head.i == head.i and value.dep_ in _VALUES


def is_negated(head: Token) -> bool:
    for c in head.children:
        if c.dep_ == "neg" and contrastive(c):
            continue
        if c.dep_ == "neg" or _lower(c) in ("never", "nobody", "noone", "none"):
            return True
        if (c.dep_ == "nsubj" and _lower(c) in ("no", "nothing")) or _lower(c) == "no-one":
            return True
        if _lower(c) == "longer" and any(_lower(g) == "no" for g in c.children):
            return True
    return False


_FUTURE_AUX = frozenset({"will", "'ll", "wo", "shall", "gonna"})
_PLAN_VERBS = frozenset({"plan", "hope", "intend", "aim", "want", "wish", "decide", "consider"})


def is_planned(
    root: Token, dates: tuple[tuple[Span, ResolvedDate], ...], sent_at: datetime
) -> bool:
    """A plan or a future: "will", "going to", "planning to", a progressive with a future
    date, or any date after the time of speaking."""
    aux = {_lower(c) for c in root.children if c.dep_ in ("aux", "auxpass")}
    if aux & _FUTURE_AUX:
        return True
    lem = lemma(root)
    xcomp = any(c.dep_ == "xcomp" for c in root.children)
    if lem in _PLAN_VERBS and xcomp:
        return True
    if lem == "go" and root.tag_ == "VBG" and xcomp:
        return True
    if lem == "like" and "'d" in aux | {"would"} and ("'d" in aux or "would" in aux):
        return True
    if any(d.when.date() > sent_at.date() for _, d in dates):
        return True
    # "I'm moving to Tokyo": a move in the progressive is a plan until it is done.
    return lem in ("move", "relocate") and root.tag_ == "VBG"


def is_historical(root: Token) -> bool:
    """ "I used to …" (the habit is over)."""
    return lemma(root) == "use" and any(
        c.dep_ == "xcomp" and any(a.lower_ == "to" for a in c.children) for c in root.children
    )


def _looks_ahead(ent: Span, future: bool) -> bool:
    """Whether a bare weekday or month in this phrase is the next one: a plan, or a verb in
    the present ("I start on Monday", "my birthday is in March"); never after "since", never
    with a past or perfect verb."""
    before = ent.doc[ent.start - 1] if ent.start > ent.sent.start else None
    if before is not None and _lower(before) == "since":
        return False
    head = ent.root.head
    while head.pos_ not in ("VERB", "AUX") and head.head.i != head.i:
        head = head.head
    aux = [c for c in head.children if c.dep_ in ("aux", "auxpass")]
    if head.tag_ in ("VBD", "VBN") or any(a.tag_ == "VBD" for a in aux):
        return False
    return future or head.tag_ in ("VBP", "VBZ", "VBG", "VB", "MD")


def date_mentions(
    sent: Span, sent_at: datetime, *, future: bool = False
) -> tuple[tuple[Span, ResolvedDate], ...]:
    """The sentence's relative DATE/TIME entities, resolved against the time of speaking.

    A phrase takes the "in" before it when spaCy left it out ("in" + "two weeks"), and drops
    numbers before its relative part ("30 next week": "30" is an age, not a date)."""
    doc = sent.doc
    found: list[tuple[Span, ResolvedDate]] = []
    for ent in sent.ents:
        if ent.label_ not in ("DATE", "TIME"):
            continue
        start = ent.start
        while (
            start < ent.end - 1
            and doc[start].like_num
            and not _UNIT.match(doc[start + 1].text)
            and is_relative(doc[start + 1 : ent.end].text)
        ):
            start += 1
        span = doc[start : ent.end]
        before = doc[start - 1] if start > sent.start else None
        if (
            before is not None
            and _lower(before) in ("in", "within")
            and not span.text.lower().startswith("in ")
        ):
            span = doc[start - 1 : ent.end]
        resolved = resolve(span.text, sent_at, future=_looks_ahead(ent, future))
        if resolved is not None:
            found.append((span, resolved))
    return tuple(found)


def _calls_me(root: Token) -> bool:
    return lemma(root) == "call" and any(
        _lower(c) == "me" for c in root.children if c.dep_ == "dobj"
    )


def asks_assistant(root: Token) -> bool:
    """ "I want to book a table", "I'd like to cancel my order", "I need to change my
    address": a request to the assistant phrased as a wish."""
    if lemma(root) not in ("want", "like", "need", "wanna", "love"):
        return False
    action = next((c for c in root.children if c.dep_ == "xcomp"), None)
    return action is not None and lemma(action) in REQUEST_VERBS


def analyse(
    sent: Span, sent_at: datetime, *, explicit: bool = False, mentions: Mentions | None = None
) -> Statement | None:
    """The statement a sentence makes about its speaker (or someone of theirs), or None when
    it asserts none: a question or request (unless it gives a reason about the speaker:
    "Since I'm vegan, can you …"), a hypothetical or wish, someone else's reported words,
    sarcasm with an obvious marker. `mentions`: the people and pets the turn named so far
    (this sentence's included), for its pronouns."""
    mentions = mentions or Mentions()
    root = sent.root
    calls_me = _calls_me(root)
    if sarcastic(sent) or reported(sent, FIRST_SINGULAR | FIRST_PLURAL):
        return None
    if hypothetical(sent):
        # The wish or condition yields nothing; a clause beside it that is asserted does.
        kept = asserted_clause(sent, FIRST_SINGULAR | FIRST_PLURAL)
        if kept is None:
            return None
        own = frozenset(t.i for t in kept.subtree if not t.is_punct)
        return _clause(sent, kept, sent_at, explicit, mentions, own)
    imperative = not explicit and (is_request(sent) or calls_me)
    if (
        is_question(sent)
        or (mentions_addressee(sent) and not calls_me)
        or (imperative and not calls_me)
        or asks_assistant(root)
    ):
        reason = stated_reason(sent)
        if reason is None and not is_question(sent) and not imperative:
            reason = told_clause(sent, FIRST_SINGULAR | FIRST_PLURAL)
        if reason is None:
            return None
        # Without its framing for the listener ("I have to tell you, …").
        framing = {
            w.i
            for c in reason.children
            if any(_lower(t) in SECOND for t in c.subtree)
            for w in c.subtree
        }
        if framing:
            # "Just so you know, …": the words that lead into it go with it.
            framing |= {
                c.i
                for c in reason.children
                if c.i < min(framing) and c.dep_ in ("advmod", "punct", "intj")
            }
        own = frozenset(
            t.i
            for t in reason.subtree
            if not (t.dep_ == "mark" and t.head.i == reason.i) and t.i not in framing
        )
        return _clause(sent, reason, sent_at, explicit, mentions, own)
    subject = subject_of(sent, root, mentions)
    theirs = subject.startswith("user's")
    if not (first_person(sent) or theirs) or not (imperative or informative(sent, theirs=theirs)):
        return None
    dates = date_mentions(sent, sent_at)
    planned = is_planned(root, dates, sent_at)
    if planned and dates:
        dates = date_mentions(sent, sent_at, future=True)
    return Statement(
        sent=sent,
        root=root,
        subject=subject,
        negated=is_negated(root),
        planned=planned,
        historical=is_historical(root),
        dates=dates,
        explicit=explicit,
        imperative=imperative,
        refs=_refs(sent, mentions),
    )


def _refs(sent: Span, mentions: Mentions) -> tuple[tuple[int, str], ...]:
    """The sentence's third-person pronouns that name someone of the user's."""
    found: list[tuple[int, str]] = []
    for t in sent:
        if _lower(t) not in PRONOUNS:
            continue
        ref = mentions.resolve(t)
        if ref is not None and ref.subject.startswith("user's"):
            found.append((t.i, ref.subject))
    return tuple(found)


def _clause(
    sent: Span,
    root: Token,
    sent_at: datetime,
    explicit: bool,
    mentions: Mentions,
    tokens: frozenset[int] | None,
) -> Statement:
    dates = tuple(d for d in date_mentions(sent, sent_at) if tokens is None or d[0].start in tokens)
    planned = is_planned(root, dates, sent_at)
    if planned and dates:
        dates = tuple(
            d
            for d in date_mentions(sent, sent_at, future=True)
            if tokens is None or d[0].start in tokens
        )
    return Statement(
        sent=sent,
        root=root,
        subject=subject_of(sent, root, mentions),
        negated=is_negated(root),
        planned=planned,
        historical=is_historical(root),
        dates=dates,
        explicit=explicit,
        tokens=tokens,
        refs=_refs(sent, mentions),
    )


_THIRD_PERSON = frozenset({"it", "that", "this", "they", "he", "she", "them", "there", "here"})
_THIRD_PERSON |= frozenset({"these", "those", "which", "what", "who"})


def salience(statement: Statement) -> int:
    """How much a sentence tells that stands on its own: the speaker as the subject, names,
    places, dates and numbers raise it; a subject that points back ("it", "they") lowers it."""
    sent, root = statement.sent, statement.root
    subj = next((c for c in root.children if c.dep_ in ("nsubj", "nsubjpass", "expl")), None)
    score = 0
    if subj is not None and (
        _lower(subj) in FIRST_SINGULAR | FIRST_PLURAL or statement.subject != "user"
    ):
        score += 2
    elif subj is not None and _lower(subj) in _THIRD_PERSON:
        score -= 2
    score += sum(1 for e in sent.ents if e.label_ not in ("PERSON", "CARDINAL", "ORDINAL"))
    score += 2 * len(statement.dates)
    if root.tag_ in ("VBD", "VBN"):
        score += 1
    return score


_CLAUSE_DEPS = frozenset({"ROOT", "conj", "ccomp", "parataxis", "advcl"})


# A clause that is what these verbs think or say is part of their statement, never one of
# its own ("I think pineapple belongs on pizza").
_CONTENT_VERBS = frozenset(
    {"think", "believe", "feel", "guess", "know", "say", "suppose", "hope"}
    | {"reckon", "realize", "realise", "find", "figure", "swear", "doubt", "wonder", "bet"}
)
# Pro-forms that point back into their own sentence ("I don't live in Paris, I just work
# there"): a clause holding one does not stand alone.
_POINTERS = frozenset({"there", "that", "this", "it", "those", "these"})


def clause_roots(statement: Statement) -> list[Token]:
    """Further clauses with a subject of their own ("I'm not vegan anymore, I eat eggs now")."""
    return [
        token
        for token in statement.words()
        if token.i != statement.root.i
        and token.dep_ in _CLAUSE_DEPS
        and token.pos_ in ("VERB", "AUX")
        and not (token.dep_ == "ccomp" and lemma(token.head) in _CONTENT_VERBS)
        and (any(c.dep_ in ("nsubj", "nsubjpass") for c in token.children) or _calls_me(token))
    ]


def _points_back(tokens: frozenset[int], statement: Statement) -> bool:
    """Whether a clause's words hold a pro-form the turn did not resolve."""
    resolved = {i for i, _ in statement.refs}
    return any(
        t.i in tokens
        and _lower(t) in _POINTERS
        and t.pos_ in ("PRON", "ADV")
        # "there is"; a pointing subject ("it was a misdiagnosis") leaves its clause about
        # no one, and such a clause is no fact of its own anyway.
        and t.dep_ not in ("expl", "nsubj", "nsubjpass")
        and t.i not in resolved
        for t in statement.sent
    )


def _own_tokens(root: Token, allowed: set[int], others: list[Token]) -> frozenset[int]:
    own = {t.i for t in root.subtree} & allowed
    for other in others:
        if other.i != root.i and other.i in own:
            own -= {t.i for t in other.subtree}
    # The "and" / "but" / "because" that joined a clause away is no word of this one.
    for t in root.doc[min(own) : max(own) + 1] if own else ():
        if t.i in own and t.dep_ in ("cc", "mark", "punct") and t.i + 1 not in own:
            own.discard(t.i)
    return frozenset(own)


def clauses(
    statement: Statement, sent_at: datetime, mentions: Mentions | None = None
) -> list[Statement]:
    """The statement's clauses, each with its own words, subject, dates, negation and
    modality: one statement per clause ("I live in Lisbon and I'm allergic to peanuts" is two).
    A sentence of one clause is the statement itself."""
    others = clause_roots(statement)
    if not others:
        return [statement]
    mentions = mentions or Mentions()
    allowed = {t.i for t in statement.words()}
    roots = [statement.root, *others]
    owned = [(root, _own_tokens(root, allowed, roots)) for root in roots]
    if any(_points_back(own, statement) for _, own in owned):
        return [statement]
    out = []
    for root, own in owned:
        if not own:
            continue
        clause = _clause(statement.sent, root, sent_at, statement.explicit, mentions, own)
        if root.i == statement.root.i:
            clause = replace(clause, imperative=statement.imperative)
        out.append(clause)
    return out


# -- third-person rendering ------------------------------------------------------------------

_SUBJECT_FORMS = {"i": "the user", "me": "the user", "myself": "themselves", "my": "the user's"}
_SUBJECT_FORMS |= {"mine": "the user's", "our": "the user's", "ours": "the user's"}
_SUBJECT_FORMS |= {"ourselves": "themselves"}
_CONTRACTIONS = {"'m": "is", "'ve": "has", "'ll": "will", "'s": "is"}
# Contractions after "we" ("we're" -> "the user and others are"), and modal ones after "I".
_EXPANDED = {"'re": "are", "'ve": "have", "'ll": "will", "'d": "would"}


def _third_person_verb(token: Token) -> str:
    """The verb of an "I" subject in the third person singular ("have" -> "has")."""
    word = _lower(token)
    if word in ("am", "'m"):
        return "is"
    if word in _CONTRACTIONS and token.tag_ != "MD":
        return _CONTRACTIONS[word]
    if token.tag_ == "VBP":
        inflected = getInflection(token.lemma_, tag="VBZ")
        if inflected:
            return str(inflected[0])
    if word == "'d":
        return "would"
    return token.text


def _has_i_subject(token: Token) -> bool:
    head = token if token.dep_ not in ("aux", "auxpass") else token.head
    return any(_lower(c) == "i" and c.dep_ in ("nsubj", "nsubjpass") for c in head.children)


def render(statement: Statement, sent_at: datetime) -> str:
    """The sentence as a standalone third-person fact with absolute dates."""
    sent = statement.sent
    we = (
        "the user and their family"
        if any(t.lower_ in _FAMILY_WORDS for t in sent)
        else "the user and others"
    )
    replaced: dict[int, tuple[int, str]] = {}
    for ent, resolved in statement.dates:
        text = resolved.render()
        before = sent.doc[ent.start - 1] if ent.start > sent.start else None
        as_noun = ent.root.dep_ in ("nsubj", "nsubjpass", "attr", "dobj", "poss")
        if (before is not None and _lower(before) in _PREPOSITIONS) or as_noun:
            text = text.split(" ", 1)[1] if text.startswith(("on ", "in ")) else text
        replaced[ent.start] = (ent.end, text)
    words: list[str] = []
    skip_until = sent.start
    started = False
    named = False  # "the user" said once: later "my" reads "their"
    atomic = _in_placeholders(sent)
    refs = dict(statement.refs)
    for token in statement.words():
        if token.i < skip_until:
            continue
        if token.i in atomic:
            # A placeholder of redacted data is copied as it is ("[redacted government id]"
            # must not read "[redacted government the userd]": it names what was redacted).
            started = True
            words.append(token.text_with_ws)
            continue
        if not started and (token.pos_ in ("INTJ", "PUNCT", "SPACE") or token.dep_ == "intj"):
            continue
        if not started and _lower(token) in ("so", "well", "and", "but", "oh", "also", "anyway"):
            nxt = sent.doc[token.i + 1] if token.i + 1 < sent.end else None
            if nxt is not None and (nxt.is_punct or _lower(nxt) in FIRST_SINGULAR | FIRST_PLURAL):
                continue
        started = True
        if token.i in replaced:
            end, text = replaced[token.i]
            words.append(text + sent.doc[end - 1].whitespace_)
            skip_until = end
            continue
        word = _lower(token)
        if token.i in refs:
            whose = refs[token.i]
            out = f"the {whose}" + ("'s" if token.dep_ == "poss" or word == "its" else "")
        elif word in ("we", "us"):
            out = we
            named = True
        elif word in ("my", "our") and named:
            out = "their"
        elif word == "me" and named:
            out = "them"
        elif word in _SUBJECT_FORMS:
            out = _SUBJECT_FORMS[word]
            named = named or word in ("i", "me", "my", "mine")
        elif token.pos_ in ("VERB", "AUX") and _has_i_subject(token) and not _plural_i(token):
            out = _third_person_verb(token)
        elif word == "'s" and token.pos_ == "AUX" and token.i - 1 in refs:
            out = "has" if token.lemma_ == "have" else "is"  # "she's a beagle"
        elif (
            word in _EXPANDED
            and token.i > sent.start
            and _lower(sent.doc[token.i - 1]) in (FIRST_SINGULAR | FIRST_PLURAL)
        ):
            out = _EXPANDED[word]
        else:
            out = token.text
        prefix = " " if word.startswith("'") and out != token.text else ""
        if words and prefix:
            words[-1] = words[-1].rstrip()
        words.append(prefix + out + token.whitespace_)
    text = "".join(words).strip()
    text = re.sub(r"\s+([,.!;:])", r"\1", text).rstrip(" ,;:-")
    for ent in sent.ents:
        # The other speaker addressed by name ("Caroline, since we last …", "… , Mel!").
        if ent.label_ == "PERSON" and (ent.start == sent.start or ent.end >= sent.end - 1):
            text = re.sub(rf"^{re.escape(ent.text)},\s*|,\s*{re.escape(ent.text)}[.!?]*$", "", text)
    text = re.sub(r"[!?.…]+$", "", text)
    if not text:
        return ""
    resolved_at = {i for span, _ in statement.dates for i in range(span.start, span.end)}
    own = {t.i for t in statement.words()}
    for ent in sent.ents:
        if ent.start not in own:
            continue
        if ent.label_ == "DATE" and _DURATION.search(ent.text) and ent.start not in resolved_at:
            text += f" (as of {day_text(sent_at)})"
            break
    return text[:1].upper() + text[1:] + "."


def _in_placeholders(sent: Span) -> frozenset[int]:
    """The indexes of the sentence's tokens that lie inside a placeholder."""
    offset = sent.start_char
    spans = [(a + offset, b + offset) for a, b in placeholder_spans(sent.text)]
    if not spans:
        return frozenset()
    return frozenset(t.i for t in sent if any(a <= t.idx < b for a, b in spans))


def _plural_i(token: Token) -> bool:
    # "My wife and I are …": a coordinated subject keeps the plural verb.
    head = token if token.dep_ not in ("aux", "auxpass") else token.head
    return any(
        c.dep_ == "nsubj" and any(g.dep_ == "conj" for g in c.children) for c in head.children
    )
