"""RememberBatch and ImportMemories results to their protos."""

from __future__ import annotations

from collections.abc import Sequence

from memsvc.export.importer import ImportResult
from memsvc.memories.batch import ItemResult
from memsvc.v1 import memory_pb2 as pb
from memsvc.wire import convert as wire


def remember_batch_response(results: Sequence[ItemResult]) -> pb.RememberBatchResponse:
    out = pb.RememberBatchResponse()
    for result in results:
        item = out.results.add(index=result.index, ok=result.done is not None)
        if result.done is not None:
            done = result.done
            item.response.CopyFrom(
                pb.RememberResponse(
                    memory=wire.memory(done.record),
                    reinforced=done.reinforced,
                    redactions=done.redactions,
                    displaced=[wire.memory(r) for r in done.displaced],
                )
            )
            out.succeeded += 1
        else:
            assert result.error is not None
            item.error_code = result.error.code.name
            item.error_message = result.error.message
            out.failed += 1
    return out


def import_response(result: ImportResult) -> pb.ImportMemoriesResponse:
    def counts(kind: str) -> pb.ImportCounts:
        return pb.ImportCounts(imported=result.imported[kind], skipped=result.skipped[kind])

    return pb.ImportMemoriesResponse(
        memories=counts("memory"),
        episodes=counts("episode"),
        topics=counts("topic"),
        messages=counts("message"),
        lines=result.lines,
        core_blocks=counts("core_block"),
    )
