"""decode: one request's decode tokens/s against the memory-bandwidth limit (weight bytes per
token over the copy and the nominal bandwidth), and with --enforce-eager for the graphs' gain."""

from __future__ import annotations

import argparse
import json
from typing import Any

from bench._gpu import NOMINAL_BANDWIDTH, against_bound, copy_bandwidth, nominal
from bench._llama8b.model import PartRunner, llm, model_config, weight_bytes_per_token, workload


def part_decode(args: argparse.Namespace, **overrides: Any) -> dict:
    from infernetes import SamplingParams

    engine = llm(args, **overrides)
    prompt = workload(
        argparse.Namespace(**{**vars(args), "requests": 1, "min_len": 128, "max_len": 128}),
        model_config(args)["vocab_size"],
    )[0][0]
    params = SamplingParams(temperature=0.0, max_tokens=args.decode_tokens, ignore_eos=True)
    engine.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    )  # warm-up
    [out] = engine.generate([prompt], params)
    m = out.metrics
    decode_s = m.finished_time - m.first_token_time
    graphs = engine.llm_engine.engine_core.executor.driver_worker.model_runner.decode_graphs
    return {
        "decode_tokens_per_s": (len(out.outputs[0].token_ids) - 1) / decode_s,
        "ttft_s": m.first_token_time - m.arrival_time,
        "graph_sizes": len(graphs.sizes) if graphs else 0,
        "graph_capture_s": graphs.capture_seconds if graphs else 0.0,
        "graph_replays": sum(graphs.replays.values()) if graphs else 0,
    }


def part_decode_eager(args: argparse.Namespace) -> dict:
    return part_decode(args, enforce_eager=True)


PARTS = {"decode": part_decode, "decode-eager": part_decode_eager}


def measure(run: PartRunner, args: argparse.Namespace, results: dict) -> None:
    results["copy_bandwidth"] = copy_bandwidth(1 << 20 if run.smoke else 1 << 30)
    results["decode"] = run("decode")
    if not json.loads(args.engine_args).get("enforce_eager"):
        results["decode-eager"] = run("decode-eager")


def report(device_name: str, config: dict, results: dict) -> None:
    per_token = weight_bytes_per_token(config)
    d = results["decode"]
    tps = d["decode_tokens_per_s"]
    print(
        f"decode: {tps:.1f} tok/s single stream; weights read per token {per_token / 1e9:.2f} GB; "
        f"TTFT {d['ttft_s'] * 1e3:.0f} ms"
    )
    print("  " + against_bound("copy-bandwidth limit", tps, results["copy_bandwidth"] / per_token))
    bandwidth = nominal(NOMINAL_BANDWIDTH, device_name)
    if bandwidth:
        print("  " + against_bound("nominal-bandwidth limit", tps, bandwidth / per_token))
    print(
        f"  CUDA graphs: {d['graph_sizes']} sizes captured in {d['graph_capture_s']:.1f} s, "
        f"{d['graph_replays']} decode steps replayed"
    )
    if "decode-eager" in results:
        eager = results["decode-eager"]["decode_tokens_per_s"]
        print(f"  --enforce-eager: {eager:.1f} tok/s; graphs / eager: {tps / eager:.2f}x")
