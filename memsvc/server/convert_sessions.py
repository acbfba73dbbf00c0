"""Sessions and episodes to their wire messages."""

from __future__ import annotations

from memsvc.prefetch import codec
from memsvc.storage.model import EpisodeRecord
from memsvc.storage.sessions import SessionRow
from memsvc.v1 import memory_pb2 as pb
from memsvc.wire.convert import timestamp


def session(row: SessionRow) -> pb.SessionInfo:
    return pb.SessionInfo(
        session_id=row.session_id,
        first_message_at=timestamp(row.first_message_at),
        last_message_at=timestamp(row.last_message_at),
        message_count=row.message_count,
        fact_count=row.fact_count,
        episode_count=row.episode_count,
        ended=row.ended,
    )


def episode(record: EpisodeRecord) -> pb.Episode:
    """As Prefetch shows it."""
    return codec.episode(record)
