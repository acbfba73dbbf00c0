"""A packet's wire form (the contract's PrefetchResponse), which is also its cache form.

Caching the serialized message makes a hit one protobuf parse (C code) instead of decoding
JSON into dataclasses and converting those field by field; the body is stored without the
session header, which is added per call.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from memsvc.prefetch.model import (
    CORE,
    EPISODES,
    HUMAN_BLOCK,
    PERSONA,
    PERSONA_BLOCK,
    RELEVANT,
    Packet,
)
from memsvc.storage.model import EpisodeRecord
from memsvc.v1 import memory_pb2 as pb
from memsvc.wire.convert import memory, scope, timestamp


class CodecError(ValueError):
    """Cached bytes that cannot be read (treated as a miss)."""


def episode(record: EpisodeRecord) -> pb.Episode:
    return pb.Episode(
        episode_id=str(record.episode_id),
        scope=scope(record.scope),
        session_id=record.session_id,
        title=record.title,
        summary=record.summary,
        excerpt=record.excerpt,
        source_message_ids=list(record.source_message_ids),
        started_at=timestamp(record.started_at),
        ended_at=timestamp(record.ended_at),
        topics=list(record.topics),
    )


def to_proto(packet: Packet) -> pb.PrefetchResponse:
    """The packet as the contract's message; ``text`` holds the body (no header yet)."""

    def count(name: str) -> pb.SectionCount:
        c = packet.counts.get(name)
        return pb.SectionCount(shown=c.shown, total=c.total) if c else pb.SectionCount()

    def chars(name: str) -> pb.BlockCount:
        c = packet.counts.get(name)
        return pb.BlockCount(shown_chars=c.shown, total_chars=c.total) if c else pb.BlockCount()

    return pb.PrefetchResponse(
        text=packet.body,
        facts=[memory(r) for r in packet.facts],
        episodes=[episode(e) for e in packet.episodes],
        counts=pb.PacketCounts(
            persona=count(PERSONA),
            core=count(CORE),
            relevant=count(RELEVANT),
            episodes=count(EPISODES),
            persona_block=chars(PERSONA_BLOCK),
            human_block=chars(HUMAN_BLOCK),
        ),
        version=packet.version,
        degraded=packet.degraded,
        withheld=list(packet.withheld),
    )


def encode(packet: Packet) -> bytes:
    return to_proto(packet).SerializeToString()


def decode(raw: bytes) -> pb.PrefetchResponse:
    try:
        return pb.PrefetchResponse.FromString(raw)
    except DecodeError as exc:
        raise CodecError("unreadable cached packet") from exc
