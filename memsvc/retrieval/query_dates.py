"""Calendar dates written in a query ("on 25 May, 2022", "in December 2023", "in 2021"):
pure regexes, no model call.

Each date becomes the period it names (a day, a month or a year, in UTC). Only dates with a
year count, and a bare year only after a preposition ("in 2021"): "in May" alone names no
period, "may I", "March on" or "call 555 2020" none at all.
Relative phrases ("yesterday", "last week") are not resolved here: their reference time is
the speaker's, which a stored conversation does not know.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_MONTHS = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
_MONTH = r"(?P<month>" + "|".join(_MONTHS) + r"|jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec)\.?"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_DAY_MONTH_YEAR = re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}\s*,?\s*{_YEAR}\b", re.IGNORECASE)
_MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH}\s+{_DAY}\s*,?\s*{_YEAR}\b", re.IGNORECASE)
_MONTH_YEAR = re.compile(rf"\b{_MONTH}\s*,?\s*(?:of\s+)?{_YEAR}\b", re.IGNORECASE)
# A bare year only after a word that makes it one ("in 2021", "since 2019"): not "call 555 2020".
_YEAR_ONLY = re.compile(
    rf"\b(?:in|of|since|during|by|until|till|before|after|around|from|to|and|year|early|late"
    rf"|mid)\s+{_YEAR}\b(?![-/.:]?\d)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Period:
    """[start, end) in UTC."""

    start: datetime
    end: datetime

    def contains(
        self, moment: datetime, *, slack_before: timedelta, slack_after: timedelta
    ) -> bool:
        return self.start - slack_before <= moment < self.end + slack_after


def _month_number(name: str) -> int:
    prefix = name.lower().rstrip(".")[:3]
    return next(i for i, month in enumerate(_MONTHS, start=1) if month.startswith(prefix))


def _next_month(year: int, month: int) -> datetime:
    return datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)


def periods(text: str) -> tuple[Period, ...]:
    """The periods the query's dates name, most specific form first; none for most queries."""
    found: list[Period] = []
    taken: list[tuple[int, int]] = []

    def free(match: re.Match[str]) -> bool:
        start, end = match.span()
        return all(end <= a or start >= b for a, b in taken)

    for pattern in (_DAY_MONTH_YEAR, _MONTH_DAY_YEAR):
        for m in pattern.finditer(text):
            if not free(m):
                continue
            try:
                day = datetime(int(m["year"]), _month_number(m["month"]), int(m["day"]), tzinfo=UTC)
            except ValueError:  # 31 February: no such day
                continue
            found.append(Period(day, day + timedelta(days=1)))
            taken.append(m.span())
    for m in _MONTH_YEAR.finditer(text):
        if free(m):
            year, month = int(m["year"]), _month_number(m["month"])
            found.append(Period(datetime(year, month, 1, tzinfo=UTC), _next_month(year, month)))
            taken.append(m.span())
    for m in _YEAR_ONLY.finditer(text):
        if free(m):
            year = int(m["year"])
            found.append(
                Period(datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC))
            )
            taken.append(m.span())
    return tuple(found)
