"""What a query's route changes in the final ordering: a per-candidate factor (pure).

Kept only where it raised turn-level recall on the LoCoMo development split (per category,
bench/locomo_eval.py --routing on,off); every other route is neutral (factor 1):

- temporal, the query names a date ("on 25 May, 2022", "in December 2023"): an item that
  occurred in that period (a day of slack before for time zones, a week after because events
  are told after they happen) weighs ``date_weight`` more. Measured: R@10 85.5 -> 89.1 on the
  110 dev questions that name a date.
- temporal, the query asks when ("When did...", "What year...", "How long..."): an item whose
  text states a time ("yesterday", "last week", "in 2022", a weekday, a month) weighs
  ``when_weight`` more: such a question is answered by the message that says when
  (85% of the evidence of dev "when" questions, 17% of all messages).

Measured and dropped (neutral or worse, so not applied): more recency for temporal queries
(old or live conversations alike, +-0.1 R@10) and, for relationship queries, favouring items
that name the query's relation (-0.3 R@10: the lexical leg already matches those words).
Each factor is arithmetic over the candidates the legs returned: no extra round trip.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

from memsvc.retrieval import route as routes
from memsvc.retrieval.query import Hit
from memsvc.retrieval.query_dates import Period, periods


@dataclass(frozen=True)
class RouteWeights:
    date_weight: float = 1.0
    when_weight: float = 0.5
    date_slack_before: timedelta = timedelta(days=1)
    date_slack_after: timedelta = timedelta(days=7)


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# A message that says when something happened or will: a word that does on its own, a year,
# or a phrase ("last week", "3 days", "in May"). Tokens first: most messages hold none of
# the words, and a set lookup is cheaper than the phrase regex over every candidate.
_TIME_WORDS = _words(
    "yesterday today tonight tomorrow ago recently lately earlier soon january february april"
    " june july august september october november december monday tuesday wednesday thursday"
    " friday saturday sunday"
)
_PHRASE_WORDS = _words(
    "days weeks months years may march week weekend month year night morning afternoon"
    " evening summer winter spring fall autumn"
)
_TIME_PHRASE = re.compile(
    r"\b(?:(?:last|next|this|past|coming) (?:week|weekend|month|year|night|morning|afternoon"
    r"|evening|summer|winter|spring|fall|autumn|few (?:days|weeks|months|years))"
    r"|(?:a few|couple of|\d+|one|two|three|several) (?:days|weeks|months|years)"
    r"|(?:in|on|of|since|early|late|mid|last|next|this) (?:may|march)"
    r"|\d\d?(?:st|nd|rd|th)? (?:of )?(?:may|march)|(?:may|march) \d)\b"
)
_TOKEN = re.compile(r"[a-z]+|\d+")


def states_time(text: str) -> bool:
    lowered = text.lower()
    tokens = set(_TOKEN.findall(lowered))
    if not tokens.isdisjoint(_TIME_WORDS):
        return True
    if any(len(t) == 4 and t[:2] in ("19", "20") and t.isdigit() for t in tokens):
        return True
    return not tokens.isdisjoint(_PHRASE_WORDS) and bool(_TIME_PHRASE.search(lowered))


@dataclass(frozen=True)
class RoutePlan:
    """The route of one query and what it changes; ``factor`` multiplies an item's score."""

    route: str
    periods: tuple[Period, ...] = ()
    asks_when: bool = False
    weights: RouteWeights = RouteWeights()

    def factor(self, hit: Hit) -> float:
        boost = 0.0
        w = self.weights
        if self.periods and any(
            p.contains(
                hit.occurred_at, slack_before=w.date_slack_before, slack_after=w.date_slack_after
            )
            for p in self.periods
        ):
            boost += w.date_weight
        if self.asks_when and states_time(hit.text):
            boost += w.when_weight
        return 1.0 + boost


NEUTRAL = RoutePlan(routes.FACT)


def plan(text: str, *, enabled: bool = True, weights: RouteWeights = RouteWeights()) -> RoutePlan:
    """Classify the query; with routing disabled the route is still reported, but neutral."""
    route = routes.classify(text)
    if not enabled or route != routes.TEMPORAL:
        return RoutePlan(route, weights=weights)
    return RoutePlan(route, periods(text), routes.asks_when(text), weights)
