"""The gateway examples run as written, as subprocesses, against the live test server."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from memsvc.server.app import MemsvcServer
from tests.conftest import Caller

ROOT = Path(__file__).resolve().parent.parent


async def run(*argv: str, cwd: Path = ROOT, timeout_s: float = 60.0) -> tuple[int, str]:
    """Run a command without blocking the event loop the test server shares."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(timeout_s):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_voice_gateway_example_runs_a_call(server: MemsvcServer, caller: Caller) -> None:
    code, out = await run(
        sys.executable,
        "examples/voice_gateway.py",
        "--address",
        f"127.0.0.1:{server.port}",
        "--api-key",
        caller.key,
    )
    assert code == 0, out
    assert re.search(r"^setup: prefetch +[\d.]+ ms, cache CACHE_STATUS_\w+, 3 fact", out, re.M), out
    turns = re.findall(
        r"^turn (\d): ingest handed over in +([\d.]+) ms .* memory (used|not used)$", out, re.M
    )
    assert [t[0] for t in turns] == ["1", "2", "3", "4"], out
    # Handing an Ingest over is a queue put, never a network wait.
    assert all(float(t[1]) < 20 for t in turns), out
    assert "Is allergic to peanuts" in out
    assert "end of call: last exchange handed over with end_of_session" in out
    assert "ingest queue: 5 sent, 0 failed, 0 overflowed, 0 abandoned" in out


async def test_voice_gateway_example_without_a_key_is_refused(server: MemsvcServer) -> None:
    code, out = await run(
        sys.executable, "examples/voice_gateway.py", "--address", f"127.0.0.1:{server.port}"
    )
    assert code == 1 and "UNAUTHENTICATED" in out, out


async def test_livekit_example_runs_a_session(server: MemsvcServer, caller: Caller) -> None:
    code, out = await run(
        sys.executable,
        "examples/livekit_agent.py",
        "--address",
        f"127.0.0.1:{server.port}",
        "--api-key",
        caller.key,
        "--word-ms",
        "20",
    )
    assert code == 0, out
    turns = re.findall(
        r"^turn (\d): memory added +[\d.]+ ms \| packet (in context|absent) \| (\d+) memory",
        out,
        re.M,
    )
    assert [t[0] for t in turns] == ["1", "2", "3", "4"], out
    # The seeded facts reach the session's LLM: in the packet and in the turns' memories.
    assert any(t[1] == "in context" for t in turns), out
    assert any(int(t[2]) > 0 for t in turns), out
    # Four user messages and four replies, in five Ingests (the last reply at the close).
    assert "ingest queue: 5 sent, 0 failed" in out, out


NODE = shutil.which("node")
NPM = shutil.which("npm")
TS_DIR = ROOT / "examples" / "ts"


@pytest.mark.skipif(
    NODE is None or NPM is None, reason="Node.js (node and npm) is not on PATH: TS example not run"
)
async def test_typescript_example_prefetches_and_recalls(
    server: MemsvcServer, caller: Caller
) -> None:
    from memsvc.client import MemoryClient, scope
    from memsvc.v1 import memory_pb2 as pb

    async with MemoryClient(f"127.0.0.1:{server.port}", api_key=caller.key) as client:
        await client.remember(
            pb.RememberRequest(scope=scope("alice"), content="Is allergic to peanuts")
        )
    assert NODE is not None and NPM is not None
    # npm ci installs exactly the committed lock file; node_modules is reused when present.
    if not (TS_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        code, out = await run(NPM, "ci", "--no-audit", "--no-fund", cwd=TS_DIR, timeout_s=300)
        assert code == 0, out
    code, out = await run(NPM, "run", "build", cwd=TS_DIR, timeout_s=120)
    assert code == 0, out
    code, out = await run(
        NODE,
        "dist/prefetch_recall.js",
        "--address",
        f"127.0.0.1:{server.port}",
        "--api-key",
        caller.key,
        cwd=TS_DIR,
    )
    assert code == 0, out
    assert re.search(r"^prefetch: \d+ ms, cache CACHE_STATUS_\w+, 1 fact", out, re.M), out
    assert re.search(r"^recall: \d+ ms, 1 item\(s\)", out, re.M), out
    assert "[ITEM_TYPE_FACT] Is allergic to peanuts" in out
