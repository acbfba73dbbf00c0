"""The current call's request id, RPC name and tenant, carried by contextvars for the logs.

The server's interceptor sets the request id and RPC when a handler starts, the servicer adds
the tenant once the caller is authenticated. Tasks started by the handler (retrieval legs)
copy the context, so their log lines carry the same ids.
"""

from __future__ import annotations

import contextvars

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "memsvc_request_id", default=None
)
rpc: contextvars.ContextVar[str | None] = contextvars.ContextVar("memsvc_rpc", default=None)
tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("memsvc_tenant", default=None)
