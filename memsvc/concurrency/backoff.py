"""Exponential backoff with jitter: the one retry delay of the client and the workers (pure)."""

from __future__ import annotations

# The exponent stops growing here: any real cap is reached long before, and a float power
# of a large attempt count would overflow.
_MAX_EXPONENT = 64


# Not `backoff` or `tenacity`: both own the retry loop, and neither loop fits ours (a job's
# retry is a row's available_at; the client's is bounded by a gRPC deadline and a server
# hint), and their delay functions draw from the global `random`. This is the whole policy.
def backoff_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    random_unit: float,
    multiplier: float = 2.0,
    jitter: float = 1.0,
) -> float:
    """The pause after failed attempt ``attempt`` (1-based), in the unit of ``base`` and ``cap``.

    The ceiling is ``min(cap, base * multiplier ** (attempt - 1))``; up to ``jitter`` of it is
    taken off at random: ``ceiling * (1 - jitter * random_unit)``. ``jitter`` 1.0 is full
    jitter (uniform over the ceiling: retries of many callers spread out the most); 0.0 is
    the plain exponential. ``random_unit`` is the caller's draw in [0, 1) (``rng.random()``),
    so the function stays pure and a test can pass a fixed one.
    """
    if attempt < 1:
        raise ValueError(f"attempt is 1-based, got {attempt}")
    if base < 0 or cap < 0 or multiplier < 1:
        raise ValueError("base and cap must be >= 0 and multiplier >= 1")
    if not 0.0 <= jitter <= 1.0 or not 0.0 <= random_unit <= 1.0:
        raise ValueError("jitter and random_unit must be within [0, 1]")
    ceiling = min(cap, base * multiplier ** min(attempt - 1, _MAX_EXPONENT))
    return ceiling * (1.0 - jitter * random_unit)
