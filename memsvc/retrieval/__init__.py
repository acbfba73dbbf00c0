"""The read path's Recall.

Concurrent dense and lexical legs under the call's deadline, fused by RRF; and the recorder of
what reads returned.

What other services may use (Prefetch ranks topics and facts against its hint with the same legs
and fusion; the memory services record what reads returned) is exported here; every other name
is this package's own (tests/test_layers.py holds the other services to it).
"""

from memsvc.retrieval.dense import dense_hits
from memsvc.retrieval.embed_cache import QueryEmbedder, Vector
from memsvc.retrieval.fusion import rrf
from memsvc.retrieval.lexical import cjk_patterns, lexical_hits
from memsvc.retrieval.query import Hit, ItemKind
from memsvc.retrieval.references import ReferenceRecorder
from memsvc.retrieval.scope_filter import keep_visible, memory_visible

__all__ = [
    "Hit",
    "ItemKind",
    "QueryEmbedder",
    "ReferenceRecorder",
    "Vector",
    "cjk_patterns",
    "dense_hits",
    "keep_visible",
    "lexical_hits",
    "memory_visible",
    "rrf",
]
