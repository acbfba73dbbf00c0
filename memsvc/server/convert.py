"""Write-path values (ingest status) to proto messages (pure)."""

from __future__ import annotations

from memsvc.storage.outbox import JobStatus
from memsvc.v1 import memory_pb2 as pb
from memsvc.wire.convert import timestamp

_INGEST_STATES = {
    "pending": pb.INGEST_STATE_PENDING,
    "processing": pb.INGEST_STATE_PROCESSING,
    "done": pb.INGEST_STATE_DONE,
    "dead": pb.INGEST_STATE_DEAD,
}


def ingest_status(status: JobStatus) -> pb.IngestStatus:
    known = {f.name for f in pb.ExtractionOutcome.DESCRIPTOR.fields}
    msg = pb.IngestStatus(
        ingest_id=str(status.ingest_id),
        state=_INGEST_STATES.get(status.state, pb.INGEST_STATE_UNSPECIFIED),
        attempts=status.attempts,
        last_error=status.last_error,
        outcome=pb.ExtractionOutcome(**{k: v for k, v in status.result.items() if k in known}),
        session_id=status.session_id,
        created_at=timestamp(status.created_at),
    )
    if status.finished_at is not None:
        msg.finished_at.CopyFrom(timestamp(status.finished_at))
    return msg
