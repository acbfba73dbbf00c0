"""overload/shed_log.py: shed reads are counted each, logged once per interval.

Under overload a server refuses hundreds of reads a second; a line each would flood the log
(and cost the loop) exactly when an operator reads it.
"""

from __future__ import annotations

import logging

import pytest

from memsvc.errors import Overloaded, ResourceExhausted
from memsvc.observability import metrics
from memsvc.overload import shed_log
from memsvc.overload.read_gate import InFlightLimit
from memsvc.server.servicer import answer_for


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process log that has written no line yet (the product keeps one per process)."""
    monkeypatch.setattr(shed_log, "_shed_log", shed_log.ShedLog())


def _shed_total() -> float:
    return metrics.READS_SHED._value.get()


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == shed_log.__name__]


def test_a_line_when_shedding_starts_then_one_per_interval_with_the_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = _shed_total()
    with caplog.at_level(logging.WARNING):
        shed_log.shed("this server is saturated", clock=100.0)
        for i in range(499):  # 500 refusals within the interval
            shed_log.shed("this server is saturated", clock=100.0 + i * 0.01)
        shed_log.shed("this machine's CPUs are saturated", clock=100.0 + shed_log.INTERVAL_S)
    assert _shed_total() - before == 501  # every one counted
    lines = _lines(caplog)
    assert len(lines) == 2, lines
    assert lines[0].startswith("shedding reads"), lines
    assert lines[1].startswith("shed 500 reads in the last 10 s"), lines
    assert lines[1].endswith("latest: this machine's CPUs are saturated"), lines


def test_a_refused_read_is_overloaded_and_answer_for_does_not_log_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limit = InFlightLimit(1)
    with caplog.at_level(logging.INFO), limit.slot():
        with pytest.raises(Overloaded) as refused, limit.slot():
            pass
        for _ in range(100):
            error = answer_for("Recall", refused.value)
            assert error.code.name == "RESOURCE_EXHAUSTED" and error.retry_after_s
    per_call = [r for r in caplog.records if "answered" in r.getMessage()]
    assert not per_call, [r.getMessage() for r in per_call]
    assert len(_lines(caplog)) == 1
    # A tenant's own quota is not shed load: still a line per call.
    with caplog.at_level(logging.INFO):
        answer_for("ListMemories", ResourceExhausted("rate limit of this tenant"))
    assert any(r.getMessage() == "ListMemories answered RESOURCE_EXHAUSTED" for r in caplog.records)
