"""The post-filter: every hit re-checked against the caller's scope in code (pure).

The SQL of every leg already filters by scope; this is the second line, so that a future
query bug cannot leak another user's, persona's or agent's memory into an answer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from memsvc.retrieval.query import Hit
from memsvc.storage.model import MemoryRecord, Scope

log = logging.getLogger(__name__)


def _visible(scope: Scope, own: Scope, *, all_agents: bool, all_personas: bool) -> bool:
    """storage.conditions.visible in code: same tenant and user; persona and agent equal,
    unless explicitly shared across them. all_personas crosses persona scopes only: the
    human's own scope (persona_id "") and the persona scopes never see each other."""
    same_persona = own.persona_id == scope.persona_id or (
        all_personas and own.persona_id != "" and scope.persona_id != ""
    )
    return (
        own.tenant_id == scope.tenant_id
        and own.user_id == scope.user_id
        and same_persona
        and (own.agent_id == scope.agent_id or all_agents)
    )


def visible(scope: Scope, hit: Hit) -> bool:
    """Whether the caller's scope may see the hit."""
    return _visible(
        scope,
        hit.scope,
        all_agents=hit.shared_all_agents,
        all_personas=hit.shared_all_personas,
    )


def memory_visible(scope: Scope, record: MemoryRecord) -> bool:
    """The same rule for a memory row outside a Hit (Prefetch's sections)."""
    return _visible(
        scope,
        record.scope,
        all_agents=record.sharing.all_agents,
        all_personas=record.sharing.all_personas,
    )


def keep_visible(scope: Scope, hits: Iterable[Hit]) -> list[Hit]:
    """The visible hits, in order; anything else is dropped and logged as a bug."""
    kept: list[Hit] = []
    for hit in hits:
        if visible(scope, hit):
            kept.append(hit)
        else:
            log.error("post-filter dropped a %s outside the caller's scope", hit.kind.value)
    return kept
