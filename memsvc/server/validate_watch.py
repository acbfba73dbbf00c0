"""Validation of WatchMemories: proto in, the stream's subject and start out, InvalidArgument."""

from __future__ import annotations

from memsvc.config import Settings
from memsvc.errors import InvalidArgument
from memsvc.memories.watch import WatchSubject
from memsvc.server import validate
from memsvc.v1 import memory_pb2 as pb


def watch(
    request: pb.WatchMemoriesRequest, tenant_id: str, settings: Settings
) -> tuple[WatchSubject, int | None]:
    """scope is required; whole_user takes only scope.user_id (it spans personas and agents);
    after_position, when set, is >= 0 (0: the oldest retained change). Unset: from now."""
    scope = validate.scope(request.scope, tenant_id, settings, present=request.HasField("scope"))
    if request.whole_user and (scope.persona_id or scope.agent_id):
        raise InvalidArgument(
            "whole_user watches every scope of scope.user_id: leave scope.persona_id and "
            "scope.agent_id empty (or drop whole_user to watch that one exact scope)"
        )
    after: int | None = None
    if request.HasField("after_position"):
        after = request.after_position
        if after < 0:
            raise InvalidArgument(
                "after_position: must be >= 0 (a MemoryChange.position, or 0 for the oldest"
                " retained change)"
            )
    return WatchSubject(scope, whole_user=request.whole_user), after
