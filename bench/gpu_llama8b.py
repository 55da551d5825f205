"""A Llama-3.1-8B-shaped model (`--load-format dummy`, bf16) on one NVIDIA GPU.

    python -m bench gpu_llama8b [--parts decode,throughput,kernels,w4a16,fp8] [--requests 256]
    python -m bench.gpu_llama8b --smoke      # the same code on tiny shapes, on the CPU (a dry run)

Three measurements, each against a baseline taken in the same run on the same device:

1. decode: one request, tokens/s of the decode phase, against the memory-bandwidth limit
   (weight bytes read per token / bandwidth), both for the device's nominal bandwidth and for the
   device-to-device copy bandwidth measured here; and the same with --enforce-eager, so the CUDA
   graphs' gain shows as a ratio.
2. throughput: 256 requests with random input and output lengths of 100-1024 tokens (EOS ignored):
   output tokens/s of infernetes against transformers' batched `generate` on the same model shape.
3. kernels: paged decode attention (Triton) bandwidth against the copy bandwidth.
4. profile (opt-in, ``--parts profile``): the GPU kernels of single-stream decode steps, by time
   per step, to see where a step goes (on an H100 the cuBLAS products took ~5.5 of ~6.8 ms).
5. w4a16 and fp8 (opt-in, ``--parts w4a16,fp8``): the same model as a pre-quantized checkpoint
   (its config.json declares GPTQ 4-bit with groups of 128, or fp8; ``--load-format dummy`` fills
   the packed int4 or fp8 weights), single-stream decode against the bytes bound of the quantized
   weights and offline throughput, each beside bf16's decode and throughput from the same run.

Each part runs in its own process so one model's memory does not shape the next one's. Without a
GPU (and without --smoke) the benchmark says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

# config.json of meta-llama/Llama-3.1-8B-Instruct (shape only; the weights are dummies)
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "torch_dtype": "bfloat16",
}

TINY = {
    **LLAMA_31_8B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "rope_scaling": None,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}

# Nominal HBM bandwidth (bytes/s) by device name, for the limit the issue states.
NOMINAL_BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12, "L40S": 0.864e12}

PARTS = ("decode", "throughput", "kernels", "profile", "w4a16", "fp8")
# The quantization_config each quantized variant's config.json declares.
QUANTIZED = {
    "w4a16": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
    "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic"},
}
DEFAULT_PARTS = ("decode", "throughput", "kernels")


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench gpu_llama8b", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--parts",
        default=",".join(DEFAULT_PARTS),
        help=f"comma-separated subset of {', '.join(PARTS)} (default: all but profile)",
    )
    parser.add_argument(
        "--requests", type=int, default=256, help="offline throughput: number of requests"
    )
    parser.add_argument(
        "--hf-requests",
        type=int,
        default=64,
        help="requests transformers generates (a subset: it is slow); tok/s is compared",
    )
    parser.add_argument("--hf-batch-size", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=100)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--decode-tokens", type=int, default=512)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument(
        "--engine-args",
        default="{}",
        help="JSON of extra LLM keyword arguments, e.g. '{\"enforce_eager\": true}'",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes on the CPU: checks the script runs"
    )
    parser.add_argument(
        "--part", choices=tuple(PART_FUNCTIONS), help=argparse.SUPPRESS
    )  # internal: run one part in this process, print JSON
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:  # small enough for the CPU
        args.requests, args.hf_requests, args.hf_batch_size = 6, 6, 3
        args.min_len, args.max_len, args.decode_tokens, args.max_model_len = 8, 24, 16, 256
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        parser.error(
            f"--parts: unknown {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}"
        )
    return args


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def write_model_dir(directory: Path, smoke: bool, quantization: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = dict(TINY if smoke else LLAMA_31_8B)
    if quantization is not None:
        config["quantization_config"] = QUANTIZED[quantization]
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def _workload(args: argparse.Namespace, vocab: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) per request, the same in every process."""
    rng = random.Random(args.seed)
    requests = []
    for _ in range(args.requests):
        prompt_len = rng.randint(args.min_len, args.max_len)
        requests.append(
            (
                [rng.randrange(1000 if vocab > 2000 else 3, vocab) for _ in range(prompt_len)],
                rng.randint(args.min_len, args.max_len),
            )
        )
    return requests


def _model_config(args: argparse.Namespace) -> dict:
    return TINY if args.smoke else LLAMA_31_8B


def _llm(args: argparse.Namespace, **overrides):
    from infernetes import LLM

    engine_args = {**json.loads(args.engine_args), **overrides}
    return LLM(
        args.model_dir,
        load_format="dummy",
        dtype="bfloat16" if not args.smoke else "float32",
        skip_tokenizer_init=True,
        max_model_len=args.max_model_len,
        seed=args.seed,
        **engine_args,
    )


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def copy_bandwidth(num_bytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s (each copy reads and writes `num_bytes`)."""
    device = _device()
    src = torch.empty(num_bytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync()
    start = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    _sync()
    return 2 * num_bytes * iters / (time.perf_counter() - start)


def _weight_bytes_per_token(config: dict, quantization: str | None = None) -> int:
    """Bytes of weights a decode step reads: every matrix but the embedding table (one row). A
    quantized variant's linear layers read 4 bits a weight and a 2-byte scale per group of 128
    (w4a16) or a byte a weight (fp8); norms and the LM head stay in the model dtype."""
    h, i, n = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    q = config["num_attention_heads"] * config["head_dim"]
    linear = h * q + 2 * h * kv + q * h + 3 * h * i
    bytes_per_param = 2 if config["torch_dtype"] == "bfloat16" else 4
    per_linear_param = {None: bytes_per_param, "w4a16": 0.5 + 2 / 128, "fp8": 1.0}[quantization]
    rest = n * 2 * h + h + config["vocab_size"] * h
    return int(n * linear * per_linear_param + rest * bytes_per_param)


# ---- parts (each in its own process) -------------------------------------------------------


def part_decode(args: argparse.Namespace, **overrides) -> dict:
    from infernetes import SamplingParams

    llm = _llm(args, **overrides)
    prompt = _workload(
        argparse.Namespace(**{**vars(args), "requests": 1, "min_len": 128, "max_len": 128}),
        _model_config(args)["vocab_size"],
    )[0][0]
    params = SamplingParams(temperature=0.0, max_tokens=args.decode_tokens, ignore_eos=True)
    llm.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    )  # warm-up
    [out] = llm.generate([prompt], params)
    m = out.metrics
    decode_s = m.finished_time - m.first_token_time
    graphs = llm.llm_engine.engine_core.executor.driver_worker.model_runner.decode_graphs
    return {
        "decode_tokens_per_s": (len(out.outputs[0].token_ids) - 1) / decode_s,
        "ttft_s": m.first_token_time - m.arrival_time,
        "graph_sizes": len(graphs.sizes) if graphs else 0,
        "graph_capture_s": graphs.capture_seconds if graphs else 0.0,
        "graph_replays": sum(graphs.replays.values()) if graphs else 0,
    }


def part_decode_eager(args: argparse.Namespace) -> dict:
    return part_decode(args, enforce_eager=True)


def part_throughput_engine(args: argparse.Namespace) -> dict:
    from infernetes import SamplingParams

    llm = _llm(args)
    workload = _workload(args, _model_config(args)["vocab_size"])
    llm.generate([workload[0][0]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in workload]
    start = time.perf_counter()
    outputs = llm.generate([p for p, _ in workload], params)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {
        "requests": len(workload),
        "output_tokens": generated,
        "seconds": elapsed,
        "output_tokens_per_s": generated / elapsed,
        "total_tokens_per_s": (generated + sum(len(p) for p, _ in workload)) / elapsed,
    }


def part_throughput_hf(args: argparse.Namespace) -> dict:
    """transformers' batched generate (left padding, batches of similar prompt length). A batch
    runs to its longest requested output; only each request's own tokens count as output."""
    from transformers import AutoConfig, AutoModelForCausalLM

    device = _device()
    dtype = torch.bfloat16 if not args.smoke else torch.float32
    config = AutoConfig.from_pretrained(args.model_dir)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    workload = _workload(args, config.vocab_size)[: args.hf_requests]
    workload.sort(key=lambda r: len(r[0]))
    pad = 0
    start = time.perf_counter()
    useful = 0
    with torch.inference_mode():
        for i in range(0, len(workload), args.hf_batch_size):
            batch = workload[i : i + args.hf_batch_size]
            width = max(len(p) for p, _ in batch)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in batch], device=device)
            mask = torch.tensor(
                [[0] * (width - len(p)) + [1] * len(p) for p, _ in batch], device=device
            )
            new = max(n for _, n in batch)
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=pad,
            )
            useful += sum(n for _, n in batch)
    _sync()
    elapsed = time.perf_counter() - start
    return {
        "requests": len(workload),
        "output_tokens": useful,
        "seconds": elapsed,
        "output_tokens_per_s": useful / elapsed,
    }


def _replayable(launch: Callable[[], object]) -> Callable[[], object]:
    """``launch`` captured in a CUDA graph, as the engine's decode steps run: timing it eagerly
    measures Python's launch overhead as much as the kernel. On a CPU (smoke runs) as it is."""
    launch()
    _sync()
    if _device().type != "cuda":
        return launch
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    graph.replay()
    _sync()
    return graph.replay


def part_kernels(args: argparse.Namespace) -> dict:
    from infernetes.kernels import triton_backend
    from infernetes.kernels.testing import random_paged_batch

    config = _model_config(args)
    shapes = [(1, 256)] if args.smoke else [(1, 32768), (16, 4096), (64, 4096), (256, 1024)]
    dtype = torch.float32 if args.smoke else torch.bfloat16
    copy_bw = copy_bandwidth(1 << 20 if args.smoke else 1 << 30)
    results = []
    for seqs, kv_len in shapes:
        batch = random_paged_batch(
            [1] * seqs,
            [kv_len] * seqs,
            config["num_attention_heads"],
            config["num_key_value_heads"],
            config["head_dim"],
            16,
            dtype,
            device=_device(),
        )
        kv_bytes = (
            2 * seqs * kv_len * config["num_key_value_heads"] * config["head_dim"] * dtype.itemsize
        )
        step = _replayable(lambda batch=batch: triton_backend.paged_attention(*batch.args()))
        iters = 2 if args.smoke else 50
        start = time.perf_counter()
        for _ in range(iters):
            step()
        _sync()
        seconds = (time.perf_counter() - start) / iters
        results.append(
            {
                "seqs": seqs,
                "kv_len": kv_len,
                "us": seconds * 1e6,
                "bandwidth_GBps": kv_bytes / seconds / 1e9,
                "fraction_of_copy": kv_bytes / seconds / copy_bw,
            }
        )
    return {"copy_bandwidth_GBps": copy_bw / 1e9, "attention": results}


def part_profile(args: argparse.Namespace, steps: int = 64, top: int = 15) -> dict:
    """Device time per decode step by kernel, from torch.profiler over `steps` single-stream steps."""
    from torch.profiler import ProfilerActivity, profile

    from infernetes import SamplingParams

    llm = _llm(args)
    prompt = list(range(1000, 1128)) if not args.smoke else list(range(3, 35))
    llm.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    )  # warm-up
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
    )
    with profile(activities=activities) as prof:
        llm.generate(
            [prompt], SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
        )
        _sync()
    # device-side events only (kernels, copies): CPU-side ops report no device time of their own
    events = [
        e
        for e in prof.key_averages()
        if e.self_device_time_total > 0 and not e.key.startswith("aten::")
    ]
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    total_us = sum(e.self_device_time_total for e in events)
    return {
        "steps": steps,
        "device_ms_per_step": total_us / steps / 1e3,
        "kernels": [
            {
                "name": e.key[:80],
                "us_per_step": e.self_device_time_total / steps,
                "calls_per_step": e.count / steps,
            }
            for e in events[:top]
        ],
    }


PART_FUNCTIONS = {
    "decode": part_decode,
    "decode-eager": part_decode_eager,
    "throughput-engine": part_throughput_engine,
    "throughput-hf": part_throughput_hf,
    "kernels": part_kernels,
    "profile": part_profile,
}


# ---- driver ---------------------------------------------------------------------------------


def _run_part(
    part: str,
    argv: list[str],
    model_dir: Path,
    smoke: bool,
    triton: bool = False,
    module: str = "bench.gpu_llama8b",
) -> dict:
    """Part ``part`` of benchmark ``module`` in a process of its own, its JSON result.
    ``triton``: with --smoke, on the Triton path (interpreted), where quantized layers keep
    their stored weights as they do on a GPU."""
    env = None
    if smoke and (part == "kernels" or triton):
        import os

        env = {**os.environ, "TRITON_INTERPRET": "1"}
        if triton:
            env["VLLM_ATTENTION_BACKEND"] = "TRITON_ATTN"
    cmd = [
        sys.executable,
        "-m",
        module,
        *argv,
        "--part",
        part,
        "--model-dir",
        str(model_dir),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=Path(__file__).parent.parent
    )
    if proc.returncode:
        raise RuntimeError(f"part {part} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"{part}: {json.dumps(result)}", file=sys.stderr, flush=True
    )  # progress, and the raw figures
    return result


def _run_quantized(
    variant: str, argv: list[str], tmp: Path, bf16_dir: Path, smoke: bool, results: dict
) -> None:
    """The variant's decode and throughput, and bf16's where this run has not measured them."""
    if "copy_bandwidth" not in results:
        results["copy_bandwidth"] = copy_bandwidth(1 << 20 if smoke else 1 << 30)
    if "decode" not in results:
        results["decode"] = _run_part("decode", argv, bf16_dir, smoke)
    if "throughput-engine" not in results:
        results["throughput-engine"] = _run_part("throughput-engine", argv, bf16_dir, smoke)
    model_dir = write_model_dir(tmp / f"llama-3.1-8b-shape-{variant}", smoke, variant)
    results[f"decode-{variant}"] = _run_part("decode", argv, model_dir, smoke, triton=True)
    results[f"throughput-{variant}"] = _run_part(
        "throughput-engine", argv, model_dir, smoke, triton=True
    )


def _report(device_name: str, parts: list[str], results: dict) -> None:
    print(f"device: {device_name}")
    config = TINY if results.get("smoke") else LLAMA_31_8B
    if "decode" in parts:
        per_token = _weight_bytes_per_token(config)
        tps = results["decode"]["decode_tokens_per_s"]
        copy_limit = results["copy_bandwidth"] / per_token
        print(
            f"decode: {tps:.1f} tok/s single stream; weights read per token {per_token / 1e9:.2f} GB; "
            f"TTFT {results['decode']['ttft_s'] * 1e3:.0f} ms"
        )
        print(f"  vs copy-bandwidth limit {copy_limit:.1f} tok/s: {tps / copy_limit:.1%}")
        nominal = next((bw for name, bw in NOMINAL_BANDWIDTH.items() if name in device_name), None)
        if nominal:
            print(
                f"  vs nominal-bandwidth limit {nominal / per_token:.1f} tok/s: {tps * per_token / nominal:.1%}"
            )
        d = results["decode"]
        print(
            f"  CUDA graphs: {d['graph_sizes']} sizes captured in {d['graph_capture_s']:.1f} s, "
            f"{d['graph_replays']} decode steps replayed"
        )
        if "decode-eager" in results:
            eager = results["decode-eager"]["decode_tokens_per_s"]
            print(f"  --enforce-eager: {eager:.1f} tok/s; graphs / eager: {tps / eager:.2f}x")
    if "throughput" in parts:
        ours, hf = results["throughput-engine"], results["throughput-hf"]
        print(
            f"throughput: infernetes {ours['output_tokens_per_s']:.0f} output tok/s "
            f"({ours['requests']} requests, {ours['output_tokens']} tokens, {ours['seconds']:.1f} s)"
        )
        print(
            f"  transformers generate {hf['output_tokens_per_s']:.0f} output tok/s ({hf['requests']} requests)"
        )
        print(
            f"  ratio infernetes / transformers: {ours['output_tokens_per_s'] / hf['output_tokens_per_s']:.2f}x"
        )
    for variant in QUANTIZED:
        if variant in parts:
            _report_quantized(variant, config, results)
    if "kernels" in parts:
        k = results["kernels"]
        print(f"kernels: device copy bandwidth {k['copy_bandwidth_GBps']:.0f} GB/s")
        for row in k["attention"]:
            print(
                f"  decode attention {row['seqs']} seqs x {row['kv_len']} tokens: {row['us']:.0f} us, "
                f"{row['bandwidth_GBps']:.0f} GB/s = {row['fraction_of_copy']:.1%} of copy"
            )


def _report_quantized(variant: str, config: dict, results: dict) -> None:
    decode = results[f"decode-{variant}"]["decode_tokens_per_s"]
    per_token = _weight_bytes_per_token(config, variant)
    limit = results["copy_bandwidth"] / per_token
    bf16 = results["decode"]["decode_tokens_per_s"]
    print(
        f"{variant}: decode {decode:.1f} tok/s single stream; weights read per token "
        f"{per_token / 1e9:.2f} GB; vs copy-bandwidth limit {limit:.1f} tok/s: {decode / limit:.1%}"
    )
    print(f"  beside bf16 decode {bf16:.1f} tok/s: {decode / bf16:.2f}x")
    ours, base = results[f"throughput-{variant}"], results["throughput-engine"]
    print(
        f"  throughput {ours['output_tokens_per_s']:.0f} output tok/s beside bf16 "
        f"{base['output_tokens_per_s']:.0f}: {ours['output_tokens_per_s'] / base['output_tokens_per_s']:.2f}x"
    )


def _report_profile(profile: dict) -> None:
    print(
        f"profile: {profile['device_ms_per_step']:.2f} ms of device time per single-stream decode step"
    )
    for row in profile["kernels"]:
        print(f"  {row['us_per_step']:8.1f} us  {row['calls_per_step']:5.1f} calls  {row['name']}")


def main(argv: list[str]) -> int:
    args = _parse(argv)
    if args.part:
        print(json.dumps(PART_FUNCTIONS[args.part](args)))
        return 0
    if not torch.cuda.is_available() and not args.smoke:
        print(
            "gpu_llama8b: no CUDA device here; skipped (run on an NVIDIA GPU, or --smoke for a dry run)"
        )
        return 0
    parts = args.parts.split(",")
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (smoke)"
    passthrough = [a for a in argv if a not in ("--part",)]
    results: dict = {"smoke": args.smoke}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(Path(tmp) / "llama-3.1-8b-shape", args.smoke)
        if "decode" in parts:
            results["copy_bandwidth"] = copy_bandwidth(1 << 20 if args.smoke else 1 << 30)
            results["decode"] = _run_part("decode", passthrough, model_dir, args.smoke)
            if not json.loads(args.engine_args).get("enforce_eager"):
                results["decode-eager"] = _run_part(
                    "decode-eager", passthrough, model_dir, args.smoke
                )
        if "kernels" in parts:
            results["kernels"] = _run_part("kernels", passthrough, model_dir, args.smoke)
        if "profile" in parts:
            results["profile"] = _run_part("profile", passthrough, model_dir, args.smoke)
        if "throughput" in parts:  # ours first: transformers' baseline is the long part
            results["throughput-engine"] = _run_part(
                "throughput-engine", passthrough, model_dir, args.smoke
            )
            results["throughput-hf"] = _run_part(
                "throughput-hf", passthrough, model_dir, args.smoke
            )
        for variant in QUANTIZED:
            if variant in parts:
                _run_quantized(variant, passthrough, Path(tmp), model_dir, args.smoke, results)
    _report(device_name, parts, results)
    if "profile" in results:
        _report_profile(results["profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
