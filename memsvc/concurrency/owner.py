"""Whose work the current task does: (tenant, user), for the queues served fairly by owner.

The worker sets it for the task that runs a job (`working_for`); a parse or an embedding
asked by that task or its children waits its turn as that tenant's and user's. Work of
nobody's job (a test, a tool, the reconcile task) shares one owner, ("", "").
"""

from __future__ import annotations

import contextvars

Owner = tuple[str, str]

_OWNER: contextvars.ContextVar[Owner] = contextvars.ContextVar(
    "memsvc_work_owner", default=("", "")
)


def working_for(tenant_id: str, user_id: str) -> None:
    """The current task's work (and its children's, created after this) is (tenant, user)'s."""
    _OWNER.set((tenant_id, user_id))


def current_owner() -> Owner:
    return _OWNER.get()
