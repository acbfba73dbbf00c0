"""What a statement of change ends among the speaker's current facts (read off spaCy's parse).

"I sold my car", "I no longer play tennis", "I quit smoking", "Emma and I broke up", "my cat
Luna passed away", "I'm single again", "I switched from Spotify to Apple Music": each ends a
state it names (`Ends`), matched against the current facts at write time (endings.py). The
statement itself stays, as a dated fact of what happened.
"""

from __future__ import annotations

from spacy.tokens import Span, Token

from memsvc.extraction.base import Ends
from memsvc.extraction.predicates import PETS, RELATIVES
from memsvc.extraction.sentences import Statement, lemma

_OWN_CUES = ("have", "has", "own", "drive", "ride", "car")
_VEHICLES = frozenset({"car", "truck", "van", "suv", "motorcycle", "motorbike", "scooter", "jeep"})
_CAR_BRANDS = frozenset(
    {"toyota", "honda", "ford", "bmw", "tesla", "audi", "mercedes", "volkswagen", "vw"}
    | {"subaru", "kia", "hyundai", "nissan", "mazda", "chevy", "chevrolet", "jeep", "volvo"}
    | {"prius", "civic", "corolla", "porsche", "fiat", "peugeot", "renault", "skoda", "lexus"}
)
_PARTNERS = ("girlfriend", "boyfriend", "partner", "fiance", "fiancé", "fiancee", "fiancée")
_SPOUSES = ("wife", "husband", "spouse", "partner")
_STATUS_ENDS = {
    "single": (*_PARTNERS, *_SPOUSES, "dating", "relationship", "married", "engaged"),
    "divorced": (*_SPOUSES, "married"),
    "separated": (*_SPOUSES, "married"),
    "widowed": (*_SPOUSES, "married"),
}
_GIVE_UP = frozenset({"stop", "quit", "give", "drop", "cut", "ditch", "abandon", "kick"})
_SELL = frozenset({"sell", "total", "wreck", "crash", "scrap", "donate", "trade"})
_SPLIT = frozenset({"break", "split", "divorce", "separate", "dump", "leave"})
_DEATH = frozenset({"die", "pass", "lose", "bury"})
_ACTIVITY_STOPWORDS = frozenset({"it", "that", "this", "them", "job", "work", "thing", "stuff"})


def _lower(t: Token) -> str:
    return t.lower_.replace("\u2019", "'")


def _has(token: Token, *deps: str) -> list[Token]:
    return [c for c in token.children if c.dep_ in deps]


def _ended_negation(s: Statement) -> bool:
    words = {_lower(t) for t in s.words()}
    return s.negated and bool(words & {"anymore", "longer"} or "any more" in s.sent.text.lower())


def _term(noun: Token) -> tuple[str, ...]:
    """The words that name a thing: its name when it has one, else its head noun."""
    names = [c.text for c in noun.subtree if c.pos_ == "PROPN"]
    if noun.pos_ == "PROPN":
        return (" ".join(names) or noun.text,)
    found = [lemma(noun)]
    found += [n for n in names if n.lower() not in found]
    return tuple(found)


def _activity(verb: Token) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(terms, cues) of an activity verb phrase: "play tennis" -> (tennis), (play);
    "smoking" -> (smok…), ()."""
    obj = next(iter(_has(verb, "dobj")), None)
    if obj is not None and _lower(obj) not in _ACTIVITY_STOPWORDS and obj.pos_ != "PRON":
        return _term(obj), (lemma(verb),)
    place = next((g for p in _has(verb, "prep") for g in _has(p, "pobj")), None)
    if place is not None and place.pos_ == "PROPN":
        return _term(place), (lemma(verb),)
    if lemma(verb) in ("be", "have", "do", "get", "go", "work"):
        return (), ()
    return (lemma(verb),), ()


def endings(s: Statement) -> tuple[Ends, ...]:
    """The states one clause ends (empty for most)."""
    if s.planned or s.historical or not s.subject:
        return ()
    root = s.root
    lem = lemma(root)
    who = s.subject
    found: list[Ends] = []
    # "I no longer play tennis", "I don't smoke anymore", "I don't work at Target anymore".
    if _ended_negation(s) and lem not in ("be",):
        terms, cues = _activity(root)
        if terms:
            found.append(Ends(who, terms, cues, reason=f"no longer: {lem}"))
    # "I stopped eating meat", "I quit smoking", "I gave up tennis", "I quit my job".
    if lem in _GIVE_UP and not s.negated:
        if lem == "give" and not any(_lower(c) == "up" for c in root.children):
            return tuple(found)
        action = next(iter(_has(root, "xcomp", "ccomp")), None)
        obj = next(iter(_has(root, "dobj")), None)
        if action is not None and action.tag_ == "VBG":
            terms, cues = _activity(action)
            if terms:
                found.append(Ends(who, terms, cues, reason=f"stopped: {lemma(action)}"))
        elif obj is not None and lemma(obj) in ("job", "work", "position"):
            found.append(
                Ends(who, (), predicates=("works_at", "occupation"), reason="quit the job")
            )
        elif obj is not None and obj.pos_ == "NOUN" and _lower(obj) not in _ACTIVITY_STOPWORDS:
            found.append(Ends(who, _term(obj), reason=f"gave up: {lemma(obj)}"))
        elif obj is not None and obj.pos_ == "VERB":
            terms, cues = _activity(obj)
            if terms:
                found.append(Ends(who, terms, cues, reason=f"stopped: {lemma(obj)}"))
    # "I sold my car", "we got rid of the piano".
    sold = lem in _SELL or (lem == "get" and "rid" in {_lower(t) for t in s.words()})
    if sold and not s.negated:
        obj = next(iter(_has(root, "dobj")), None)
        if obj is None:
            rid = next((t for t in s.words() if _lower(t) == "rid"), None)
            preps = _has(rid, "prep") if rid is not None else []
            obj = next((g for p in preps for g in _has(p, "pobj")), None)
        if obj is not None and obj.pos_ in ("NOUN", "PROPN") and _lower(obj) not in ("it", "that"):
            terms = _term(obj)
            if lemma(obj) in _VEHICLES:
                terms = (*terms, *sorted(_CAR_BRANDS))
            found.append(Ends(who, terms, _OWN_CUES, reason=f"sold: {lemma(obj)}"))
    # "Emma and I broke up", "I broke up with my girlfriend", "I divorced Sam", "I left my husband".
    if lem in _SPLIT and not s.negated and who == "user":
        split = lem in ("divorce", "separate", "dump", "leave") or any(
            _lower(c) == "up" for c in root.children
        )
        partner = _partner(root)
        if split and (partner is not None or lem in ("break", "split", "divorce", "separate")):
            if partner is not None and partner.pos_ == "PROPN":
                terms = (partner.text,)
            elif partner is not None and lemma(partner) in RELATIVES:
                terms = (lemma(partner),)
            else:
                terms = _PARTNERS + _SPOUSES if lem != "leave" else ()
            if terms:
                found.append(
                    Ends(
                        "user",
                        terms,
                        predicates=("family", "relationship_status"),
                        reason=f"broke up: {lem}",
                    )
                )
    # "My cat Luna passed away", "we lost our dog", "my grandpa died".
    if lem in _DEATH and not s.negated:
        gone = who
        if lem == "pass" and not any(_lower(c) in ("away", "on") for c in root.children):
            gone = ""
        if lem == "lose":
            obj = next(iter(_has(root, "dobj")), None)
            gone = ""
            kin = obj is not None and (lemma(obj) in PETS or lemma(obj) in RELATIVES)
            if obj is not None and kin and who == "user":
                names = [c.text for c in obj.subtree if c.pos_ == "PROPN"]
                gone = f"user's {lemma(obj)}" + (f" {names[0]}" if names else "")
        if gone.startswith("user's "):
            found.append(_death(gone))
    # "I'm single again", "I'm divorced now".
    if lem == "be" and not s.negated and who == "user":
        for comp in _has(root, "acomp", "attr"):
            ended = _STATUS_ENDS.get(_lower(comp))
            if ended:
                found.append(
                    Ends(
                        "user",
                        ended,
                        predicates=("family", "relationship_status"),
                        reason=f"now {_lower(comp)}",
                    )
                )
    # "I said Boston earlier but I meant Austin": the value said before is taken back.
    if lem == "mean" and not s.negated and who == "user":
        meant = next(iter(_has(root, "dobj", "attr")), None)
        said = restated(s)
        if meant is not None and said is not None:
            found.append(
                Ends("user", (said.text,), reason=f"restated: {said.text} -> {meant.text}")
            )
    # "I switched from Spotify to Apple Music".
    if lem in ("switch", "move", "change") and not s.negated:
        source = next(
            (g for p in _has(root, "prep") if _lower(p) == "from" for g in _has(p, "pobj")), None
        )
        if source is not None and source.pos_ in ("NOUN", "PROPN"):
            found.append(Ends(who, _term(source), reason=f"switched from: {source.text}"))
    return tuple(found)


def restated(s: Statement) -> Token | None:
    """The value a "meant" clause takes back: "I said <Boston> earlier but I meant Austin"."""
    return said_before(s.root, s.sent)


def said_before(mean: Token, sent: Span) -> Token | None:
    """What an "I said …" in ``sent`` (or the sentence before it) named, for the "I meant …"
    clause whose verb is ``mean``."""
    # spaCy may cut "I said Boston earlier" off as a sentence of its own.
    start = sent[0].nbor(-1).sent.start if sent.start > 0 else sent.start
    for verb in sent.doc[start : sent.end]:
        if lemma(verb) != "say" or verb.i == mean.i:
            continue
        if not any(_lower(c) == "i" for c in _has(verb, "nsubj")):
            continue
        value = _said_value(verb)
        if value is not None:
            return value
    return None


def _said_value(say: Token) -> Token | None:
    """What "I said" named: "I said Denver before" (spaCy may make it any dependent)."""
    return next((c for c in say.children if c.pos_ in ("PROPN", "NUM") and c.dep_ != "nsubj"), None)


def taken_back(s: Statement) -> bool:
    """Whether the clause is the "I said Boston earlier" that a "but I meant Austin" of its
    sentence takes back."""
    return said_then_taken_back(s.root, s.sent)


def said_then_taken_back(say: Token, sent: Span) -> bool:
    """Whether ``say`` is the verb of an "I said Boston" that an "I meant …" of ``sent`` (or
    of the sentence after it) takes back."""
    if lemma(say) != "say" or _said_value(say) is None:
        return False
    doc = sent.doc
    end = doc[sent.end].sent.end if sent.end < len(doc) else sent.end
    return any(
        lemma(t) == "mean" and any(_lower(c) == "i" for c in _has(t, "nsubj"))
        for t in doc[sent.start : end]
    )


def _partner(root: Token) -> Token | None:
    """Whom the user split from: "with Emma", "Emma and I", "divorced Sam", "left my wife"."""
    for prep in _has(root, "prep"):
        if _lower(prep) == "with":
            obj = next(iter(_has(prep, "pobj")), None)
            if obj is not None:
                return obj
    obj = next(iter(_has(root, "dobj")), None)
    if obj is not None:
        return obj
    subj = next(iter(_has(root, "nsubj")), None)
    if subj is not None:
        if _lower(subj) in ("i", "we"):
            conj = next((c for c in subj.children if c.dep_ == "conj"), None)
            return conj
        if any(_lower(c) == "i" for c in subj.children if c.dep_ == "conj"):
            return subj
    return None


def _death(gone: str) -> Ends:
    """The user's relative or pet who died: their family/pet fact ends (the event stays)."""
    rest = gone.removeprefix("user's ").split(" ", 1)
    relation, name = rest[0], rest[1] if len(rest) > 1 else ""
    return Ends(
        "user",
        (name,) if name else (relation,),
        predicates=("pet", "family", "has"),
        reason=f"died: {relation}",
    )
