"""Text embedding: the Embedder protocol, its errors, and the shipped implementations."""

from memsvc.embedding.base import Embedder, EmbeddingError

__all__ = ["Embedder", "EmbeddingError"]
