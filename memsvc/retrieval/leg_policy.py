"""Whether the lexical leg's answer makes the dense leg unnecessary (pure).

The dense leg costs the query embedding, the largest share of a Recall's CPU; it pays when
the query's words are not what the answer says ("What does she do to relax?" answered by
"I paint on weekends"). When the best lexical match already holds every word of the query,
the dense leg rarely changes the top of the answer: on the LoCoMo development split that
is 34% of the questions, and answering them from the lexical leg alone moved hybrid R@10
from 80.4 to 80.2 (bench/locomo_eval.py; per dev conversation -2.1 to +0.9). The rule
has no fitted constant: all of the query's words, as the lexical leg counts them (stemmed,
stop words left out), is the only threshold.
"""

from __future__ import annotations

from collections.abc import Sequence

from memsvc.retrieval.query import Hit

# The share of the query's distinct lexemes the best match must hold: all of them.
FULL_COVERAGE = 1.0


def lexical_suffices(hits: Sequence[Hit]) -> bool:
    """True when the lexical leg's best hit (the first) holds every lexeme of the query."""
    if not hits:
        return False
    coverage = hits[0].coverage
    return coverage is not None and coverage >= FULL_COVERAGE
