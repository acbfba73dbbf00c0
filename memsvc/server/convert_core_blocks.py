"""Core-block domain values to their proto messages."""

from __future__ import annotations

from memsvc.memories.core_blocks import APPEND, HUMAN, PERSONA, REPLACE, CoreBlockView
from memsvc.storage.core_blocks import Revision
from memsvc.v1 import memory_pb2 as pb
from memsvc.wire import convert as wire

KINDS = {PERSONA: pb.CORE_BLOCK_KIND_PERSONA, HUMAN: pb.CORE_BLOCK_KIND_HUMAN}
MODES = {REPLACE: pb.CORE_BLOCK_MODE_REPLACE, APPEND: pb.CORE_BLOCK_MODE_APPEND}


def block(view: CoreBlockView) -> pb.CoreBlock:
    message = pb.CoreBlock(
        block=KINDS[view.block],
        scope=wire.scope(view.scope),
        text=view.text,
        limit_chars=view.limit_chars,
        used_chars=view.used_chars,
        facts=[wire.memory(r) for r in view.facts],
        revision=view.revision,
        author=view.author,
    )
    if view.updated_at is not None:
        message.updated_at.CopyFrom(wire.timestamp(view.updated_at))
    return message


def revision(found: Revision) -> pb.CoreBlockRevision:
    message = pb.CoreBlockRevision(
        revision=found.revision,
        text=found.text,
        mode=MODES.get(found.mode, pb.CORE_BLOCK_MODE_UNSPECIFIED),
        author=found.author,
        reason=found.reason,
        recorded_at=wire.timestamp(found.recorded_at),
    )
    if found.replaced_at is not None:
        message.replaced_at.CopyFrom(wire.timestamp(found.replaced_at))
    return message
