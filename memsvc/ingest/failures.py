"""Why an ingest job failed, and whether another attempt can help: retry or abort.

Decided by exception class and SQLSTATE (asyncpg has one class per SQLSTATE), never by an
error's message. Transient failures (a lost connection, a timeout, an unavailable embedder or
extractor, a serialization failure or deadlock) are retried with backoff. Permanent ones (a
value or row the database rejects, a bad stored payload, an extractor's unusable result) make
the job dead at once: every attempt would read the same rows and fail the same way, and while
a job waits for its retry the same user's later jobs wait behind it.

An exception nobody expected is a bug: it is aborted too (and logged with its stack by the
worker). Retrying it would fail the same way up to the last attempt, hold the user's later
turns back for the whole backoff schedule, and hide the bug in ``pending``; a dead job is
visible in GetIngestStatus, in memsvc_ingest_dead_total and in the log. The price is that a
transient condition surfacing as an unforeseen class kills one job; its stack names the class
to add here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import asyncpg

from memsvc.embedding import EmbeddingError
from memsvc.errors import DeadlineExceeded, MemsvcError, ResourceExhausted, Unavailable
from memsvc.extraction.base import ExtractionError
from memsvc.storage.errors import DATABASE_DOWN, PERMANENT_SQLSTATES, TRANSIENT_SQLSTATES


class Verdict(enum.Enum):
    """What a failed attempt leads to (a successful one is simply done)."""

    RETRY = "retry"
    ABORT = "abort"


@dataclass(frozen=True)
class Failure:
    """A classified failure: the verdict, the reason GetIngestStatus shows, and whether it is
    a bug (the worker logs those with their stack)."""

    verdict: Verdict
    reason: str
    unexpected: bool = False


class PermanentJobError(Exception):
    """A failure no retry can fix: the job is dead at once, with this class as its reason."""


class InvalidJobPayload(PermanentJobError):
    """The job's stored payload is not what Ingest writes."""


class InvalidExtraction(PermanentJobError):
    """The extractor returned something other than an Extraction of candidate facts."""


class SpeakerFailures(Exception):
    """Some speakers of a job failed (others committed); the job is retried for them."""

    def __init__(self, failures: dict[str, BaseException]) -> None:
        kinds = sorted({type(e).__name__ for e in failures.values()})
        super().__init__(f"{len(failures)} speaker(s) failed: {', '.join(kinds)}")
        self.failures = failures


# What one speaker's processing may raise without being a bug: the pipeline records it,
# goes on with the other speakers, and the job's verdict is decided from all of them.
SPEAKER_ERRORS: tuple[type[BaseException], ...] = (
    ExtractionError,
    PermanentJobError,
    *DATABASE_DOWN,
)

_TRANSIENT: tuple[type[BaseException], ...] = (
    # Client side: a closed connection or pool, a protocol left mid-message, a schema cache
    # out of date after a migration.
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    # The job's deadline, an acquire, a statement, an embedding or extractor call.
    TimeoutError,
    EmbeddingError,
    # The Extractor contract: its endpoint failed, or a sampled answer did not validate (a
    # model may answer well next time).
    ExtractionError,
    Unavailable,
    ResourceExhausted,
    DeadlineExceeded,
)


def reason_of(exc: BaseException) -> str:
    """Class names and SQLSTATEs only: a message may quote a user's text."""
    if isinstance(exc, SpeakerFailures):
        kinds = sorted({reason_of(e) for e in exc.failures.values()})
        return f"SpeakerFailures: {', '.join(kinds)}"
    if isinstance(exc, asyncpg.PostgresError):
        return f"{type(exc).__name__} ({exc.sqlstate})"
    return type(exc).__name__


def _verdict(exc: BaseException) -> tuple[Verdict, bool]:
    """(verdict, unexpected) of one exception."""
    if isinstance(exc, SpeakerFailures):
        verdicts = [_verdict(e) for e in exc.failures.values()]
        # Committed speakers are skipped on the next attempt; while any failed one may yet
        # succeed, the job is worth another attempt.
        retry = any(v is Verdict.RETRY for v, _ in verdicts)
        return (Verdict.RETRY if retry else Verdict.ABORT), any(u for _, u in verdicts)
    if isinstance(exc, PermanentJobError):
        return Verdict.ABORT, False
    if isinstance(exc, asyncpg.PostgresError):
        if isinstance(exc, TRANSIENT_SQLSTATES):
            return Verdict.RETRY, False
        if isinstance(exc, PERMANENT_SQLSTATES):
            return Verdict.ABORT, False
        # A refusal of a kind not foreseen (XX000, a trigger's RAISE): the server's condition,
        # not our code, so it gets the bounded retries.
        return Verdict.RETRY, False
    if isinstance(exc, asyncpg.InterfaceError) and isinstance(exc, ValueError):
        # asyncpg's client-side DataError (an argument it cannot encode) and configuration
        # errors: the same call fails the same way.
        return Verdict.ABORT, False
    if isinstance(exc, _TRANSIENT):
        return Verdict.RETRY, False
    if isinstance(exc, MemsvcError):
        return Verdict.ABORT, False  # InvalidArgument and the like: the input is at fault
    return Verdict.ABORT, True


def classify(exc: BaseException) -> Failure:
    """Retry or abort, and why (see the module docstring)."""
    verdict, unexpected = _verdict(exc)
    reason = reason_of(exc)
    return Failure(verdict, f"unexpected {reason}" if unexpected else reason, unexpected)
