"""An Embedder that takes its callers' texts one at a time in a fair order across tenants.

The workers' background embedder has one inference thread, which ran calls first come first
served: one tenant's job embedding eight 8,000-character messages held it for 1.4-3.8 s on a
busy 2-core machine, and another tenant's one-line job waited all of that (issue 31). Here
each text is a turn of its own, given by concurrency.FairTurns to the caller's owner
(concurrency.owner: the job's tenant, then user), so another tenant's text waits for one text
in hand at most. The backend runs one text at a time anyway (onnx_minilm), so nothing is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from memsvc.concurrency.fair_queue import FairTurns
from memsvc.concurrency.owner import current_owner
from memsvc.embedding.base import Embedder, EmbeddingTimeout, WrappedEmbedder, as_text_list


class FairEmbedder(WrappedEmbedder):
    """Wraps one embedder with ``slots`` texts in hand at once (its inference threads); the
    wrapped embedder belongs to whoever built it: :meth:`aclose` leaves it open."""

    def __init__(self, inner: Embedder, *, slots: int = 1) -> None:
        super().__init__(inner)
        self._turns = FairTurns(slots)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inner!r})"

    async def embed(
        self, texts: Sequence[str], *, timeout_s: float | None = None
    ) -> npt.NDArray[np.float32]:
        items = as_text_list(texts)
        if not items:
            return await self._inner.embed(items, timeout_s=timeout_s)
        tenant, user = current_owner()
        loop = asyncio.get_running_loop()
        # One budget for the call, waits for turns included.
        deadline = None if timeout_s is None else loop.time() + timeout_s
        rows = []
        try:
            async with asyncio.timeout_at(deadline):
                for text in items:
                    async with self._turns.turn(tenant, user):
                        left = None if deadline is None else max(0.0, deadline - loop.time())
                        rows.append(await self._inner.embed([text], timeout_s=left))
        except TimeoutError as exc:
            raise EmbeddingTimeout("the embedding did not finish within its budget") from exc
        return rows[0] if len(rows) == 1 else np.concatenate(rows)
