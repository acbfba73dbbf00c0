"""The digest of an Ingest request as stored: what tells a retry from a reused idempotency key.

Taken of the command after the PII screen, so the digest says nothing about the sent text
that the stored rows do not already hold (a digest of the clear text would let whoever reads
the table confirm a guessed card number). Two requests that differ only inside a redacted
span therefore count as the same request, which is what a retry looks like anyway.
"""

from __future__ import annotations

import hashlib

import orjson

from memsvc.ingest.command import IngestCommand

# Bumped if the digested fields ever change: a row of another version is compared by scope only.
_VERSION = "v1"


def request_digest(command: IngestCommand) -> str:
    """A hex SHA-256 of the scope (persona, agent), session, messages, goals and flags."""
    scope = command.scope
    canonical = orjson.dumps(
        [
            _VERSION,
            scope.persona_id,
            scope.agent_id,
            command.session_id,
            [
                [
                    m.message_id,
                    m.role,
                    m.sender_id,
                    m.sender_name,
                    m.text,
                    m.sent_at.isoformat(),
                ]
                for m in command.messages
            ],
            list(command.goals),
            command.end_of_session,
            command.counterpart_persona_id,
        ]
    )
    return f"{_VERSION}:{hashlib.sha256(canonical).hexdigest()}"
