"""What a query embedding costs on this machine: the local model, in process, one thread.

    python -m bench.embedding [--runs 300]

Times the configured local model (all-MiniLM-L6-v2, int8 products; see embedding/assets.py)
as Recall runs it: one text per run, on the embedder's own thread, awaited from the event
loop. Three query lengths: a voice turn (about 10 tokens), a chat question (about 50) and a
chat paragraph (about 230; the model stops at 256). Prints p50 / p95 / p99 in milliseconds,
with the CPU and the commit, and writes them to bench/results/embedding-*.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import numpy as np
from tokenizers import Tokenizer

from bench.harness import result_paths
from bench.provenance import provenance
from memsvc.embedding.assets import default_tokenizer_path
from memsvc.embedding.onnx_minilm import OnnxMiniLMEmbedder

QUERIES = {
    "voice turn": "Where did my sister move to last spring?",
    "chat question": (
        "I'm planning the trip we talked about a while ago and can't remember the name of the "
        "small hotel near the harbour my brother recommended, or whether he said it had parking."
    ),
    "chat paragraph": " ".join(
        [
            "Last week I finally started the pottery class I kept talking about, and the teacher"
            " said my first bowl was lopsided but honest, which I took as a compliment.",
            "My daughter wants to join on Saturdays, but her swimming practice moved to the same"
            " morning, so we are trying to work out whether the later class would suit her.",
            "Also, remind me what my doctor said about the knee exercises: was it twice a day"
            " or only after running, and did she say to stop if it swells again?",
        ]
        * 2
    ),
}


async def measure(runs: int) -> dict[str, dict[str, float]]:
    embedder = await OnnxMiniLMEmbedder.create()
    tokenizer = Tokenizer.from_file(str(default_tokenizer_path()))
    tokenizer.no_padding()  # the file pads to 128; the embedder runs unpadded
    tokenizer.enable_truncation(256)
    out: dict[str, dict[str, float]] = {}
    try:
        for name, text in QUERIES.items():
            tokens = len(tokenizer.encode(text).ids)
            for _ in range(20):  # warm: the first runs allocate
                await embedder.embed([text])
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                await embedder.embed([text])
                times.append((time.perf_counter() - started) * 1000)
            ms = np.asarray(times)
            out[name] = {
                "tokens": tokens,
                "p50": round(float(np.percentile(ms, 50)), 2),
                "p95": round(float(np.percentile(ms, 95)), 2),
                "p99": round(float(np.percentile(ms, 99)), 2),
            }
            print(
                f"{name:<16} {tokens:>4} tokens: p50 {out[name]['p50']:.2f} ms, "
                f"p95 {out[name]['p95']:.2f}, p99 {out[name]['p99']:.2f}",
                flush=True,
            )
    finally:
        await embedder.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    where = provenance()
    print(f"{where['cpu']} · commit {where['commit']}")
    results = asyncio.run(measure(args.runs))
    out, _ = result_paths("embedding")
    out.write_text(
        json.dumps({"provenance": where, "runs": args.runs, "results": results}, indent=2)
    )
    print(f"written {out}")


if __name__ == "__main__":
    main()
