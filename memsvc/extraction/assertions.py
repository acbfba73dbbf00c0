"""Whether a sentence asserts what it says: hypotheticals, wishes, reported speech, sarcasm
and jokes taken back state nothing about the speaker (pure functions over spaCy's parse).

A fact inside a request or a question is still a fact: "Since I'm vegan, can you suggest
something?" asserts the reason clause (`stated_reason`).
"""

from __future__ import annotations

import re

from spacy.tokens import Span, Token

_WISH_VERBS = frozenset({"wish", "imagine", "suppose", "pretend", "dream", "fantasize"})
_REPORT_VERBS = frozenset(
    {"say", "tell", "claim", "mention", "think", "insist", "swear", "reckon", "warn", "text"}
    | {"write", "believe", "suggest", "recommend", "argue", "joke", "hear", "read"}
)
_HYPOTHETICAL_MARKS = frozenset({"if", "unless", "whether"})
_SOMEDAY = re.compile(r"\b(?:some ?day|one day|in another life|in my dreams)\b", re.IGNORECASE)
_WHAT_IF = re.compile(r"\b(?:what if|imagine if|suppose|supposing|pretend)\b", re.IGNORECASE)
# Sarcasm with an obvious marker.
_SARCASM = re.compile(
    r"\b(?:oh (?:great|joy|wonderful|fantastic|perfect|lovely|goody)|yeah,? right|said no one"
    r"|just what i (?:needed|wanted)|thanks a lot|how fun|what a treat)\b|/s\b|🙄|😒"
    r"|\bnot!",
    re.IGNORECASE,
)
_UNPLEASANT = re.compile(
    r"\b(?:stuck|traffic|waiting|wait|delayed|delay|cancell?ed|broken|broke down|queue|line"
    r"|overtime|mondays?|taxes|dentist|hangover|spam|meetings?|rain(?:ing)?|flat tire|lost"
    r"|flu|sick|laundry|paperwork|commute|chores)\b",
    re.IGNORECASE,
)
_RETRACTION = re.compile(
    r"\b(?:just kidding|(?:i'?m |i was )?(?:only |just )?(?:kidding|joking)|jk|j/k"
    r"|lol,? no|not really,? (?:lol|haha)|(?:i'?m )?just messing with you|psych)\b",
    re.IGNORECASE,
)
_STRESS = frozenset({"just", "totally", "absolutely", "sooo", "so", "really"})
_REASON_MARKS = frozenset({"since", "because", "as", "cause", "'cause", "cuz"})


def _lower(t: Token) -> str:
    return t.lower_.replace("\u2019", "'")


# "I'm not kidding", "no joke, …": an insistence, not a retraction.
_INSISTS = re.compile(r"(?:\bnot|n't|\bno)\s+(?:(?:only|just)\s+)?$", re.IGNORECASE)


def _retraction(text: str) -> re.Match[str] | None:
    for match in _RETRACTION.finditer(text):
        if not _INSISTS.search(text[: match.start()]):
            return match
    return None


def retracts(text: str) -> bool:
    """ "Just kidding", "jk", "I'm only joking": what was said with it is taken back (not
    "I'm not kidding")."""
    return _retraction(text) is not None


def retracts_previous(text: str) -> bool:
    """A turn that opens by taking back what came before ("jk", "Just kidding, …")."""
    match = _retraction(text)
    return match is not None and not re.search(r"\w", text[: match.start()])


def sarcastic(sent: Span) -> bool:
    """An obvious marker ("oh great", "yeah right", "/s"), or a liking said in capitals or
    with "just"/"totally" about something nobody likes ("I just LOVE being stuck in traffic")."""
    text = sent.text
    if _SARCASM.search(text):
        return True
    for t in sent:
        if t.lemma_.lower() not in ("love", "adore", "enjoy", "like"):
            continue
        shouted = t.text.isupper() and len(t.text) > 2
        stressed = any(_lower(c) in _STRESS for c in t.children)
        if (shouted or stressed) and _UNPLEASANT.search(text[t.idx - sent.start_char :]):
            return True
    return False


def hypothetical(sent: Span) -> bool:
    """ "If I lived in Paris I'd …", "I wish I had a dog", "maybe someday I'll learn
    Japanese", "what if I quit": a wish or a condition, not a state."""
    root = sent.root
    if root.lemma_.lower() in _WISH_VERBS:
        return True
    if _WHAT_IF.search(sent.text):
        return True
    for t in sent:
        if t.dep_ == "mark" and _lower(t) in _HYPOTHETICAL_MARKS and t.head.i != root.i:
            clause = t.head
            if any(_lower(c) in ("i", "we") for c in clause.children if c.dep_ == "nsubj"):
                return True
            return _would(root)
        if t.dep_ == "mark" and _lower(t) in _HYPOTHETICAL_MARKS and t.head.i == root.i:
            return True  # "if I had the money." on its own
    if _SOMEDAY.search(sent.text) and (_would(root) or _future(root)):
        return True
    # "I'd quit tomorrow": a condition left unsaid. Not "I might take a job at Amazon" (a
    # possible plan) nor "I'd love to …" (a wish stated as a liking).
    conditional = any(_lower(c) in ("would", "'d") and c.dep_ == "aux" for c in root.children)
    return conditional and root.tag_ == "VB" and root.lemma_.lower() not in ("like", "love")


# Verbs that frame news for the listener: "(I) wanted to let you know that …", "I have to
# tell you, …", "I should mention that …".
_TELLING = frozenset({"know", "tell", "say", "inform", "remind", "update", "mention", "admit"})


def _framing(clause: Token) -> bool:
    """A clause that only frames news for the listener: "I have to tell you", "so you know"."""
    verbs = [clause, *(c for c in clause.children if c.dep_ == "xcomp")]
    return any(v.lemma_.lower() in _TELLING for v in verbs)


def _says_you(token: Token) -> bool:
    return any(_lower(w) in ("you", "your", "yours") for w in token.subtree)


def told_clause(sent: Span, first_person: frozenset[str]) -> Token | None:
    """The root of a first-person clause the speaker tells the listener ("Wanted to let you
    know that I'm running for office again", "I have to tell you, I got the job", "Just so
    you know, I'm vegan"): the news, without the "you" of its framing (a child clause of
    the news that `_framing` names is not part of it). None when there is none."""
    root = sent.root
    subj = next((c for c in root.children if c.dep_ in ("nsubj", "nsubjpass")), None)
    if subj is not None and _lower(subj) in first_person:
        framed = [c for c in root.children if _says_you(c)]
        if framed and all(_framing(c) for c in framed):
            return root
    for t in sent:
        if (
            t.dep_ != "ccomp"
            or t.head.lemma_.lower() not in _TELLING
            or t.pos_ not in ("VERB", "AUX")
        ):
            continue
        subj = next((c for c in t.children if c.dep_ in ("nsubj", "nsubjpass")), None)
        if subj is None or _lower(subj) not in first_person:
            continue
        if any(_lower(w) in ("you", "your", "yours") for w in t.subtree):
            continue
        return t
    return None


def asserted_clause(sent: Span, first_person: frozenset[str]) -> Token | None:
    """The root of a clause that a wish or condition comes with but that is itself asserted,
    about the speaker: "Wish I had a vacation lined up, but right now my writing is consuming
    me" (joined by "but"), "I'll have to look into shelters soon, it would be great to have a
    pup" (a comma splice spaCy reads as a clausal complement before its verb). None when
    there is none: the sentence asserts nothing."""
    root = sent.root
    for t in sent:
        joined = t.dep_ in ("conj", "parataxis") or (t.dep_ == "ccomp" and t.i < root.i)
        if not joined or t.head.i != root.i or t.pos_ not in ("VERB", "AUX"):
            continue
        subj = next((c for c in t.children if c.dep_ in ("nsubj", "nsubjpass")), None)
        if subj is None or not (
            _lower(subj) in first_person
            or any(_lower(c) in first_person and c.dep_ == "poss" for c in subj.children)
        ):
            continue
        words = list(t.subtree)
        if (
            t.lemma_.lower() in _WISH_VERBS
            or _would(t)
            or any(w.dep_ == "mark" and _lower(w) in _HYPOTHETICAL_MARKS for w in words)
            or any(_lower(w) in ("you", "your") for w in words)
            or words[-1].text == "?"
        ):
            continue
        return t
    return None


def _would(verb: Token) -> bool:
    return any(
        _lower(c) in ("would", "'d", "could", "might") and c.dep_ == "aux" for c in verb.children
    )


def _future(verb: Token) -> bool:
    return any(_lower(c) in ("will", "'ll") and c.dep_ == "aux" for c in verb.children)


def reported(sent: Span, first_person: frozenset[str]) -> bool:
    """ "My friend said she loves jazz", "my doctor told me I need to cut sugar": someone
    else's words, not the speaker's assertion."""
    root = sent.root
    if root.lemma_.lower() not in _REPORT_VERBS:
        return False
    subj = next((c for c in root.children if c.dep_ in ("nsubj", "nsubjpass")), None)
    if subj is None or _lower(subj) in first_person or _lower(subj) in ("you", "u", "y'all"):
        return False
    return any(c.dep_ in ("ccomp", "xcomp", "dobj") for c in root.children)


def stated_reason(sent: Span) -> Token | None:
    """The root of a first-person reason clause inside a question or request ("Since I'm
    vegan, can you …"), else None."""
    for t in sent:
        if t.dep_ != "advcl":
            continue
        mark = next((c for c in t.children if c.dep_ == "mark"), None)
        if mark is None or _lower(mark) not in _REASON_MARKS:
            continue
        if any(_lower(c) in ("i", "we") for c in t.children if c.dep_ in ("nsubj", "nsubjpass")):
            return t
    return None
