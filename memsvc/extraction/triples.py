"""Subject-predicate-object triples of profile facts, read off a statement's dependency parse.

name, home, work, occupation, diet, allergies, family and pets, likes and dislikes, origin,
age, relationship status and plans. A triple is proposed only when the parse leaves no doubt
about whom it is of: another person's attribute is theirs ("user's mom" lives in Chicago),
an adjective or a nationality is never a name, and a plan is never a current value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lemminflect import getInflection
from spacy.tokens import Span, Token

from memsvc.extraction.predicates import DIETS, JOBS, NOT_NAMES, PETS, RELATIVES, REQUEST_VERBS
from memsvc.extraction.sentences import Statement, contrastive, lemma

_NOT_NAME_ENTS = frozenset({"NORP", "DATE", "TIME", "GPE", "LOC", "CARDINAL", "ORDINAL"})
_STATUSES = frozenset({"married", "divorced", "single", "engaged", "widowed", "separated"})
_LIKE = {"like": "likes", "love": "likes", "enjoy": "likes", "adore": "likes", "prefer": "likes"}
_DISLIKE = {"hate": "dislikes", "dislike": "dislikes", "detest": "dislikes", "loathe": "dislikes"}
_QUIT = frozenset({"quit", "leave", "resign", "stop", "lose", "retire"})


@dataclass(frozen=True)
class Triple:
    """One profile fact. `canonical` is its own standalone sentence, used when the statement's
    sentence says something else first."""

    subject: str
    predicate: str
    object: str
    canonical: str
    negated: bool = False
    historical: bool = False
    planned: bool = False


def _lower(t: Token) -> str:
    return t.lower_.replace("\u2019", "'")


def _phrase(token: Token) -> str:
    """A noun with its modifiers, without relative clauses or trailing prepositions."""
    keep = {"compound", "amod", "nummod", "flat", "nmod", "poss", "case", "quantmod", "conj", "cc"}
    words = [token]
    for child in token.children:
        if child.dep_ in keep:
            words.extend(child.subtree)
    words = sorted(set(words), key=lambda t: t.i)
    text = " ".join(w.text for w in words if _lower(w) not in ("my", "our"))
    return text.replace(" 's", "'s").strip()


def _entity_or_phrase(token: Token) -> str:
    ent = next((e for e in token.doc.ents if e.start <= token.i < e.end), None)
    if ent is not None and ent.label_ in ("GPE", "LOC", "ORG", "FAC", "PERSON", "NORP"):
        return ent.text
    return _phrase(token)


def _children(token: Token, *deps: str) -> list[Token]:
    return [c for c in token.children if c.dep_ in deps]


def _place_pointed_at(verb: Token) -> Token | None:
    """ "… I meant Austin, that's where I live": the place "that" points back to, the last
    one named before it in the sentence."""
    where = any(_lower(c) == "where" for c in verb.children)
    head = verb.head
    pointer = next((c for c in head.children if c.dep_ == "nsubj"), None)
    if not where or lemma(head) != "be" or pointer is None or _lower(pointer) != "that":
        return None
    # The last proper noun before "that" (spaCy often tags a city as a person: "Austin").
    named = [t for t in verb.sent if t.pos_ == "PROPN" and t.i < pointer.i]
    return named[-1] if named else None


def _pobj(token: Token, *preps: str) -> Token | None:
    for prep in _children(token, "prep"):
        if _lower(prep) in preps:
            obj = next(iter(_children(prep, "pobj")), None)
            if obj is not None:
                return obj
    return None


def _word(token: Token) -> str:
    return token.text.rstrip(".")


def _is_name(token: Token, *, strict: bool = True) -> bool:
    """A word that can be a name. `strict` also refuses what the entity recogniser calls a
    place or an organisation; after "call me" or "I'm" the small model often labels first
    names so ("Marcus", "Mo"), and the construction itself says it is a name."""
    if _lower(token).rstrip(".") in NOT_NAMES or token.pos_ in (
        "ADJ",
        "ADV",
        "VERB",
        "PRON",
        "NUM",
    ):
        return False
    ent = next((e for e in token.doc.ents if e.start <= token.i < e.end), None)
    refused = _NOT_NAME_ENTS if strict else frozenset({"NORP", "DATE", "TIME", "CARDINAL"})
    if ent is not None and ent.label_ in refused:
        return False
    word = _word(token).replace("-", "").replace("'", "")
    return word.isalpha() and len(word) > 1


def _name_text(token: Token) -> str:
    parts = [
        t for t in token.subtree if t.pos_ in ("PROPN", "NOUN") and t.dep_ in ("compound", "flat")
    ]
    words = sorted({token, *parts}, key=lambda t: t.i)
    text = " ".join(w.text[:1].upper() + w.text[1:] for w in words)
    return text[:-1] if text.endswith(".") and not text.endswith("Dr.") else text


def _user_subject(s: Statement) -> bool:
    return s.subject == "user"


def subject_phrase(who: str) -> str:
    """How a fact's sentence names its subject: "The user", "The user's sister Rita", "Rita"."""
    return f"The {who}" if who.startswith("user") else who


def _poss_relatives(sent: Span) -> list[tuple[Token, Token]]:
    """'my wife Ana', 'a puppy named Biscuit', 'my dog's name is Rex': (relation, name)."""
    pairs: list[tuple[Token, Token]] = []
    for t in sent:
        lem = lemma(t)
        if t.pos_ != "NOUN" or (lem not in RELATIVES and lem not in PETS):
            continue
        for c in t.children:
            if c.dep_ == "appos" and c.pos_ == "PROPN" and _is_name(c):
                pairs.append((t, c))
                pairs.extend((t, g) for g in c.children if g.dep_ == "conj" and _is_name(g))
            if c.dep_ == "acl" and lemma(c) in ("name", "call"):
                pairs.extend(
                    (t, g) for g in c.children if g.dep_ in ("oprd", "attr") and _is_name(g)
                )
    return pairs


def _owned(noun: Token) -> bool:
    """The noun is the user's: "my wife", or the object of the user's have/adopt/get."""
    if any(_lower(c) in ("my", "our") for c in noun.children if c.dep_ == "poss"):
        return True
    head = noun.head
    if noun.dep_ == "dobj" and lemma(head) in ("have", "adopt", "get", "rescue", "buy"):
        return any(_lower(c) in ("i", "we") for c in head.children if c.dep_ == "nsubj")
    return False


def family_names(s: Statement) -> list[Triple]:
    triples: list[Triple] = []
    for rel, name in _poss_relatives(s.sent):
        if not _owned(rel):
            continue
        relation = lemma(rel)
        pet = relation in PETS
        who = _name_text(name)
        triples.append(
            Triple(
                "user",
                "pet" if pet else "family",
                f"{relation}:{who}",
                f"The user's {relation} is named {who}.",
            )
        )
    return triples


def _named_relation(s: Statement) -> list[Triple]:
    """'my son is Tom', 'my daughter is named Maya', 'my dog's name is Rex'."""
    root = s.root
    subj = next(iter(_children(root, "nsubj", "nsubjpass")), None)
    if subj is None:
        return []
    rel = subj
    if lemma(subj) == "name":
        rel = next((c for c in subj.children if c.dep_ == "poss" and c.pos_ == "NOUN"), subj)
    relation = lemma(rel)
    if rel.i == subj.i and lemma(subj) == "name":
        return []
    if (relation not in RELATIVES and relation not in PETS) or not _owned(rel):
        return []
    value = None
    if lemma(root) == "be":
        value = next((c for c in _children(root, "attr") if c.pos_ == "PROPN"), None)
        if value is None and subj.i != rel.i:
            value = next(iter(_children(root, "attr")), None)
    elif lemma(root) in ("name", "call") and subj.dep_ == "nsubjpass":
        value = next(iter(_children(root, "oprd", "attr")), None)
    if value is None or not _is_name(value) or s.negated:
        return []
    who = _name_text(value)
    return [
        Triple(
            "user",
            "pet" if relation in PETS else "family",
            f"{relation}:{who}",
            f"The user's {relation} is named {who}.",
        )
    ]


def _name(s: Statement) -> list[Triple]:
    root = s.root
    lem = lemma(root)
    value: Token | None = None
    subj = next(iter(_children(root, "nsubj")), None)
    if lem == "be" and subj is not None and lemma(subj) == "name":
        owner = next((c for c in subj.children if c.dep_ == "poss"), None)
        if owner is not None and _lower(owner) == "my":
            value = next(iter(_children(root, "attr")), None)
    elif lem == "call" and any(_lower(c) == "me" for c in _children(root, "dobj")):
        value = next(iter(_children(root, "oprd", "attr", "npadvmod", "appos", "xcomp")), None)
        if value is None:
            # "call me Liz" is sometimes parsed with the name as a second object.
            objs = [c for c in _children(root, "dobj") if _lower(c) != "me"]
            value = objs[0] if objs else None
    elif lem == "go" and _user_subject(s):
        value = _pobj(root, "by")
    elif lem == "be" and subj is not None and _lower(subj) == "i" and root.tag_ in ("VBP", "VBZ"):
        # "hi, I'm Marcus": a proper noun, alone, as the complement (the small model often
        # labels a first name as a place, so the label is not asked for).
        attr = next(iter(_children(root, "attr")), None)
        bare = attr is not None and not any(
            c.dep_ in ("poss", "det", "case") for c in attr.children
        )
        if attr is not None and bare and attr.pos_ == "PROPN" and attr.ent_type_ != "NORP":
            value = attr
    if value is None or s.negated or s.planned:
        return []
    if not _is_name(value, strict=lem not in ("be", "call")):
        return []
    if any(c.dep_ == "det" for c in value.children):
        return []  # "call me a taxi"
    if lem == "call" and value.pos_ != "PROPN" and value.ent_type_ != "PERSON":
        return []  # "call me crazy"
    name = _name_text(value)
    return [Triple("user", "name", name, f"The user's name is {name}.")]


def _place_and_work(s: Statement) -> list[Triple]:
    root = s.root
    lem = lemma(root)
    triples: list[Triple] = []
    verb = root
    if s.historical or lem in ("plan", "want", "hope", "intend", "go", "decide", "start", "begin"):
        verb = next(iter(_children(root, "xcomp")), root)
    vlemma = lemma(verb)
    past = verb.tag_ == "VBD" or s.historical
    who = s.subject
    of = subject_phrase(who)
    if vlemma == "live":
        place = _pobj(verb, "in") or _place_pointed_at(verb)
        if place is not None:
            x = _entity_or_phrase(place)
            triples.append(_tensed(s, of, x, "lives_in", "lived_in", "live in", past=past))
    elif vlemma in ("move", "relocate"):
        place = _pobj(verb, "to")
        if place is not None and not s.negated:
            x = _entity_or_phrase(place)
            if s.planned or verb.i != root.i:
                triples.append(_plan(s, of, f"move to {x}"))
            else:
                triples.append(Triple(who, "lives_in", x, f"{of} lives in {x}."))
    elif vlemma in ("switch", "move") and who == "user" and not s.negated:
        # "I don't work at Santa Maria anymore, I switched to a clinic."
        place = _pobj(verb, "to")
        working = any(lemma(t) in ("work", "job", "employer") for t in s.sent)
        if place is not None and working and not s.planned:
            x = _entity_or_phrase(place)
            said = x if place.pos_ == "PROPN" else _a(x)
            triples.append(Triple(who, "works_at", x, f"The user works at {said}."))
    elif vlemma == "work":
        org = _pobj(verb, "at", "for")
        role = _pobj(verb, "as")
        if org is not None:
            x = _entity_or_phrase(org)
            triples.append(_tensed(s, of, x, "works_at", "worked_at", "work at", past=past))
        if role is not None and not s.planned and not s.negated:
            x = _phrase(role).lower()
            pred, hist = ("was", True) if past else ("occupation", False)
            text = f"{of} used to work as {_a(x)}." if past else f"{of} works as {_a(x)}."
            triples.append(Triple(who, pred, x, text, historical=hist))
    # "a job at Siemens" with the user's get / start / land / move, or quitting one.
    for t in s.words():
        if lemma(t) != "job" or who != "user":
            continue
        org = _pobj(t, "at", "with", "for") or (
            _pobj(t.head, "at", "with") if t.dep_ == "dobj" else None
        )
        if org is None or org.pos_ not in ("PROPN", "NOUN"):
            continue
        x = _entity_or_phrase(org)
        head = t.head if t.dep_ in ("dobj", "pobj") else t
        if head.dep_ == "prep":
            head = head.head
        hlemma = lemma(head)
        if hlemma in _QUIT or s.negated:
            triples.append(
                Triple(who, "works_at", x, f"The user no longer works at {x}.", negated=True)
            )
        elif not s.planned and hlemma in (
            "get",
            "land",
            "start",
            "take",
            "accept",
            "have",
            "move",
            "begin",
            "find",
        ):
            triples.append(Triple(who, "works_at", x, f"The user works at {x}."))
    # "yesterday was my last day at Accenture"
    for t in s.words():
        if lemma(t) == "day" and any(_lower(c) == "last" for c in t.children) and who == "user":
            org = _pobj(t, "at", "with")
            if org is not None and org.pos_ == "PROPN" and not s.planned:
                x = _entity_or_phrase(org)
                triples.append(
                    Triple(who, "works_at", x, f"The user no longer works at {x}.", negated=True)
                )
    if vlemma in _QUIT and who == "user":
        obj = next(iter(_children(verb, "dobj")), None)
        if obj is not None and obj.pos_ == "PROPN":
            x = _entity_or_phrase(obj)
            triples.append(
                Triple(who, "works_at", x, f"The user no longer works at {x}.", negated=True)
            )
    return triples


def _plan(s: Statement, of: str, action: str) -> Triple:
    return Triple(s.subject, "plans", action, f"{of} plans to {action}.", planned=True)


def _tensed(
    s: Statement, of: str, x: str, current: str, former: str, verb: str, *, past: bool
) -> Triple:
    """A place or employer in the statement's modality: planned, ended, former or current
    ("live in" -> lives_in / lived_in / plans "live in X")."""
    if s.planned:
        return _plan(s, of, f"{verb} {x}")
    head, _, rest = verb.partition(" ")
    third = f"{getInflection(head, tag='VBZ')[0]} {rest}"
    if s.negated:
        return Triple(s.subject, current, x, f"{of} no longer {third} {x}.", negated=True)
    if past:
        return Triple(s.subject, former, x, f"{of} used to {verb} {x}.", historical=True)
    return Triple(s.subject, current, x, f"{of} {third} {x}.")


def _allergen(allergic: Token) -> str:
    """What follows "allergic to", however the small model attached it."""
    words: list[str] = []
    started = False
    for t in allergic.doc[allergic.i + 1 : allergic.sent.end]:
        if not started:
            if _lower(t) == "to":
                started = True
                continue
            return ""
        if t.is_punct or t.dep_ in ("cc", "neg") or _lower(t) in ("and", "but", "so", "not"):
            break
        if words and t.pos_ in ("ADP", "ADV", "AUX", "PRON", "SCONJ", "PART"):
            break
        words.append(t.text)
    return " ".join(w for w in words if w.lower() not in ("my", "our")).strip()


def _a(x: str) -> str:
    return f"{'an' if x[:1] in 'aeiou' else 'a'} {x}"


def _being(s: Statement) -> list[Triple]:
    """be + complement: occupation, diet, allergy, origin, age, relationship status."""
    root = s.root
    verb = root
    stopped = False
    if lemma(root) in ("stop", "quit") and _children(root, "xcomp"):
        verb = _children(root, "xcomp")[0]
        stopped = True
    if lemma(verb) not in ("be", "become", "go", "turn"):
        return []
    who = s.subject
    of = subject_phrase(who)
    negated = s.negated or stopped
    triples: list[Triple] = []
    complements = _children(verb, "attr", "acomp", "dobj", "oprd")
    if stopped:
        complements = _children(verb, "attr", "acomp", "dobj", "oprd") or _children(root, "dobj")
    denied_from = min(
        (c.i for c in verb.children if c.dep_ == "neg" and contrastive(c)), default=None
    )
    for comp in complements:
        if any(c.dep_ == "neg" for c in comp.children) and comp.i > verb.i + 1:
            continue  # "pescatarian, not vegetarian": the corrected-away value
        if denied_from is not None and comp.i > denied_from:
            continue  # "a nurse now, not a teacher"
        word = lemma(comp) if comp.pos_ == "NOUN" else _lower(comp)
        compound = "-".join(
            [_lower(c) for c in comp.children if c.dep_ in ("compound", "amod", "npadvmod")]
            + [word]
        )
        diet = word if word in DIETS else compound if compound in DIETS else None
        if diet is not None:
            if negated:
                no = "no longer" if stopped or _ended(s) else "not"
                triples.append(Triple(who, "diet", diet, f"{of} is {no} {diet}.", negated=True))
            elif s.historical or (verb.tag_ == "VBD" and lemma(verb) == "be"):
                triples.append(
                    Triple(who, "diet", diet, f"{of} used to be {diet}.", historical=True)
                )
            elif not s.planned:
                triples.append(Triple(who, "diet", diet, f"{of} is {diet}."))
            continue
        if word == "allergic":
            x = _allergen(comp)
            if x and negated:
                triples.append(
                    Triple(who, "allergy", x.lower(), f"{of} is not allergic to {x}.", negated=True)
                )
            elif x:
                triples.append(Triple(who, "allergy", x.lower(), f"{of} is allergic to {x}."))
            continue
        if comp.ent_type_ == "NORP" and not negated and not s.planned:
            x = comp.text[:1].upper() + comp.text[1:]
            triples.append(Triple(who, "nationality", x, f"{of} is {x}."))
            continue
        if word in _STATUSES and not negated and not s.planned:
            triples.append(Triple(who, "relationship_status", word, f"{of} is {word}."))
            continue
        if comp.pos_ == "NOUN" and word in JOBS and not s.planned and who == "user":
            x = _phrase(comp).lower()
            if negated:
                triples.append(
                    Triple(who, "occupation", x, f"{of} is no longer {_a(x)}.", negated=True)
                )
            elif s.historical or verb.tag_ == "VBD":
                triples.append(Triple(who, "was", x, f"{of} used to be {_a(x)}.", historical=True))
            else:
                triples.append(Triple(who, "occupation", x, f"{of} works as {_a(x)}."))
            continue
        present_main = verb.tag_ in ("VBP", "VBZ") and verb.dep_ in ("ROOT", "conj")
        if (word == "old" or comp.pos_ == "NUM") and present_main and not s.planned:
            num = next((t for t in comp.subtree if t.like_num), None) if word == "old" else comp
            if num is not None and num.text.isdigit() and not negated and who == "user":
                triples.append(Triple(who, "age", num.text, f"{of} is {num.text} years old."))
    origin = _pobj(verb, "from")
    if origin is not None and lemma(verb) == "be" and not negated:
        x = _entity_or_phrase(origin)
        if origin.pos_ == "PROPN":
            triples.append(Triple(who, "origin", x, f"{of} is from {x}."))
    return triples


def _grew_up(s: Statement) -> list[Triple]:
    root = s.root
    lem = lemma(root)
    place = None
    grew_up = lem == "grow" and any(_lower(c) == "up" for c in root.children)
    if grew_up or (lem == "bear" and root.tag_ == "VBN"):
        place = _pobj(root, "in")
    if place is None or place.pos_ != "PROPN" or s.negated:
        return []
    of = subject_phrase(s.subject)
    x = _entity_or_phrase(place)
    return [Triple(s.subject, "origin", x, f"{of} is from {x}.")]


def _likes(s: Statement) -> list[Triple]:
    root = s.root
    lem = lemma(root)
    if s.planned or (lem not in _LIKE and lem not in _DISLIKE):
        return []
    aux = {_lower(c) for c in root.children if c.dep_ == "aux"}
    if aux & {"'d", "would"}:
        return []
    obj = next(iter(_children(root, "dobj", "xcomp", "ccomp")), None)
    if obj is None or obj.pos_ == "PRON" or _lower(obj) in ("it", "that", "this", "them"):
        return []
    if s.tokens is not None and obj.i not in s.tokens:
        return []
    if obj.dep_ == "ccomp" and _children(obj, "nsubj", "nsubjpass"):
        return []  # "I'm not a vegetarian, I just don't like mushrooms": another clause
    if obj.dep_ == "xcomp" and lemma(obj) in REQUEST_VERBS:
        return []
    text = " ".join(t.text for t in obj.subtree if _lower(t) not in ("my", "our"))
    text = text.replace(" 's", "'s").strip(" ,.")
    if not text or len(text) > 80:
        return []
    disliked = lem in _DISLIKE or s.negated
    predicate = "dislikes" if disliked else "likes"
    of = subject_phrase(s.subject)
    verb = "dislikes" if disliked else "likes"
    return [Triple(s.subject, predicate, text.lower(), f"{of} {verb} {text}.")]


def _plans(s: Statement) -> list[Triple]:
    """A plan or goal of the user that no other rule named."""
    if not s.planned or s.negated or s.subject != "user":
        return []
    root = s.root
    action = next(iter(_children(root, "xcomp")), root)
    if lemma(action) in REQUEST_VERBS or lemma(action) == "be":
        return []
    dated = {
        t.i
        for t in action.subtree
        if t.ent_type_ in ("DATE", "TIME")
        or (t.dep_ == "prep" and any(c.ent_type_ in ("DATE", "TIME") for c in t.children))
    }
    words = [action.lemma_] + [
        t.text for t in action.subtree if t.i > action.i and t.i not in dated
    ]
    text = " ".join(w for w in words if w.lower() not in ("my", "our")).strip(" ,.!")
    text = text.replace(" 's", "'s")
    if len(text.split()) < 2 or len(text) > 100:
        return []
    return [Triple("user", "plans", text.lower(), f"The user plans to {text}.", planned=True)]


_MULTI_VALUED_CORRECTABLE = frozenset({"allergy", "family", "pet", "likes", "dislikes"})


def _corrected_away(s: Statement, found: list[Triple]) -> list[Triple]:
    """ "Actually I'm allergic to shellfish, not peanuts": the value named after "not" is
    ended too. A single-valued predicate needs nothing more (its new value replaces the old);
    for a many-valued one the old value gets a negated triple of its own."""
    olds = [
        s.sent.doc[t.i + 1]
        for t in s.sent
        if _lower(t) == "not"
        and t.i + 1 < s.sent.end
        and t.i > s.sent.start
        and s.sent.doc[t.i - 1].is_punct
        and s.sent.doc[t.i + 1].pos_ in ("NOUN", "PROPN", "NUM", "ADJ")
    ]
    extra: list[Triple] = []
    for old in olds:
        value = old.text
        for triple in found:
            if triple.predicate not in _MULTI_VALUED_CORRECTABLE or triple.negated:
                continue
            relation, _, name = triple.object.partition(":")
            obj = f"{relation}:{value}" if name else value.lower()
            if obj.casefold() == triple.object.casefold():
                continue
            extra.append(
                Triple(
                    triple.subject,
                    triple.predicate,
                    obj,
                    _denial(triple, relation if name else "", value),
                    negated=True,
                )
            )
            break
    return extra


def _denial(triple: Triple, relation: str, value: str) -> str:
    """The standalone sentence of a corrected-away value."""
    of = subject_phrase(triple.subject)
    if relation:
        return f"{of}'s {relation} is not named {value}."
    if triple.predicate == "allergy":
        return f"{of} is not allergic to {value}."
    verb = "like" if triple.predicate == "likes" else "dislike"
    return f"{of} does not {verb} {value}."


def _ended(s: Statement) -> bool:
    """ "no longer", "not … anymore": a state that held and holds no more."""
    words = [_lower(t) for t in s.words()]
    return "anymore" in words or "longer" in words or "more" in words


_MONTH = re.compile(
    r"\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\b", re.IGNORECASE
)


def _birthday(s: Statement) -> list[Triple]:
    """ "My mom's birthday is on March 3rd": a date of someone's, a fact and never a plan."""
    root = s.root
    subj = next(iter(_children(root, "nsubj")), None)
    if subj is None or lemma(root) != "be" or lemma(subj) not in ("birthday", "anniversary"):
        return []
    when = next((e for e in s.sent.ents if e.label_ == "DATE" and e.start > root.i), None)
    if when is None or not _MONTH.search(when.text):
        return []  # "my birthday is tomorrow", "in 10 days": a dated event, resolved elsewhere
    whose = s.subject.removesuffix(f"'s {_lower(subj)}")
    if not whose.startswith("user"):
        return []
    text = when.text.removeprefix("on ").strip()
    day = " ".join(w[:1].upper() + w[1:] if w.isalpha() else w for w in text.split())
    predicate = "birthday" if lemma(subj) == "birthday" else "anniversary"
    return [
        Triple(
            whose,
            predicate,
            day,
            f"{subject_phrase(whose)}'s {predicate} is on {day}."
            if whose != "user"
            else f"The user's {predicate} is on {day}.",
        )
    ]


def _pronoun_named(s: Statement) -> list[Triple]:
    """ "I just got a dog! Her name is Daisy": a name given through a pronoun that names
    the user's relative or pet."""
    subj = next(iter(_children(s.root, "nsubj")), None)
    if subj is None or lemma(subj) != "name" or lemma(s.root) != "be" or s.negated:
        return []
    poss = next((c for c in subj.children if c.dep_ == "poss"), None)
    whose = dict(s.refs).get(poss.i) if poss is not None else None
    if whose is None:
        return []
    relation = whose.removeprefix("user's ")
    if relation not in RELATIVES and relation not in PETS:
        return []
    value = next(iter(_children(s.root, "attr")), None)
    if value is None or not _is_name(value, strict=False):
        return []
    who = _name_text(value)
    return [
        Triple(
            "user",
            "pet" if relation in PETS else "family",
            f"{relation}:{who}",
            f"The user's {relation} is named {who}.",
        )
    ]


def triples_of(s: Statement) -> list[Triple]:
    """Every triple of a statement, the one its own sentence states first. A clause about
    no one the turn named (an unresolved "she", "the weather") has none."""
    if not s.subject:
        return []
    if birthday := _birthday(s):
        return birthday
    found: list[Triple] = []
    for rule in (_name, _named_relation, _pronoun_named, _place_and_work, _being, _grew_up, _likes):
        found.extend(rule(s))
    found.extend(_corrected_away(s, found))
    if not any(t.planned for t in found):
        found.extend(_plans(s))
    found.extend(family_names(s))
    unique: dict[tuple[str, str, str], Triple] = {}
    for t in found:
        unique.setdefault((t.subject, t.predicate, t.object.casefold()), t)
    return list(unique.values())
