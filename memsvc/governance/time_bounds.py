"""When a stored time may be: from 1900 up to a day after now, on every path in.

A fact (Remember's valid_from), a message (Ingest's sent_at) and every record an import
brings (valid_from, recorded_at, sent_at...) obey the same rule: a time past now (plus a
day for clock skew) is a plan or a unit mistake, not something that happened, and would be
stored as current all the same (a home fact "valid from 2099" ranks as active today).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
# The allowance for clock skew after the server's clock.
FUTURE_SKEW = timedelta(days=1)

RULE = "from 1900 up to 1 day after now"


def within(value: datetime, *, now: datetime | None = None) -> bool:
    """Whether ``value`` (timezone-aware) obeys the rule at ``now`` (default: the clock)."""
    latest = (now or datetime.now(UTC)) + FUTURE_SKEW
    return EARLIEST <= value <= latest
