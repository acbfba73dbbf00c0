"""A validated Ingest request, as the edge hands it to the write path."""

from __future__ import annotations

from dataclasses import dataclass

from memsvc.storage.messages import StoredMessage
from memsvc.storage.model import Scope


@dataclass(frozen=True)
class IngestCommand:
    """A validated Ingest request."""

    scope: Scope
    session_id: str
    messages: tuple[StoredMessage, ...]
    idempotency_key: str
    end_of_session: bool = False
    goals: tuple[str, ...] = ()
    counterpart_persona_id: str = ""
