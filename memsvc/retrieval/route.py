"""How a query is classified ("fact", "temporal", "relationship", "vector"): pure rules.

The route is cheap (a few regexes, no model call) and is reported in every Recall answer.
What a route changes in the ordering is decided in route_effects; it never filters anything.
"""

from __future__ import annotations

import re

FACT = "fact"
TEMPORAL = "temporal"
RELATIONSHIP = "relationship"
VECTOR = "vector"

# "May" and "March" are also a verb and a modal: months only next to a day, a year or a
# preposition ("in May", "3 March", "March 2023"), never in "may I" or "march on".
_AMBIGUOUS_MONTH = (
    r"(?:(?:in|on|of|since|until|till|by|before|after|during|early|late|mid|last|next|this)"
    r"\s+(?:may|march)"
    r"|\d\d?(?:st|nd|rd|th)?\s+(?:of\s+)?(?:may|march)"
    r"|(?:may|march)\s+\d)"
)
_TEMPORAL = re.compile(
    r"\b(when|what time|what day|which day|what date|which date|the date"
    r"|(?:what|which) (?:year|month|week|season)|how long|how often|ago"
    r"|yesterday|today|tonight|tomorrow|recently|lately"
    r"|(?:last|next|this) (?:week|weekend|month|year|time|night|summer|winter|spring|fall)"
    r"|before|after|since|until|first time|anniversary|birthday"
    r"|january|february|april|june|july|august|september|october|november|december"
    r"|monday|tuesday|wednesday|thursday|friday|saturday|sunday"
    r"|(?:19|20)\d\d|" + _AMBIGUOUS_MONTH + r")\b",
    re.IGNORECASE,
)
# Phrasal verbs whose "after"/"since" carries no time: "looks after the dog".
_NOT_TEMPORAL = re.compile(
    r"\b(?:look(?:s|ed|ing)?|take(?:s|n)?|took|named|ask(?:s|ed|ing)?|chase(?:s|d)?) after\b",
    re.IGNORECASE,
)
# A question asking for a time or a duration: its answer is a message that says when.
_ASKS_WHEN = re.compile(
    r"^\W*(?:(?:and|so|but|then|ok(?:ay)?|hey)\W+)*"
    r"(?:when\b|since when\b|what time\b|at what time\b|how long\b"
    r"|(?:in |on |during )?(?:what|which) (?:year|month|day|date|week|season)\b)",
    re.IGNORECASE,
)
_RELATIONSHIP = re.compile(
    r"\b(mom|mum|mother|dad|father|parents?|wife|husband|partner|spouse|sons?|daughters?"
    r"|kids?|children|child|sisters?|brothers?|siblings?|friends?|boss|colleagues?|coworkers?"
    r"|girlfriend|boyfriend|fianc[ée]e?|grand(?:ma|pa|mother|father|parents?|son|daughter)"
    r"|aunt|uncle|cousins?|nieces?|nephews?|in-laws?|step(?:mom|mother|dad|father)"
    r"|roommates?|teammates?|mentor|family|neighbou?rs?|married|relationship)\b",
    re.IGNORECASE,
)


def classify(text: str) -> str:
    """The route of a query; ``vector`` when there is no text (a caller-supplied vector)."""
    if not text.strip():
        return VECTOR
    if _TEMPORAL.search(_NOT_TEMPORAL.sub(" ", text)):
        return TEMPORAL
    if _RELATIONSHIP.search(text):
        return RELATIONSHIP
    return FACT


def asks_when(text: str) -> bool:
    """True for a question about a time or duration ("When did...", "What year...",
    "How long..."), as opposed to one that merely mentions a time."""
    return bool(_ASKS_WHEN.search(text))
