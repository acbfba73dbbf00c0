"""Validation of RememberBatch and ImportMemories: proto in, domain values out."""

from __future__ import annotations

from collections.abc import AsyncIterable
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from memsvc.config import Settings
from memsvc.errors import InvalidArgument, ResourceExhausted
from memsvc.memories.batch import BatchItem
from memsvc.server import validate
from memsvc.storage.model import Scope
from memsvc.v1 import memory_pb2 as pb

# RememberBatchRequest.items: 1..100 (the proto's limit).
MAX_BATCH_ITEMS = 100


def remember_batch(
    request: pb.RememberBatchRequest, tenant_id: str, settings: Settings
) -> list[BatchItem]:
    """Each item validated as Remember validates it, its scope its own or the batch's. A bad
    batch (item count, batch scope) is INVALID_ARGUMENT; a bad item is returned as its error
    (unprefixed: the service names the item), so a non-atomic batch can answer it alone."""
    count = len(request.items)
    if not 1 <= count <= MAX_BATCH_ITEMS:
        raise InvalidArgument(f"items: 1 to {MAX_BATCH_ITEMS} per call, got {count}")
    batch_scope: Scope | None = None
    if request.HasField("scope"):
        batch_scope = validate.scope(request.scope, tenant_id, settings)
    items: list[BatchItem] = []
    for item in request.items:
        try:
            if item.HasField("scope"):
                scope = validate.scope(item.scope, tenant_id, settings)
            elif batch_scope is not None:
                scope = batch_scope
            else:
                raise InvalidArgument(
                    "scope: required (set the batch's scope, or this item's own scope)"
                )
            items.append(BatchItem(scope, validate.remember(item, settings)))
        except InvalidArgument as exc:
            items.append(BatchItem(error=exc))
    return items


@dataclass(frozen=True)
class ImportStream:
    """An ImportMemories stream read whole: the target, and each line with its number."""

    scope: Scope
    keep_record_scopes: bool
    lines: list[tuple[int, str]]


async def import_stream(
    requests: AsyncIterable[pb.ImportMemoriesRequest], tenant_id: str, settings: Settings
) -> ImportStream:
    """Read the stream: the scope on the first message (later ones leave it unset or repeat
    it), the lines numbered from 1 (a message may carry several, one per line; blank ones
    are ignored), at most MEMSVC_IMPORT_MAX_LINES of them and MEMSVC_IMPORT_MAX_BYTES of text
    (RESOURCE_EXHAUSTED beyond); a message that is not an ImportMemoriesRequest is
    INVALID_ARGUMENT."""
    target: Scope | None = None
    keep = False
    lines: list[tuple[int, str]] = []
    size = 0
    messages = aiter(requests)
    while True:
        try:
            message = await anext(messages)
        except StopAsyncIteration:
            break
        except DecodeError:
            raise InvalidArgument(
                "a stream message is not a valid ImportMemoriesRequest; nothing was written"
            ) from None
        size += len(message.json)
        if size > settings.import_max_bytes:
            raise ResourceExhausted(
                f"an import takes at most {settings.import_max_bytes:,} bytes of lines "
                "(MEMSVC_IMPORT_MAX_BYTES); split the export by scope and import each; "
                "nothing was written"
            )
        if target is None:
            if not message.HasField("scope"):
                raise InvalidArgument("scope: required on the first message of the stream")
            target = validate.scope(message.scope, tenant_id, settings)
            keep = message.keep_record_scopes
            if keep and (target.persona_id or target.agent_id):
                raise InvalidArgument(
                    "keep_record_scopes keeps each record's persona_id and agent_id: leave "
                    "scope.persona_id and scope.agent_id empty (or drop keep_record_scopes to "
                    "import everything into that one exact scope)"
                )
        elif message.HasField("scope"):
            again = validate.scope(message.scope, tenant_id, settings)
            if again != target:
                raise InvalidArgument(
                    "scope: differs from the first message's; one import goes to one scope"
                )
        for text in message.json.split("\n"):
            if not text.strip():
                continue
            if len(lines) >= settings.import_max_lines:
                raise ResourceExhausted(
                    f"an import takes at most {settings.import_max_lines:,} lines "
                    "(MEMSVC_IMPORT_MAX_LINES); split the export by scope and import each; "
                    "nothing was written"
                )
            lines.append((len(lines) + 1, text))
    if target is None:
        raise InvalidArgument("scope: required (the stream carried no message)")
    return ImportStream(target, keep, lines)
