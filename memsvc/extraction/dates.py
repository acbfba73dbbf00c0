"""Relative dates resolved against the time a message was sent, and written absolute.

dateparser does the resolution ("yesterday", "last month", "in two weeks", "last Friday",
"two days ago") and reports the precision it found (day, week, month, year); this module
decides which phrases are relative and how each precision reads in a standalone fact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from dateparser.date import DateDataParser

# A DATE entity is resolved only when it is anchored to the moment of speaking: these words
# make it so. "ten years" (a duration) or "2019" (already absolute) are left as said.
_MONTHS = (
    "january|february|march|april|may|june|july|august|september|october|november|december"
    "|jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec"
)
_RELATIVE = re.compile(
    r"\b(?:yesterday|today|tonight|tomorrow|ago|last|next|this|coming|past|previous"
    r"|monday|tuesday|wednesday|thursday|friday|saturday|sunday|weekend|in (?:a|an|one|two"
    r"|three|four|five|six|seven|eight|nine|ten|a few|\d+) (?:day|week|month|year)s?"
    rf"|{_MONTHS})\b",
    re.IGNORECASE,
)
_YEAR = re.compile(r"\b\d{4}\b")
_WHICH = r"(?:(?P<which>this|last|next|the|past|coming) )?"
_SEASON = re.compile(rf"^{_WHICH}(?P<season>spring|summer|fall|autumn|winter)$", re.IGNORECASE)
# Fixed-date holidays (month, day); movable feasts are left as said.
_HOLIDAYS = {
    "christmas": (12, 25),
    "christmas day": (12, 25),
    "christmas eve": (12, 24),
    "new year's eve": (12, 31),
    "new year's day": (1, 1),
    "new year's": (1, 1),
    "new year": (1, 1),
    "halloween": (10, 31),
    "valentine's day": (2, 14),
    "valentine's": (2, 14),
}
_HOLIDAY = re.compile(rf"^{_WHICH}(?P<day>{'|'.join(sorted(_HOLIDAYS, key=len, reverse=True))})$")
_SEASON_START = {"spring": 3, "summer": 6, "fall": 9, "autumn": 9, "winter": 12}
_NEXT_MONTH = re.compile(rf"^(?P<which>next|last|this|coming|past) (?P<month>{_MONTHS})$", re.I)
# Past-looking phrases (dateparser resolves bare weekdays to the past by default).
_FUTURE_WORDS = re.compile(r"\b(?:next|tomorrow|coming|in (?:a|an|\w+) \w+)\b", re.IGNORECASE)
_WEEKEND = re.compile(r"^(?:(?P<which>this|last|next|the) )?weekend$", re.IGNORECASE)
_FILLER = re.compile(r"^(?:on|by|since|until|from|during|at|about|around|over) ", re.IGNORECASE)


@dataclass(frozen=True)
class ResolvedDate:
    """An absolute date and how precise the phrase was: day, week, weekend, month or year."""

    when: datetime
    period: str

    def render(self) -> str:
        """The phrase a standalone fact uses in place of the relative one."""
        if self.period == "year":
            return f"in {self.when.year}"
        if self.period == "month":
            return f"in {self.when:%B} {self.when.year}"
        if self.period == "week":
            return f"in the week of {day_text(self.when)}"
        if self.period == "weekend":
            return f"on the weekend of {day_text(self.when)}"
        if self.period.startswith("season:"):
            return f"in the {self.period.split(':', 1)[1]} of {self.when.year}"
        return f"on {day_text(self.when)}"


def day_text(when: datetime) -> str:
    """'7 May 2023': no leading zero, the month in full (the LoCoMo observations' form)."""
    return f"{when.day} {when:%B} {when.year}"


def is_relative(phrase: str) -> bool:
    """Anchored to the moment of speaking: "yesterday", "in March", "last Christmas"; not
    "March 2019" or "ten years"."""
    if _YEAR.search(phrase):
        return False
    return bool(_RELATIVE.search(phrase) or _SEASON.match(phrase) or _HOLIDAY.match(phrase))


def _shift(which: str | None, candidate: datetime, base: datetime, future: bool) -> datetime:
    """The occurrence of a yearly date meant by this / last / next (or the tense)."""
    which = (which or "").lower()
    if which in ("last", "past") or (which in ("", "the", "this") and not future):
        while candidate > base:
            candidate = candidate.replace(year=candidate.year - 1)
        return candidate
    while candidate < base:
        candidate = candidate.replace(year=candidate.year + 1)
    if which == "next" and candidate.year == base.year and candidate.month <= base.month + 1:
        candidate = candidate.replace(year=candidate.year + 1)
    return candidate


def resolve(phrase: str, sent_at: datetime, *, future: bool = False) -> ResolvedDate | None:
    """The absolute date of a relative phrase said at `sent_at`; None when not relative.

    `future`: the statement looks ahead (a plan, or the present tense: "I start on Monday"),
    so a bare weekday or month is the next one rather than the last."""
    text = _FILLER.sub("", phrase.strip().lower().replace("\u2019", "'"))
    if not is_relative(text):
        return None
    base = sent_at.astimezone(UTC).replace(tzinfo=None)
    if weekend := _WEEKEND.match(text):
        # dateparser has no notion of a weekend: the Saturday of the week meant.
        saturday = base + timedelta(days=(5 - base.weekday()))
        which = (weekend["which"] or "this").lower()
        if which == "last" or (which in ("this", "the") and not future and saturday > base):
            saturday -= timedelta(days=7)
        elif which == "next":
            saturday += timedelta(days=7) if saturday > base else timedelta(days=14)
        return ResolvedDate(saturday.replace(tzinfo=UTC), "weekend")
    if season := _SEASON.match(text):
        name = season["season"].lower()
        which = (season["which"] or "").lower()
        start = base.replace(month=_SEASON_START[name], day=1, hour=0, minute=0, second=0)
        if which == "this":
            pass  # this year's
        elif which in ("last", "past") or (not which and not future):
            if start + timedelta(days=90) > base:
                start = start.replace(year=start.year - 1)
        elif start <= base:
            start = start.replace(year=start.year + 1)
        return ResolvedDate(start.replace(tzinfo=UTC), f"season:{name}")
    if holiday := _HOLIDAY.match(text):
        month, day = _HOLIDAYS[holiday["day"]]
        when = _shift(
            holiday["which"], base.replace(month=month, day=day, hour=0, minute=0), base, future
        )
        return ResolvedDate(when.replace(tzinfo=UTC), "day")
    if named := _NEXT_MONTH.match(text):
        text = named["month"]
        future = named["which"].lower() in ("next", "coming") or (
            named["which"].lower() == "this" and future
        )
    future = future or bool(_FUTURE_WORDS.search(text))
    # A parser per call (about 1 ms): its settings carry the reference time.
    parser = DateDataParser(
        languages=["en"],
        settings={"RELATIVE_BASE": base, "PREFER_DATES_FROM": "future" if future else "past"},
    )
    data = parser.get_date_data(text)
    if data.date_obj is None:
        return None
    period = data.period if data.period in ("day", "week", "month", "year") else "day"
    when = data.date_obj
    if future and period == "month" and (when.year, when.month) == (base.year + 1, base.month):
        when = when.replace(year=base.year)  # "in November", said in November: this one
    if period == "week" and text.endswith(" ago"):
        period = "day"  # "three weeks ago" names a day, give or take
    return ResolvedDate(when.replace(tzinfo=UTC), period)
