"""The payload of an ingest job: what Ingest stores beside the messages, read back strictly."""

from __future__ import annotations

from dataclasses import dataclass

from memsvc.ingest.failures import InvalidJobPayload


@dataclass(frozen=True)
class JobPayload:
    """How the session ended, its goals, and the persona the user spoke with."""

    end_of_session: bool = False
    goals: tuple[str, ...] = ()
    counterpart_persona_id: str = ""
    # The Ingest call's W3C traceparent when tracing is on: its extraction job's span links
    # to it (only the worker's tracing reads it; the pipeline ignores it).
    traceparent: str | None = None

    def as_json(self) -> dict[str, object]:
        stored: dict[str, object] = {
            "end_of_session": self.end_of_session,
            "goals": list(self.goals),
            "counterpart_persona_id": self.counterpart_persona_id,
        }
        if self.traceparent:
            stored["traceparent"] = self.traceparent
        return stored


def traceparent_of(raw: object) -> str | None:
    """The traceparent an Ingest stored in its job's payload, if any (never raises: a
    trace is never a reason to fail a job)."""
    if isinstance(raw, dict):
        value = raw.get("traceparent")
        if isinstance(value, str) and len(value) <= 128:
            return value
    return None


def parse_payload(raw: object) -> JobPayload:
    """The stored JSON as a JobPayload; a missing key takes its default, an unknown one is
    ignored (a newer writer), a value of the wrong type raises InvalidJobPayload: every
    attempt would read the same row."""
    if not isinstance(raw, dict):
        raise InvalidJobPayload(f"the payload is a JSON {type(raw).__name__}, not an object")
    end_of_session = raw.get("end_of_session", False)
    if not isinstance(end_of_session, bool):
        raise InvalidJobPayload("payload.end_of_session must be true or false")
    goals = raw.get("goals", [])
    if not isinstance(goals, list) or not all(isinstance(g, str) for g in goals):
        raise InvalidJobPayload("payload.goals must be a list of strings")
    persona = raw.get("counterpart_persona_id", "")
    if not isinstance(persona, str):
        raise InvalidJobPayload("payload.counterpart_persona_id must be a string")
    return JobPayload(end_of_session, tuple(goals), persona)
