"""wire/convert.py: timestamps computed by hand (for speed) equal protobuf's FromDatetime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from memsvc.wire import convert as wire

ZONES = st.sampled_from(
    [None, UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]
)


def _protobufs(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


@given(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    ZONES,
)
def test_timestamp_equals_from_datetime(naive: datetime, zone: timezone | None) -> None:
    value = naive if zone is None else naive.replace(tzinfo=zone)
    assert wire.timestamp(value) == _protobufs(value)


def test_timestamp_edges() -> None:
    for value in (
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),  # negative seconds
        datetime(2026, 12, 3, 20, 45, 1, 123_456, tzinfo=UTC),
        datetime(2026, 12, 3, 20, 45, 1, 123_456),  # naive: taken as UTC
    ):
        got = wire.timestamp(value)
        assert got == _protobufs(value), value
        assert 0 <= got.nanos < 1_000_000_000
