"""Validation of ExportMemories: proto in, the export's subject out, InvalidArgument."""

from __future__ import annotations

from memsvc.config import Settings
from memsvc.errors import InvalidArgument
from memsvc.server import validate
from memsvc.storage.export import Subject
from memsvc.v1 import memory_pb2 as pb


def export(request: pb.ExportMemoriesRequest, tenant_id: str, settings: Settings) -> Subject:
    """scope is required; whole_user takes only scope.user_id (it spans personas and agents)."""
    scope = validate.scope(request.scope, tenant_id, settings, present=request.HasField("scope"))
    if request.whole_user and (scope.persona_id or scope.agent_id):
        raise InvalidArgument(
            "whole_user exports everything about scope.user_id: leave scope.persona_id and "
            "scope.agent_id empty (or drop whole_user to export that one exact scope)"
        )
    return Subject(scope, whole_user=request.whole_user)
