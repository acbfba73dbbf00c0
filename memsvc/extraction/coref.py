"""Whom a pronoun, a possessive or a bare name refers to: the person or pet just named, in
the same turn or the speaker's turn before.

Rules over spaCy's parse. spaCy's coreference component (coreferee 1.5) installs from PyPI but
its English model is downloaded from GitHub by `python -m coreferee install en` and was trained
for spaCy models up to 3.7.5 (ours is 3.8): nothing that installs offline here. The rules
cover what a user says of the people and pets around them: "my sister Rita … she", "I just got
a dog! Her name is Daisy", "my wife Sara … her garden". A pronoun that names no one the turn
mentioned resolves to nobody, never to the user.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from spacy.tokens import Span, Token

from memsvc.extraction.predicates import PETS, RELATIVES

_FEMALE = frozenset(
    {"sister", "mother", "mom", "mum", "mommy", "wife", "girlfriend", "daughter", "aunt"}
    | {"niece", "grandmother", "grandma", "granny", "granddaughter", "fiancee", "fiancée"}
    | {"stepdaughter", "stepmother", "stepmom"}
)
_MALE = frozenset(
    {"brother", "father", "dad", "daddy", "husband", "boyfriend", "son", "uncle", "nephew"}
    | {"grandfather", "grandpa", "grandson", "fiance", "fiancé", "stepson", "stepfather"}
    | {"stepdad"}
)
_SHE = frozenset({"she", "her", "hers", "herself"})
_HE = frozenset({"he", "him", "his", "himself"})
_IT = frozenset({"it", "its"})
_THEY = frozenset({"they", "them", "their", "theirs"})
PRONOUNS = _SHE | _HE | _IT | _THEY
_POSSESSIVE = frozenset({"her", "his", "its", "their"})
_OWN_VERBS = frozenset({"have", "adopt", "get", "rescue", "buy", "welcome"})


@dataclass(frozen=True)
class Referent:
    """Someone (or a pet) the turn named: `subject` is how facts about them are filed."""

    subject: str  # "user's sister Rita", "user's dog", "Rita"
    gender: str  # "f", "m", "pet", or "" (a person, either)
    plural: bool
    at: int  # the mention's token index in the turn's parse
    name: str = ""


def _lower(t: Token) -> str:
    return t.lower_.replace("\u2019", "'")


def _title(word: str) -> str:
    return word[:1].upper() + word[1:]


def _name_of(noun: Token) -> str:
    """The name a relative or pet noun is given in its own sentence: "my wife Ana", "a dog
    named Rex", "my sister's name is Rita", "my son is Tom"."""
    for c in noun.children:
        if c.dep_ == "appos" and c.pos_ == "PROPN":
            return _title(c.text)
        if c.dep_ == "acl" and c.lemma_ in ("name", "call"):
            for g in c.children:
                if g.dep_ in ("oprd", "attr") and g.pos_ == "PROPN":
                    return _title(g.text)
    head = noun.head
    if noun.dep_ == "poss" and head.lemma_ == "name" and head.dep_ == "nsubj":
        verb = head.head
        attr = next((c for c in verb.children if c.dep_ == "attr" and c.pos_ == "PROPN"), None)
        if attr is not None:
            return _title(attr.text)
    if noun.dep_ == "nsubj" and noun.head.lemma_ == "be":
        attr = next(
            (c for c in noun.head.children if c.dep_ == "attr" and c.ent_type_ == "PERSON"), None
        )
        if attr is not None:
            return _title(attr.text)
    return ""


class Mentions:
    """The people and pets one turn has named so far, in order."""

    def __init__(self) -> None:
        self._found: list[Referent] = []

    def observe(self, sent: Span) -> None:
        """Record the sentence's mentions (call before resolving its pronouns: a pronoun may
        point back to a name earlier in its own sentence)."""
        named_at: set[int] = set()
        for t in sent:
            if t.pos_ != "NOUN":
                continue
            relation = t.lemma_.lower() if t.tag_ == "NNS" else _lower(t)
            if relation not in RELATIVES and relation not in PETS:
                continue
            owner = self.owner(t)
            if owner is None:
                continue
            name = _name_of(t)
            subject = f"{owner}'s {relation}" + (f" {name}" if name else "")
            gender = (
                "pet"
                if relation in PETS
                else "f"
                if relation in _FEMALE
                else "m"
                if relation in _MALE
                else ""
            )
            self._found.append(Referent(subject, gender, t.tag_ == "NNS", t.i, name))
            named_at.update(c.i for c in t.subtree if c.pos_ == "PROPN")
        for ent in sent.ents:
            if ent.label_ != "PERSON" or ent.start in named_at:
                continue
            name = ent.text.strip()
            given = self._named_through_pronoun(ent)
            if given is not None:
                # "Her name is Daisy": the dog just mentioned is Daisy, not a new person.
                subject = given.subject if given.name else f"{given.subject} {_title(name)}"
                self._found.append(
                    Referent(subject, given.gender, given.plural, ent.start, _title(name))
                )
                continue
            known = next((r for r in reversed(self._found) if r.name == name), None)
            if known is not None:
                self._found.append(Referent(known.subject, known.gender, False, ent.start, name))
            elif not _vocative(ent):
                self._found.append(Referent(name, "", False, ent.start, name))

    def owner(self, noun: Token) -> str | None:
        """Whose relative or pet a noun is: "user" ("my sister", "a dog" I got), another
        referent ("her husband", "my sister's husband"), or None."""
        poss = next((c for c in noun.children if c.dep_ == "poss"), None)
        if poss is None:
            head = noun.head
            mine = any(_lower(c) in ("i", "we") for c in head.children if c.dep_ == "nsubj")
            return "user" if noun.dep_ == "dobj" and head.lemma_ in _OWN_VERBS and mine else None
        word = _lower(poss)
        if word in ("my", "our"):
            return "user"
        if word in _POSSESSIVE:
            found = self.resolve(poss)
            return found.subject if found is not None else None
        if poss.pos_ == "NOUN" and (poss.lemma_ in RELATIVES or poss.lemma_ in PETS):
            inner = self.owner(poss)
            return f"{inner}'s {_lower(poss)}" if inner is not None else None
        if poss.pos_ == "PROPN":
            found = self.named(poss.text)
            return found.subject if found is not None else None
        return None

    def _named_through_pronoun(self, ent: Span) -> Referent | None:
        """Whom "her name is Daisy" names: the referent of "her"."""
        head = ent.root.head
        if ent.root.dep_ != "attr" or head.lemma_ != "be":
            return None
        subj = next((c for c in head.children if c.dep_ == "nsubj"), None)
        if subj is None or subj.lemma_ != "name":
            return None
        poss = next((c for c in subj.children if c.dep_ == "poss"), None)
        if poss is None or _lower(poss) not in _POSSESSIVE:
            return None
        return self.resolve(poss)

    def carried(self) -> Mentions:
        """The mentions the next turn of the same speaker starts with: those of this turn,
        placed before anything it says ("I just got a dog!" / "Her name is Daisy."). Only
        one turn back: what was carried once is not carried again."""
        after = Mentions()
        after._found = [replace(r, at=-1) for r in self._found if r.at >= 0]
        return after

    @property
    def seen(self) -> tuple[Referent, ...]:
        return tuple(self._found)

    def named(self, name: str) -> Referent | None:
        return next((r for r in reversed(self._found) if r.name == name), None)

    def resolve(self, token: Token) -> Referent | None:
        """The referent of a third-person pronoun: the latest mention before it that agrees."""
        word = _lower(token)
        before = [r for r in self._found if r.at < token.i]
        if word in _SHE:
            fits = [r for r in before if r.gender in ("f", "", "pet") and not r.plural]
        elif word in _HE:
            fits = [r for r in before if r.gender in ("m", "", "pet") and not r.plural]
        elif word in _IT:
            fits = [r for r in before if r.gender == "pet" and not r.plural]
        elif word in _THEY:
            fits = [r for r in before if r.plural]
        else:
            return None
        return fits[-1] if fits else None


def _vocative(ent: Span) -> bool:
    """The other speaker addressed by name: "Caroline, …" or "…, Mel!"."""
    sent = ent.sent
    prev = ent.doc[ent.start - 1] if ent.start > sent.start else None
    nxt = ent.doc[ent.end] if ent.end < sent.end else None
    return (prev is None or prev.is_punct or prev.pos_ == "INTJ") and (nxt is None or nxt.is_punct)
