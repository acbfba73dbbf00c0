"""How a query is classified ("fact", "temporal", "relationship", "vector"): pure rules.

The route is reported in the response and shifts the final ordering (a temporal question
weighs recency more); it never filters anything out.
"""

from __future__ import annotations

import re

FACT = "fact"
TEMPORAL = "temporal"
RELATIONSHIP = "relationship"
VECTOR = "vector"

_TEMPORAL = re.compile(
    r"\b(when|what time|what day|which day|date|dates|yesterday|today|tonight|tomorrow|ago"
    r"|last (?:week|month|year|time|night)|next (?:week|month|year)|before|after|since"
    r"|until|recently|lately|first time|how long|anniversary|birthday"
    r"|january|february|march|april|june|july|august|september|october|november"
    r"|december|monday|tuesday|wednesday|thursday|friday|saturday|sunday"
    r"|(?:19|20)\d\d)\b",
    re.IGNORECASE,
)
_RELATIONSHIP = re.compile(
    r"\b(mom|mum|mother|dad|father|parents?|wife|husband|partner|spouse|son|daughter"
    r"|kids?|children|child|sister|brother|siblings?|friends?|boss|colleagues?|coworkers?"
    r"|girlfriend|boyfriend|fianc[ée]e?|grand(?:ma|pa|mother|father|parents?)|aunt|uncle"
    r"|cousin|family|neighbou?r|married|relationship)\b",
    re.IGNORECASE,
)


def classify(text: str) -> str:
    """The route of a query; ``vector`` when there is no text (a caller-supplied vector)."""
    if not text.strip():
        return VECTOR
    if _TEMPORAL.search(text):
        return TEMPORAL
    if _RELATIONSHIP.search(text):
        return RELATIONSHIP
    return FACT
