"""What traces cost a Recall: the same open-loop load with tracing off and on.

    python -m bench.tracing_cost [--users 200] [--memories-per-user 50] [--messages-per-user 20]
                                 [--rate 40] [--count 1000] [--rounds 2]

One corpus (bench/corpus.py); `memsvc serve` (workers off) started afresh for each pass,
alternately without tracing and with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at an OTLP sink
in its own process (it accepts every export and counts the spans: the exporter's real work,
serialising and sending, is done). Each pass: text Recalls, every query distinct (each costs
an embedding), at --rate for --count calls, deadline 800 ms, after a 100-call warm-up.
Off and on alternate --rounds times: the machine is shared, so one pair says little.
Results: bench/results/tracing_cost-*.json.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import time
from concurrent import futures
from multiprocessing.sharedctypes import Synchronized
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from bench import corpus
from bench.harness import (
    RESULTS_DIR,
    Phase,
    Target,
    embedded_stack,
    free_port,
    memsvc_server,
    open_loop,
    write_result,
)
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc

DEADLINE_S = 0.8


class _Sink(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, spans: Synchronized[int]) -> None:
        self._spans = spans

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        count = sum(len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans)
        with self._spans.get_lock():
            self._spans.value += count
        return trace_service_pb2.ExportTraceServiceResponse()


def serve_sink(port: int, spans: Synchronized[int]) -> None:
    """An OTLP/gRPC trace receiver that keeps nothing but the count (its own process)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Sink(spans), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


async def recall_pass(target: Target, args: argparse.Namespace, name: str, seed: int) -> Phase:
    rng = random.Random(seed)
    texts = iter(corpus.queries(args.count + 200, seed=seed))
    metadata = (("x-api-key", target.api_key),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{target.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)

        async def call(_i: int) -> str:
            user = f"user-{rng.randrange(args.users):05d}"
            request = pb.RecallRequest(scope=pb.Scope(user_id=user), query=next(texts))
            reply = await stub.Recall(request, metadata=metadata, timeout=DEADLINE_S)
            return "degraded" if reply.degraded else "ok"

        await open_loop("warm-up", call, rate_per_s=args.rate, count=100, deadline_s=DEADLINE_S)
        phase = await open_loop(
            name, call, rate_per_s=args.rate, count=args.count, deadline_s=DEADLINE_S
        )
    print(phase.summary().line(), phase.outcome_counts(), flush=True)
    return phase


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    corpus.add_arguments(parser, users=200, memories_per_user=50, messages_per_user=20)
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    spans: Synchronized[int] = context.Value("q", 0)
    sink_port = free_port()
    sink = context.Process(target=serve_sink, args=(sink_port, spans), daemon=True)
    sink.start()
    phases: list[Phase] = []
    exported: dict[str, int] = {}
    try:
        with embedded_stack() as stack:
            corpus.seed_from_args(stack.pg_dsn, args)
            for round_ in range(args.rounds):
                for traced in (False, True):
                    name = f"Recall text, tracing {'on' if traced else 'off'} #{round_ + 1}"
                    env = {"MEMSVC_RUN_WORKERS": "false"}
                    if traced:
                        env |= {
                            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}",
                            "OTEL_EXPORTER_OTLP_INSECURE": "true",
                        }
                    before = spans.value
                    with memsvc_server(stack, env) as target:
                        phases.append(asyncio.run(recall_pass(target, args, name, seed=round_)))
                        time.sleep(6)  # the batch exporter sends every 5 s
                    exported[name] = spans.value - before
                    print(f"{name}: {exported[name]} spans exported", flush=True)
    finally:
        sink.terminate()
        sink.join()
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"tracing_cost-{time.strftime('%Y%m%d-%H%M%S')}.json"
    write_result(
        path,
        {
            "args": vars(args),
            "phases": [p.as_dict() for p in phases],
            "spans_exported": exported,
        },
        {
            "title": f"Recall with tracing off and on, {args.rate:g} calls/s open loop",
            "rows": [p.summary().as_dict() for p in phases],
            "notes": [f"spans exported per pass: {exported}"],
        },
    )


if __name__ == "__main__":
    main()
