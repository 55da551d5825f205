"""What request traces cost a server: ``infernetes bench serve`` against the same model, prompts and
engine arguments three ways in one run — no tracing, ``--otlp-traces-endpoint`` at a live
OTLP/gRPC receiver (grpcio with OpenTelemetry's protobuf service, in this process), and at an
address where nothing listens (a collector that is gone). Reports output tokens/s and median /
p99 time to first token of each, as ratios to the untraced server (target: within noise, about
0.95 or better, for both traced runs), and the spans the live receiver got.

Rounds alternate between the three and the best round of each counts (other load on a shared
machine only ever slows a round down).

    python -m bench tracing_overhead [--num-prompts 96] [--concurrency 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from concurrent import futures
from pathlib import Path

from bench._server import free_port, random_dataset
from bench.serve_vs_offline import SHAPES, _make_model, describe_shape, serve_round

TARGET_RATIO = 0.95


class _Receiver:
    """An OTLP/gRPC trace receiver that counts the spans exported to it."""

    def __init__(self) -> None:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        self.spans = 0
        receiver = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):  # the gRPC service's method name
                receiver.spans += sum(
                    len(scope.spans)
                    for spans in request.resource_spans
                    for scope in spans.scope_spans
                )
                return trace_service_pb2.ExportTraceServiceResponse()

        port = free_port()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.server)
        self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.stop(grace=None)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench tracing_overhead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", help="model directory (default: a generated Llama of --shape)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="toy")
    parser.add_argument("--num-prompts", type=int, default=96)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of the engine")
    args = parser.parse_args(argv)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    receiver = _Receiver()
    dead = f"http://127.0.0.1:{free_port()}"
    variants = {
        "untraced": [],
        "traced, live receiver": ["--otlp-traces-endpoint", receiver.endpoint],
        "traced, receiver gone": ["--otlp-traces-endpoint", dead],
    }
    dataset = random_dataset(args.num_prompts, args.input_len, args.output_len)
    results: dict[str, list[dict]] = {name: [] for name in variants}
    try:
        with tempfile.TemporaryDirectory(prefix="tracing-overhead-") as tmp:
            work = Path(tmp)
            model = args.model or str(_make_model(work / "model", args.shape))
            engine_args = [
                model,
                "--max-num-seqs",
                str(args.concurrency),
                "--seed",
                "0",
                "--max-model-len",
                str(2 * (args.input_len + args.output_len)),
            ]
            for round_index in range(args.rounds):
                for index, (name, extra) in enumerate(variants.items()):
                    out = work / f"round-{round_index}-{index}.json"
                    serve_round(
                        [*engine_args, *extra],
                        dataset,
                        args.concurrency,
                        out,
                        work / "server.log",
                        env,
                    )
                    result = json.loads(out.read_text())
                    results[name].append(result)
                    print(
                        f"round {round_index + 1} {name}: {result['output_throughput']:.1f} "
                        f"tok/s, TTFT median {result['median_ttft_ms']:.1f} ms, "
                        f"p99 {result['p99_ttft_ms']:.1f} ms",
                        flush=True,
                    )
    finally:
        receiver.stop()
    print(
        f"model: {args.model or describe_shape(args.shape)}; {args.num_prompts} prompts, input "
        f"{args.input_len}, output {args.output_len}; concurrency {args.concurrency}; "
        f"best of {args.rounds} rounds; cpu count {os.cpu_count()}"
    )
    base = _best(results["untraced"])
    print("| server | output tok/s | ratio | TTFT median ms | ratio | TTFT p99 ms | ratio |")
    print("|---|---|---|---|---|---|---|")
    worst = 1.0
    for name in variants:
        best = _best(results[name])
        ratios = (
            best["output_throughput"] / base["output_throughput"],
            base["median_ttft_ms"] / best["median_ttft_ms"],
            base["p99_ttft_ms"] / best["p99_ttft_ms"],
        )
        worst = min(worst, ratios[0], ratios[1])
        print(
            f"| {name} | {best['output_throughput']:.1f} | {ratios[0]:.3f} | "
            f"{best['median_ttft_ms']:.1f} | {ratios[1]:.3f} | {best['p99_ttft_ms']:.1f} | "
            f"{ratios[2]:.3f} |"
        )
    expected = args.rounds * args.num_prompts
    print(f"spans received by the live receiver: {receiver.spans} of {expected} requests")
    print(f"worst throughput / median-TTFT ratio: {worst:.3f} (target >= {TARGET_RATIO})")
    return 0


def _best(rounds: list[dict]) -> dict:
    """Each figure's best round (higher throughput, lower latencies)."""
    return {
        "output_throughput": max(r["output_throughput"] for r in rounds),
        "median_ttft_ms": min(r["median_ttft_ms"] for r in rounds),
        "p99_ttft_ms": min(r["p99_ttft_ms"] for r in rounds),
    }
