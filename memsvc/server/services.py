"""The services one gRPC servicer serves, handed to it as one object (the runtime builds them)."""

from __future__ import annotations

from dataclasses import dataclass

from memsvc.export.importer import ImportService
from memsvc.export.service import ExportService
from memsvc.ingest.service import IngestService
from memsvc.memories.batch import BatchService
from memsvc.memories.core_blocks import CoreBlockService
from memsvc.memories.service import MemoryService
from memsvc.memories.sessions import SessionService
from memsvc.memories.watch import ChangeStream
from memsvc.prefetch.service import PrefetchService
from memsvc.retrieval.recall import RecallService


@dataclass(frozen=True)
class Services:
    memories: MemoryService
    ingest: IngestService
    recall: RecallService
    prefetch: PrefetchService
    export: ExportService
    batch: BatchService
    importer: ImportService
    sessions: SessionService
    core_blocks: CoreBlockService
    changes: ChangeStream
