"""An asyncio client for memsvc: deadline presets, safe retries, and a fire-and-forget Ingest."""

from memsvc.client.background import IngestFailure, IngestQueue, IngestQueueStats
from memsvc.client.builders import message, scope
from memsvc.client.client import MemoryClient
from memsvc.client.errors import MemsvcCallError
from memsvc.client.presets import PRESETS, Preset
from memsvc.client.recall_stream import RecallStream
from memsvc.client.retry import RetryPolicy

__all__ = [
    "PRESETS",
    "IngestFailure",
    "IngestQueue",
    "IngestQueueStats",
    "MemoryClient",
    "MemsvcCallError",
    "Preset",
    "RecallStream",
    "RetryPolicy",
    "message",
    "scope",
]
