"""The default extractor: deterministic English rules for first-person statements, offline.

It recognises identity, diet and allergies, likes and dislikes, family and pets, where one
lives, comes from or works, plans and goals, and explicit "remember that ..." requests, with
negation ("I don't take sugar", "I'm not vegetarian anymore") and tense ("I used to live in
Delhi" is historical and never replaces a current fact). Facts are rendered as short
third-person statements ("Lives in Singapore"), so repeats are exact duplicates.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from memsvc.extraction.base import (
    CandidateEpisode,
    CandidateFact,
    DecisionResult,
    ExistingFact,
    Extraction,
    ExtractionInput,
    Turn,
)

# Predicates a person has one current value of: a new value supersedes the old one.
SINGLE_VALUED = frozenset(
    {"name", "lives_in", "works_at", "occupation", "diet", "birthday", "origin", "age"}
)
# Historical predicate -> the current predicate it must not overwrite.
HISTORICAL_OF = {"lived_in": "lives_in", "worked_at": "works_at", "was": "occupation"}

TOPIC_OF_PREDICATE = {
    "name": "identity",
    "birthday": "identity",
    "age": "identity",
    "diet": "food and diet",
    "allergy": "food and diet",
    "avoids": "food and diet",
    "likes": "interests",
    "dislikes": "interests",
    "favorite": "interests",
    "family": "family",
    "pet": "family",
    "has": "family",
    "lives_in": "home and places",
    "lived_in": "home and places",
    "origin": "home and places",
    "works_at": "work",
    "worked_at": "work",
    "occupation": "work",
    "plans": "plans and goals",
    "wants": "plans and goals",
    "goal": "plans and goals",
    "note": "notes",
}

_DIETS = (
    r"vegetarian|vegan|pescatarian|pescetarian|flexitarian|keto|paleo|kosher|halal"
    r"|gluten[- ]free|dairy[- ]free|lactose[- ]intolerant|teetotal(?:er)?|sober"
)
_RELATIVES = (
    r"daughter|son|wife|husband|partner|boyfriend|girlfriend|fianc[eé]e?|mother|mom|mum|father"
    r"|dad|brother|sister|grandmother|grandma|grandfather|grandpa|aunt|uncle|cousin|niece"
    r"|nephew|best friend|friend|boss|manager|colleague|roommate|flatmate|kid|child|baby"
    r"|stepdaughter|stepson|stepmother|stepfather|twin"
)
_PETS = r"dog|cat|puppy|kitten|parrot|bird|rabbit|bunny|hamster|horse|fish|turtle|snake"
_NAME = r"[A-Z][\w'-]+(?: [A-Z][\w'-]+)?"
_JOBS = (
    r"(?:[a-z-]+ )?(?:engineer|developer|programmer|designer|teacher|nurse|doctor|physician"
    r"|surgeon|dentist|lawyer|attorney|accountant|architect|chef|cook|baker|pilot|driver"
    r"|farmer|scientist|researcher|professor|lecturer|student|writer|author|journalist"
    r"|editor|artist|musician|singer|actor|actress|photographer|pharmacist|therapist"
    r"|psychologist|consultant|analyst|manager|entrepreneur|founder|salesperson|plumber"
    r"|electrician|carpenter|mechanic|firefighter|police officer|soldier|veteran|retiree"
    r"|paramedic|veterinarian|vet|librarian|barista|waiter|waitress|cashier|counselor"
    r"|social worker|data scientist|product manager|software engineer|freelancer)"
)
# Words that follow "named"/"is" but are not names.
_NOT_NAMES = frozenset(
    {
        "after",
        "like",
        "the",
        "a",
        "an",
        "so",
        "very",
        "really",
        "not",
        "also",
        "just",
        "here",
        "there",
        "home",
        "back",
        "away",
        "sick",
        "ill",
        "fine",
        "ok",
        "okay",
        "tall",
        "short",
    }
)
# Verbs after "I want to" that make a request of the assistant, not a personal goal.
_REQUEST_VERBS = (
    r"know|ask|check|see|confirm|talk|speak|book|order|cancel|change|say|tell|hear|make sure"
    r"|find out|get|buy|pay|reschedule|schedule|update|add|remove|delete|report|understand|go back"
)

_QUOTES = "\"'\u201c\u201d\u2018\u2019"
_CLAUSE_SPLIT = re.compile(r"(?<=[.!?;])\s+|\n+|\s*[.!?;]+\s*$")
_AND_SPLIT = re.compile(r",?\s+(?:and|but|also|plus)\s+(?=(?:i|i'm|i've|i'd|my|i am)\b)", re.I)
_TRAILING = re.compile(
    r"(?:,?\s+(?:now|these days|nowadays|currently|at the moment|anymore|any more|too|as well"
    r"|actually|though|by the way|haha|lol|originally|recently|lately|last (?:year|month|week)"
    r"|this (?:year|month|week)|a (?:while|few (?:weeks|months|years)) ago))+\s*$",
    re.I,
)
_LEADING = re.compile(
    r"^(?:(?:well|so|oh|um+|uh+|yeah|yes|no|actually|honestly|btw|by the way|also|and|but"
    r"|anyway|ok(?:ay)?|hey|hi|hello)[,!]?\s+)+",
    re.I,
)


def _clean_object(text: str) -> str:
    value = _TRAILING.sub("", text.strip().strip(_QUOTES)).strip(" ,.;:!?-")
    value = re.sub(r"\bmy\b", "their", value, flags=re.I)
    value = re.sub(r"\bmine\b", "theirs", value, flags=re.I)
    value = re.sub(r"\bme\b", "them", value, flags=re.I)
    return value


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


# A rule's builder: the facts of a matching clause; None means "not mine, try the next rule".
_Build = Callable[[re.Match[str]], list[CandidateFact] | None]


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]
    build: _Build


def _fact(
    content: str,
    predicate: str,
    obj: str,
    *,
    category: str,
    role: str,
    confidence: float,
    historical: bool = False,
    negated: bool = False,
) -> CandidateFact:
    return CandidateFact(
        content=content,
        category=category,
        role=role,
        confidence=confidence,
        source_message_ids=(),
        predicate=predicate,
        object=obj,
        historical=historical,
        negated=negated,
    )


def _rules() -> list[_Rule]:
    rules: list[_Rule] = []

    def rule(pattern: str, *, flags: int = re.I) -> Callable[[_Build], _Build]:
        compiled = re.compile(pattern, flags)

        def register(fn: _Build) -> _Build:
            rules.append(_Rule(compiled, fn))
            return fn

        return register

    # --- identity ---------------------------------------------------------------------------
    @rule(r"^(?:my name is|my name's|call me|i go by)\s+(?P<x>[a-z][\w'-]+(?: [a-z][\w'-]+)?)$")
    def name(m: re.Match[str]) -> list[CandidateFact] | None:
        if m["x"].lower() in _NOT_NAMES:
            return None
        x = " ".join(_cap(w) for w in m["x"].split())
        return [_fact(f"Name is {x}", "name", x, category="profile", role="core", confidence=0.95)]

    @rule(r"^my birthday is (?:on )?(?P<x>.{3,40})$")
    def birthday(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"])
        return [
            _fact(
                f"Birthday is {x}", "birthday", x, category="profile", role="core", confidence=0.9
            )
        ]

    @rule(r"^i(?:'m| am) (?P<x>\d{1,3}) (?:years old|yo)$")
    def age(m: re.Match[str]) -> list[CandidateFact] | None:
        x = m["x"]
        return [
            _fact(
                f"Is {x} years old", "age", x, category="profile", role="context", confidence=0.85
            )
        ]

    # --- diet and allergies ---------------------------------------------------------------------
    @rule(rf"^i(?:'m| am) (?:not|no longer) (?:a |an )?(?P<x>{_DIETS})(?: anymore| any more)?$")
    def not_diet(m: re.Match[str]) -> list[CandidateFact] | None:
        x = m["x"].lower()
        return [
            _fact(
                f"Is no longer {x}",
                "diet",
                x,
                category="preference",
                role="core",
                confidence=0.9,
                negated=True,
            )
        ]

    @rule(rf"^i(?:'ve| have)? (?:stopped being|quit being) (?:a |an )?(?P<x>{_DIETS})$")
    def stopped_diet(m: re.Match[str]) -> list[CandidateFact] | None:
        return not_diet(m)

    @rule(rf"^i(?:'m| am)(?: now| still)? (?:a |an |strictly |fully )?(?P<x>{_DIETS})$")
    def diet(m: re.Match[str]) -> list[CandidateFact] | None:
        x = m["x"].lower()
        return [_fact(f"Is {x}", "diet", x, category="preference", role="core", confidence=0.9)]

    @rule(r"^i used to be (?:a |an )?(?P<x>" + _DIETS + r")$")
    def past_diet(m: re.Match[str]) -> list[CandidateFact] | None:
        x = m["x"].lower()
        return [
            _fact(
                f"Used to be {x}",
                "diet",
                x,
                category="preference",
                role="temporal",
                confidence=0.85,
                historical=True,
            )
        ]

    @rule(r"^i(?:'m| am) (?:severely |very |deathly )?allergic to (?P<x>.{2,60})$")
    def allergy(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"])
        return [
            _fact(
                f"Is allergic to {x}",
                "allergy",
                x.lower(),
                category="profile",
                role="core",
                confidence=0.95,
            )
        ]

    @rule(r"^i have (?:an? |a severe )?(?P<x>[\w -]{2,40}) allergy$")
    def allergy2(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"])
        return [
            _fact(
                f"Is allergic to {x}",
                "allergy",
                x.lower(),
                category="profile",
                role="core",
                confidence=0.95,
            )
        ]

    @rule(
        r"^i (?:don't|do not|never|can't|cannot|can not) (?P<v>eat|drink|take|have)"
        r" (?P<x>.{2,60})$"
    )
    def avoids(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"])
        if x.lower() in ("it", "that", "this", "them", "any", "time", "a clue", "an idea"):
            return []
        verb = {"have": "have", "take": "take", "eat": "eat", "drink": "drink"}[m["v"].lower()]
        return [
            _fact(
                f"Does not {verb} {x}",
                "avoids",
                x.lower(),
                category="preference",
                role="core",
                confidence=0.85,
            )
        ]

    # --- likes and dislikes ---------------------------------------------------------------------
    @rule(r"^my fav(?:ou?rite|e) (?P<k>[\w ]{2,30}?) (?:is|are) (?P<x>.{2,60})$")
    def favorite(m: re.Match[str]) -> list[CandidateFact] | None:
        k, x = m["k"].lower(), _clean_object(m["x"])
        return [
            _fact(
                f"Favorite {k} is {x}",
                f"favorite_{k.replace(' ', '_')}",
                x,
                category="preference",
                role="context",
                confidence=0.85,
            )
        ]

    @rule(
        r"^i (?:really |absolutely |just |kind of |kinda )?(?:don't|do not) (?:really )?"
        r"(?:like|enjoy|care for|love) (?P<x>.{2,80})$"
    )
    def dislikes(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"])
        return [
            _fact(
                f"Dislikes {x}",
                "dislikes",
                x.lower(),
                category="preference",
                role="context",
                confidence=0.8,
            )
        ]

    @rule(
        r"^i (?:really |absolutely |truly )?(?:hate|dislike|can't stand|cannot stand|detest)"
        r" (?P<x>.{2,80})$"
    )
    def hates(m: re.Match[str]) -> list[CandidateFact] | None:
        return dislikes(m)

    @rule(
        r"^i (?:really |absolutely |truly |just |also )?(?P<v>like|love|enjoy|adore|prefer)"
        r" (?P<x>.{2,80})$"
    )
    def likes(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"])
        if re.match(r"^(?:to (?:know|ask|see|check)|it|that|this|you)\b", x, re.I):
            return []
        verb = {
            "like": "Likes",
            "love": "Loves",
            "enjoy": "Enjoys",
            "adore": "Loves",
            "prefer": "Prefers",
        }[m["v"].lower()]
        predicate = "likes" if verb != "Prefers" else "prefers"
        return [
            _fact(
                f"{verb} {x}",
                predicate,
                x.lower(),
                category="preference",
                role="context",
                confidence=0.8,
            )
        ]

    @rule(
        r"^i(?:'m| am) (?:a (?:big |huge )?fan of|really into|into|obsessed with)"
        r" (?P<x>.{2,80})$"
    )
    def fan(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"])
        return [
            _fact(
                f"Likes {x}",
                "likes",
                x.lower(),
                category="preference",
                role="context",
                confidence=0.8,
            )
        ]

    # --- family and pets ------------------------------------------------------------------------
    def _named(rel: str, name_text: str) -> list[CandidateFact] | None:
        rel = rel.lower()
        if name_text.lower() in _NOT_NAMES:
            return None
        name_text = " ".join(_cap(w) for w in name_text.split())
        pet = re.fullmatch(_PETS, rel) is not None
        return [
            _fact(
                f"{_cap(rel)} is named {name_text}",
                "pet" if pet else "family",
                f"{rel}:{name_text}",
                category="relationship",
                role="core",
                confidence=0.9,
            )
        ]

    # "named"/"called" make the next word a name even when a transcript is all lower case.
    @rule(
        rf"^(?:my|our) (?P<rel>{_RELATIVES}|{_PETS})(?:'s name is| is named| is called| named"
        rf"| called|'s name's) (?P<x>[a-z][\w'-]+(?: [a-z][\w'-]+)?)$"
    )
    def named(m: re.Match[str]) -> list[CandidateFact] | None:
        return _named(m["rel"], m["x"])

    # A bare "is" needs a capitalised name ("my son is Tom", not "my son is tall").
    @rule(rf"^(?i:my|our) (?P<rel>(?i:{_RELATIVES}|{_PETS})) is (?P<x>{_NAME})$", flags=0)
    def named_is(m: re.Match[str]) -> list[CandidateFact] | None:
        return _named(m["rel"], m["x"])

    @rule(
        rf"^i have (?P<n>a|an|one|two|three|four|five|six|\d) (?P<rel>(?:{_RELATIVES}|{_PETS}|"
        r"kids|children|daughters|sons|brothers|sisters|dogs|cats)s?)"
        rf"(?: (?:named|called) (?P<x>{_NAME}(?: and {_NAME})?))?$"
    )
    def has(m: re.Match[str]) -> list[CandidateFact] | None:
        n, rel = m["n"].lower(), m["rel"].lower()
        text = f"Has {n} {rel}" + (f" named {m['x']}" if m["x"] else "")
        return [
            _fact(text, "has", f"{n} {rel}", category="relationship", role="core", confidence=0.85)
        ]

    @rule(r"^i(?:'m| am) (?P<x>married|divorced|single|engaged|widowed|pregnant)$")
    def status(m: re.Match[str]) -> list[CandidateFact] | None:
        x = m["x"].lower()
        return [
            _fact(
                f"Is {x}",
                "relationship_status",
                x,
                category="relationship",
                role="core",
                confidence=0.85,
            )
        ]

    # --- places -----------------------------------------------------------------------------------
    @rule(
        r"^i (?:used to|once) live(?:d)? in (?P<x>.{2,60}?)(?: (?:in|until|back in) (?P<y>\d{4}))?$"
    )
    def used_to_live(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"])
        when = f" in {m['y']}" if m["y"] else ""
        return [
            _fact(
                f"Used to live in {x}{when}",
                "lived_in",
                x,
                category="profile",
                role="temporal",
                confidence=0.85,
                historical=True,
            )
        ]

    @rule(r"^i lived in (?P<x>.{2,60}?)(?: (?:in|until|from|for|back in) (?P<y>[\w ]{2,20}))?$")
    def lived(m: re.Match[str]) -> list[CandidateFact] | None:
        return used_to_live(m)

    @rule(r"^i (?:no longer|don't|do not) live in (?P<x>.{2,60}?)(?: anymore| any more)?$")
    def no_longer_lives(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"])
        return [
            _fact(
                f"No longer lives in {x}",
                "lives_in",
                x,
                category="profile",
                role="temporal",
                confidence=0.85,
                negated=True,
            )
        ]

    @rule(
        r"^(?:i (?:currently |now |still )?live|i(?:'m| am) (?:currently )?(?:living|based|staying)"
        r"|i(?:'ve| have)? (?:just |recently |finally )?moved|we (?:just |recently )?moved"
        r"|i(?:'m| am) moving) (?:in|to) (?P<x>.{2,60})$"
    )
    def lives(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"])
        return [
            _fact(f"Lives in {x}", "lives_in", x, category="profile", role="core", confidence=0.9)
        ]

    @rule(
        r"^i(?:'m| am) (?:originally )?from (?P<x>.{2,60})$|^i (?:grew up|was born) in (?P<y>.{2,60})$"
    )
    def origin(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"] or m["y"])
        return [
            _fact(f"Is from {x}", "origin", x, category="profile", role="context", confidence=0.85)
        ]

    # --- work ----------------------------------------------------------------------------------------
    @rule(
        r"^i (?:used to|once) work(?:ed)? (?:at|for) (?P<x>.{2,60})$|^i worked (?:at|for) (?P<y>.{2,60})$"
    )
    def worked(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"] or m["y"])
        return [
            _fact(
                f"Used to work at {x}",
                "worked_at",
                x,
                category="profile",
                role="temporal",
                confidence=0.8,
                historical=True,
            )
        ]

    @rule(r"^i (?:currently |now |still )?work (?:at|for) (?P<x>.{2,60})$")
    def works(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"])
        return [
            _fact(f"Works at {x}", "works_at", x, category="profile", role="core", confidence=0.9)
        ]

    @rule(
        rf"^i (?:work|am working) as (?:a |an )?(?P<x>.{{2,60}})$|^i(?:'m| am) (?:a|an) (?P<y>{_JOBS})(?: (?:at|for|in) .{{2,60}})?$"
    )
    def occupation(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"] or m["y"]).lower()
        return [
            _fact(
                f"Works as {'an' if x[:1] in 'aeiou' else 'a'} {x}",
                "occupation",
                x,
                category="profile",
                role="core",
                confidence=0.85,
            )
        ]

    @rule(r"^my (?:job|profession|occupation) is (?P<x>.{2,60})$")
    def job(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"]).lower()
        x = re.sub(r"^(?:a|an) ", "", x)
        return [
            _fact(
                f"Works as {'an' if x[:1] in 'aeiou' else 'a'} {x}",
                "occupation",
                x,
                category="profile",
                role="core",
                confidence=0.85,
            )
        ]

    # --- plans and goals -------------------------------------------------------------------------
    @rule(r"^my (?:main |big )?goal is to (?P<x>.{3,100})$")
    def goal(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"])
        return [
            _fact(f"Goal: {x}", "goal", x.lower(), category="goal", role="context", confidence=0.85)
        ]

    @rule(
        r"^i(?:'m| am) (?:planning|going|hoping|aiming|trying|saving up) to (?P<x>.{3,100})$"
        r"|^i (?:plan|hope|intend|aim) to (?P<y>.{3,100})$"
    )
    def plans(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"] or m["y"])
        if re.match(rf"^(?:{_REQUEST_VERBS})\b", x, re.I):
            return []
        return [
            _fact(
                f"Plans to {x}",
                "plans",
                x.lower(),
                category="goal",
                role="context",
                confidence=0.75,
            )
        ]

    @rule(r"^i (?:really )?(?:want|would like|'d like|d like) to (?P<x>.{3,100})$")
    def wants(m: re.Match[str]) -> list[CandidateFact] | None:
        x = _clean_object(m["x"])
        if re.match(rf"^(?:{_REQUEST_VERBS})\b", x, re.I):
            return []
        return [
            _fact(
                f"Wants to {x}",
                "wants",
                x.lower(),
                category="goal",
                role="context",
                confidence=0.65,
            )
        ]

    return rules


_RULES = _rules()
_REMEMBER = re.compile(
    r"^(?:please |could you |can you |i want you to |i need you to )?(?:remember|note|keep in mind"
    r"|don't forget|do not forget|never forget)(?: that)?[,:]?\s+(?P<x>.{3,300})$",
    re.I,
)


def clauses(text: str) -> list[str]:
    """Sentences and first-person coordinated clauses of an utterance, stripped of fillers."""
    out: list[str] = []
    for sentence in _CLAUSE_SPLIT.split(text):
        for clause in _AND_SPLIT.split(sentence.strip()):
            cleaned = _LEADING.sub("", clause.strip().rstrip(".!?;, "))
            if cleaned:
                out.append(cleaned)
    return out


def facts_from_clause(clause: str) -> list[CandidateFact]:
    """The facts one clause states about its speaker (possibly none)."""
    normalized = clause.replace("\u2019", "'")  # curly apostrophes, as typed on phones
    if match := _REMEMBER.match(normalized):
        inner = match["x"]
        found = [f for part in clauses(inner) for f in facts_from_clause(part)]
        if found:
            return [_boost(f) for f in found]
        note = re.sub(r"^their\s+", "", _clean_object(inner), flags=re.I)
        return [
            _fact(
                _cap(note), "note", note.lower(), category="context", role="core", confidence=0.95
            )
        ]
    for rule in _RULES:
        if match := rule.pattern.match(normalized):
            built = rule.build(match)
            if built is not None:
                return built
    return []


def _boost(fact: CandidateFact) -> CandidateFact:
    """An explicit "remember that" makes the statement as sure as an explicit Remember."""
    return replace(fact, confidence=max(fact.confidence, 0.95))


def _summarize(turns: Sequence[Turn], facts: Sequence[CandidateFact]) -> CandidateEpisode:
    first = next((t for t in turns if t.text.strip()), turns[0])
    topics = sorted({TOPIC_OF_PREDICATE.get(f.predicate, "conversation") for f in facts})
    if facts:
        title = "Talked about " + ", ".join(topics)
        summary = "Said: " + "; ".join(f.content for f in facts)
    else:
        words = first.text.split()
        title = " ".join(words[:8]) + ("…" if len(words) > 8 else "")
        summary = " ".join(t.text.strip() for t in turns)[:400]
    excerpt = first.text.strip()
    if len(excerpt) > 200:
        excerpt = excerpt[:199].rstrip() + "…"
    return CandidateEpisode(
        title=title[:120],
        summary=summary[:1_000],
        excerpt=excerpt,
        source_message_ids=tuple(t.message_id for t in turns),
    )


class RulesExtractor:
    """Deterministic, offline extraction; it has no model, so gray-zone decisions use rules."""

    @property
    def name(self) -> str:
        return "rules"

    async def extract(self, data: ExtractionInput) -> Extraction:
        facts: list[CandidateFact] = []
        seen: set[str] = set()
        for turn in data.turns:
            for clause in clauses(turn.text):
                for fact in facts_from_clause(clause):
                    key = fact.content.casefold()
                    if key in seen:
                        continue
                    seen.add(key)
                    facts.append(
                        replace(
                            fact, source_message_ids=(turn.message_id,), valid_from=turn.sent_at
                        )
                    )
        if not data.turns:
            return Extraction(episode=None)
        topics = tuple(sorted({TOPIC_OF_PREDICATE.get(f.predicate, "conversation") for f in facts}))
        return Extraction(
            episode=_summarize(data.turns, facts),
            facts=tuple(facts[: data.max_facts]),
            topics=topics or ("conversation",),
        )

    async def decide(
        self, candidate: CandidateFact, existing: Sequence[ExistingFact]
    ) -> DecisionResult | None:
        return None

    async def aclose(self) -> None:
        return None
