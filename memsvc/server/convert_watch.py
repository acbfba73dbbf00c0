"""WatchMemories' wire types: a storage Change out as a MemoryChange."""

from __future__ import annotations

from memsvc.storage.changes import Change
from memsvc.v1 import memory_pb2 as pb
from memsvc.wire import convert as wire

_KINDS = {
    "created": pb.CHANGE_KIND_CREATED,
    "superseded": pb.CHANGE_KIND_SUPERSEDED,
    "updated": pb.CHANGE_KIND_UPDATED,
    "forgotten": pb.CHANGE_KIND_FORGOTTEN,
    "expired": pb.CHANGE_KIND_EXPIRED,
    "core_block_updated": pb.CHANGE_KIND_CORE_BLOCK_UPDATED,
    "erased": pb.CHANGE_KIND_ERASED,
    "heartbeat": pb.CHANGE_KIND_HEARTBEAT,
}
_BLOCKS = {"persona": pb.CORE_BLOCK_KIND_PERSONA, "human": pb.CORE_BLOCK_KIND_HUMAN}


def change(value: Change) -> pb.MemoryChange:
    msg = pb.MemoryChange(
        position=value.position,
        kind=_KINDS[value.kind],
        scope=wire.scope(value.scope),
        version=value.version,
        memory_id=str(value.memory_id) if value.memory_id else "",
        superseded_by_id=str(value.superseded_by_id) if value.superseded_by_id else "",
        block=_BLOCKS.get(value.block or "", pb.CORE_BLOCK_KIND_UNSPECIFIED),
    )
    if value.changed_at is not None:
        msg.changed_at.CopyFrom(wire.timestamp(value.changed_at))
    return msg
