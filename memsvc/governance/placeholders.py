"""Placeholders of redacted personal data: ``[redacted card number]``, one per kind.

What the screen (governance/pii.py) writes in place of a span, and what later steps must
recognise and keep whole: extraction copies them verbatim, the pipeline finds the kinds a
text derived from redacted messages holds (also when a parser split a bracket off, or
damaged the label after its first word). Plain regular expressions only: imported by the
parser process, which has no use for the detectors' dependencies.
"""

from __future__ import annotations

import re

# Human wording: the label in the stored text; in governance.policy.PII_KINDS order.
LABELS = {
    "card_number": "card number",
    "government_id": "government id",
    "bank_account": "bank account",
    "password": "password",
    "secret": "secret",
    "one_time_code": "one-time code",
    "email": "email",
    "phone": "phone number",
}


def placeholder(kind: str) -> str:
    """The visible replacement of one span: ``[redacted card number]``."""
    return f"[redacted {LABELS[kind]}]"


def _label_pattern(label: str) -> str:
    """A label as a parser may have spaced it out: "one - time code" for "one-time code"."""
    words = (r"\s*-\s*".join(map(re.escape, w.split("-"))) for w in label.split())
    return r"\s+".join(words)


_LABEL_ALTERNATIVES = "|".join(_label_pattern(label) for label in LABELS.values())
# A placeholder, also with a bracket split off or lost by a parser ("[ redacted phone number");
# at least one bracket must be there: "I redacted email addresses" is no placeholder.
_PLACEHOLDER = re.compile(
    rf"\[\s*redacted\s+(?P<a>{_LABEL_ALTERNATIVES})(?:\s*\])?"
    rf"|(?<!\[)\bredacted\s+(?P<b>{_LABEL_ALTERNATIVES})\s*\]",
    re.I,
)
_KIND_OF_LABEL = {label: kind for kind, label in LABELS.items()}


def _kind_of(match: re.Match[str]) -> str:
    label = match.group("a") or match.group("b")
    return _KIND_OF_LABEL[re.sub(r"\s*-\s*", "-", re.sub(r"\s+", " ", label)).lower()]


# A placeholder whose label was damaged after its first word ("[redacted government the
# userd]", a parser's doing): still the kind of its first word. Only with its opening
# bracket, so prose ("I redacted email addresses") is not mistaken for one.
_DAMAGED = re.compile(
    r"\[\s*redacted\s+(?P<first>"
    + "|".join(sorted({re.escape(label.split()[0].split("-")[0]) for label in LABELS.values()}))
    + r")\b",
    re.I,
)
_KIND_OF_FIRST_WORD = {label.split()[0].split("-")[0]: kind for kind, label in LABELS.items()}


def placeholder_spans(text: str) -> list[tuple[int, int]]:
    """Where the text holds placeholders (start, end): what no later step may edit inside
    (extraction renders a sentence in the third person around them, never within)."""
    if "redacted" not in text.lower():
        return []
    return [m.span() for m in _PLACEHOLDER.finditer(text)]


def tidy_placeholders(text: str) -> str:
    """Placeholders written back whole where a parser split or lost a bracket."""
    if "redacted" not in text.lower():
        return text
    return _PLACEHOLDER.sub(lambda m: placeholder(_kind_of(m)), text)


def placeholder_kinds(text: str) -> tuple[str, ...]:
    """The kinds whose placeholder the text holds (redacted earlier: text derived from a
    stored message, which Ingest screened), in PII_KINDS order."""
    if "redacted" not in text.lower():
        return ()
    found = {_kind_of(m) for m in _PLACEHOLDER.finditer(text)}
    found |= {_KIND_OF_FIRST_WORD[m.group("first").lower()] for m in _DAMAGED.finditer(text)}
    return tuple(k for k in LABELS if k in found)
