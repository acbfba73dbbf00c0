"""SQL for the reserved persona topic (the other topics are written by extraction)."""

from __future__ import annotations

import uuid

from memsvc.storage.connection import Connection
from memsvc.storage.model import Scope

# One per persona scope; is_persona marks it, the name only has to be unique in the scope.
PERSONA_TOPIC_NAME = "__persona__"


async def ensure_persona_topic(conn: Connection, scope: Scope) -> uuid.UUID:
    """The scope's persona topic, created on first use.

    Prefetch renders the facts reached from it (through its episodes) as the persona
    section: what was written about the persona. Link a persona-describing episode to it
    with storage.extraction.link, and bump the user's version in the same transaction.
    """
    topic_id: uuid.UUID = await conn.fetchval(
        """
        INSERT INTO topics (tenant_id, user_id, persona_id, agent_id, topic_id, name, is_persona)
        VALUES ($1, $2, $3, $4, $5, $6, true)
        ON CONFLICT (tenant_id, user_id, persona_id, agent_id, name)
            DO UPDATE SET is_persona = true
        RETURNING topic_id
        """,
        scope.tenant_id,
        scope.user_id,
        scope.persona_id,
        scope.agent_id,
        uuid.uuid4(),
        PERSONA_TOPIC_NAME,
    )
    return topic_id
