"""Relevance of a Recall item to its query, 0..1, comparable with RecallFilters.min_score
(pure).

With the query embedded (hybrid and dense modes): the cosine similarity of the item's
embedding to the query's, clipped to 0..1. The dense leg returns it as a distance; a hit only
the lexical leg found carries its stored embedding, so every item gets the same measure.
Without a query vector (lexical mode, or the embedding missed the deadline), or for an item
not embedded yet: the share of the query's distinct words (stemmed lexemes, stop words
out) the item's own text contains.

The default minimum (MEMSVC_RECALL_MIN_RELEVANCE) was chosen on the LoCoMo development split
with all-MiniLM-L6-v2 (bench/locomo_eval.py --min-scores, see docs/read-path.md): cosine scales
differ between embedding models, so a deployment with another model re-measures it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from memsvc.retrieval.fusion import Fused


def cosine(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.dot(a, b)) / norm if norm > 0 else 0.0


def relevance(item: Fused, vector: npt.NDArray[np.float32] | None) -> float:
    """The item's relevance, given the query's vector (None: not embedded)."""
    hit = item.hit
    similarity: float | None = None
    if vector is not None:
        if hit.coverage is None:
            # A dense-leg hit (only lexical hits carry a coverage): score is the distance.
            similarity = 1.0 - hit.score
        elif hit.embedding is not None:
            similarity = cosine(vector, hit.embedding)
    if similarity is None:
        similarity = hit.coverage or 0.0
    return min(1.0, max(0.0, similarity))
