"""The one retry backoff (memsvc.concurrency.backoff): its bounds, as a pure function."""

from __future__ import annotations

import random

import pytest

from memsvc.concurrency.backoff import backoff_delay


def test_the_ceiling_doubles_from_the_base_up_to_the_cap() -> None:
    # random_unit 0 draws nothing off: the ceiling itself.
    ceilings = [backoff_delay(n, base=2.0, cap=60.0, random_unit=0.0) for n in range(1, 8)]
    assert ceilings == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]


def test_full_jitter_stays_within_zero_and_the_ceiling() -> None:
    rng = random.Random(7)
    for attempt in range(1, 40):
        ceiling = min(300.0, 2.0 * 2 ** (attempt - 1))
        draws = [
            backoff_delay(attempt, base=2.0, cap=300.0, random_unit=rng.random())
            for _ in range(200)
        ]
        assert all(0.0 < d <= ceiling for d in draws)
        # Spread over the whole range, not bunched near the ceiling.
        assert min(draws) < 0.1 * ceiling and max(draws) > 0.9 * ceiling
    assert backoff_delay(3, base=2.0, cap=300.0, random_unit=1.0) == 0.0


def test_partial_jitter_keeps_the_rest_of_the_delay() -> None:
    # The client's default: 80% to 100% of the computed delay.
    assert backoff_delay(1, base=100.0, cap=1_000.0, jitter=0.2, random_unit=0.999) == (
        pytest.approx(80.02)
    )
    assert backoff_delay(2, base=100.0, cap=1_000.0, jitter=0.2, random_unit=0.0) == 200.0
    assert backoff_delay(5, base=2.0, cap=60.0, jitter=0.0, random_unit=0.9) == 32.0


def test_a_huge_attempt_count_is_the_cap_not_an_overflow() -> None:
    assert backoff_delay(10_000, base=2.0, cap=300.0, random_unit=0.0) == 300.0
    assert backoff_delay(10_000, base=0.025, cap=1.0, multiplier=3.0, random_unit=0.5) == 0.5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempt": 0},
        {"base": -1.0},
        {"cap": -1.0},
        {"multiplier": 0.5},
        {"jitter": 1.5},
        {"random_unit": -0.1},
        {"random_unit": 1.5},
    ],
)
def test_nonsense_parameters_are_refused(kwargs: dict[str, float]) -> None:
    args: dict[str, float] = {
        "attempt": 1,
        "base": 1.0,
        "cap": 10.0,
        "random_unit": 0.5,
        "multiplier": 2.0,
        "jitter": 1.0,
    }
    args.update(kwargs)
    attempt = int(args.pop("attempt"))
    with pytest.raises(ValueError):
        backoff_delay(attempt, **args)
