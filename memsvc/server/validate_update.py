"""Validation of UpdateMemory and GetMemory: proto in, domain values out, InvalidArgument on
anything wrong (naming the field), before anything is read or written.

What depends on the stored memory (SESSION needs its session_id, "ttl" alone needs a TTL
memory) is checked by the service under the row lock, still before anything is written.
"""

from __future__ import annotations

import math
import uuid

from memsvc.config import Settings
from memsvc.errors import InvalidArgument
from memsvc.server import validate
from memsvc.storage import retention
from memsvc.storage.model import UPDATE_PATHS, MemoryUpdate, Scope, Sharing
from memsvc.v1 import memory_pb2 as pb

_RETENTION = {
    pb.RETENTION_POLICY_USER_CONTROLLED: retention.USER_CONTROLLED,
    pb.RETENTION_POLICY_SESSION: retention.SESSION,
    pb.RETENTION_POLICY_TTL: retention.TTL,
}


def mask_paths(request: pb.UpdateMemoryRequest) -> tuple[str, ...]:
    """The mask's paths, known and deduplicated, in UPDATE_PATHS order."""
    given = list(request.update_mask.paths)
    if not given:
        raise InvalidArgument(
            f"update_mask: required; name the fields to change ({', '.join(UPDATE_PATHS)})"
        )
    for i, path in enumerate(given):
        if path not in UPDATE_PATHS:
            raise InvalidArgument(
                f"update_mask.paths[{i}]: not a path UpdateMemory changes; one of "
                f"{', '.join(UPDATE_PATHS)}"
            )
    return tuple(p for p in UPDATE_PATHS if p in given)


def ttl_seconds(request: pb.UpdateMemoryRequest) -> float:
    """The request's ttl in seconds, within Remember's bounds (1 s .. 10 years)."""
    if not request.HasField("ttl"):
        raise InvalidArgument("ttl: required when update_mask names it")
    ttl = request.ttl
    if not -999_999_999 <= ttl.nanos <= 999_999_999 or (ttl.seconds * ttl.nanos < 0):
        raise InvalidArgument("ttl: not a valid duration (seconds and nanos disagree)")
    seconds = ttl.seconds + ttl.nanos / 1e9
    if not validate.MIN_TTL_S <= seconds <= validate.MAX_TTL_S:
        raise InvalidArgument(
            f"ttl: between {validate.MIN_TTL_S} s and 10 years ({validate.MAX_TTL_S} s)"
        )
    return seconds


def _retention(
    request: pb.UpdateMemoryRequest, paths: tuple[str, ...], settings: Settings
) -> tuple[str, float | None]:
    """(policy, seconds to live from now) for the retention paths of the mask."""
    ttl = ttl_seconds(request) if "ttl" in paths else None
    if "retention_policy" not in paths:
        # "ttl" alone re-arms a TTL memory's expiry (the service checks it is one).
        return "", ttl
    policy = _RETENTION.get(request.retention_policy)
    if policy is None:
        raise InvalidArgument(
            "retention_policy: one of RETENTION_POLICY_USER_CONTROLLED, "
            "RETENTION_POLICY_SESSION, RETENTION_POLICY_TTL"
        )
    if policy == retention.TTL:
        if ttl is None:
            raise InvalidArgument(
                'update_mask: retention_policy RETENTION_POLICY_TTL needs "ttl" in the mask too'
            )
        return policy, ttl
    if ttl is not None:
        raise InvalidArgument("ttl: only with retention_policy RETENTION_POLICY_TTL")
    if policy == retention.SESSION:
        return policy, float(settings.session_retention_s)
    return policy, None


def update_memory(request: pb.UpdateMemoryRequest, settings: Settings) -> MemoryUpdate:
    """A well-formed UpdateMemory (memory_id is validated by the caller)."""
    paths = mask_paths(request)
    confidence = 0.0
    if "confidence" in paths:
        confidence = request.confidence
        if math.isnan(confidence) or not 0.0 < confidence <= 1.0:
            raise InvalidArgument("confidence: must be more than 0 and at most 1")
    policy, expires_in_s = _retention(request, paths, settings)
    return MemoryUpdate(
        paths=paths,
        pinned=request.pinned,
        category=(
            _vocabulary(request.category, "category", settings.categories)
            if "category" in paths
            else ""
        ),
        role=_vocabulary(request.role, "role", settings.roles) if "role" in paths else "",
        sharing=Sharing(request.sharing.all_agents, request.sharing.all_personas),
        retention_policy=policy,
        expires_in_s=expires_in_s,
        confidence=confidence,
        reason=validate.short_text(request.reason, "reason", settings.max_reason_chars),
    )


def _vocabulary(value: str, field: str, allowed: tuple[str, ...]) -> str:
    """A vocabulary value, required (an update never falls back to a default)."""
    if not value.strip():
        raise InvalidArgument(
            f"{field}: required when update_mask names it; one of {', '.join(allowed)}"
        )
    return validate.vocabulary(value, field, allowed, "")


def memory_ref(
    scope_msg: pb.Scope, present: bool, memory_id: str, tenant: str, settings: Settings
) -> tuple[Scope, uuid.UUID]:
    """The scope and memory id of an UpdateMemory or GetMemory."""
    scope = validate.scope(scope_msg, tenant, settings, present=present)
    return scope, validate.memory_id(memory_id)
