"""A Qwen3-30B-A3B-shaped mixture-of-experts model (`--load-format dummy`, bf16) on one GPU.

    python -m bench gpu_moe [--parts decode,throughput,kernels,w4a16] [--requests 256]
    python -m bench.gpu_moe --smoke      # the same code on tiny shapes, on the CPU (a dry run)

Each figure against a bound of the same run's device:

1. decode: single-stream tokens/s against the memory-bandwidth bound of the *active* weights
   (attention, router, the 8 routed experts of each layer, the LM head), at the copy bandwidth
   measured here and at the device's nominal bandwidth.
2. throughput: offline output tokens/s of random requests (100-1024 tokens in and out) against
   the FLOPs bound of the active parameters (2 FLOPs per active parameter per token, the
   device's nominal bf16 dense peak).
3. kernels: the fused MoE kernel alone for decode-sized batches: bytes of the expert weights it
   must read (the distinct experts routed to) per call against the copy bandwidth; the same for
   the packed 4-bit experts (``fused_moe_wna16``) and for fp8 experts with 128x128 block scales
   (Qwen3-30B-A3B-FP8's and DeepSeek-V3's format, ``fused_moe``'s block fp8 path).
4. w4a16 (opt-in, ``--parts w4a16``): the same model as a GPTQ 4-bit checkpoint (groups of 128;
   ``--load-format dummy`` fills the packed linear layers and experts): single-stream decode
   against the bytes bound of the quantized active weights, and offline throughput, each beside
   bf16 in the same run.

Each part runs in its own process. Without a GPU (and without --smoke) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench._gpu import (
    NOMINAL_BANDWIDTH,
    add_json_option,
    against_bound,
    copy_bandwidth,
    nominal,
    replayable,
    run_part,
    seconds_per_call,
    throughput_beside_bf16,
    write_json,
)

# config.json of Qwen/Qwen3-30B-A3B (shape only; the weights are dummies)
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}
TINY = {
    **QWEN3_30B_A3B,
    "hidden_size": 64,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
NOMINAL_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12}
PARTS = ("decode", "throughput", "kernels", "w4a16")
W4A16 = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench gpu_moe", description=__doc__)
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--min-len", type=int, default=100)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--engine-args", default="{}", help="JSON of extra LLM keyword arguments")
    parser.add_argument("--seed", type=int, default=0)
    add_json_option(parser)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument(
        "--part", choices=("decode", "throughput", "kernels"), help=argparse.SUPPRESS
    )
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.requests, args.min_len, args.max_len = 4, 8, 24
        args.decode_tokens, args.max_model_len = 16, 256
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        parser.error(f"--parts: unknown {', '.join(sorted(unknown))}; choose from {PARTS}")
    return args


def _config(args: argparse.Namespace) -> dict:
    return TINY if args.smoke else QWEN3_30B_A3B


def active_parameters(config: dict) -> dict[str, int]:
    """Parameters one token touches: per layer attention, router and top-k experts; the LM head
    (the embedding contributes one row). ``packable``: those of the attention projections and
    the experts, which a w4a16 checkpoint packs (the router and LM head stay in bf16)."""
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    expert = 3 * h * config["moe_intermediate_size"]
    packable = 2 * h * q + 2 * h * kv + config["num_experts_per_tok"] * expert
    per_layer = packable + h * config["num_experts"]
    return {
        "active": layers * per_layer + config["vocab_size"] * h,
        "expert": expert,
        "packable": layers * packable,
    }


def active_bytes(config: dict, quantized: bool = False) -> float:
    """Bytes of weights one decode token reads: packed 4-bit words and a 2-byte scale per group
    of 128 for what w4a16 packs, the model dtype for the rest."""
    params = active_parameters(config)
    element = 2 if config["torch_dtype"] == "bfloat16" else 4
    if not quantized:
        return params["active"] * element
    packed = params["packable"]
    return packed * (0.5 + 2 / 128) + (params["active"] - packed) * element


def _llm(args: argparse.Namespace):
    from infernetes import LLM

    return LLM(
        args.model_dir,
        load_format="dummy",
        dtype="float32" if args.smoke else "bfloat16",
        skip_tokenizer_init=True,
        max_model_len=args.max_model_len,
        seed=args.seed,
        **json.loads(args.engine_args),
    )


def part_decode(args: argparse.Namespace) -> dict:
    from infernetes import SamplingParams

    llm = _llm(args)
    prompt = list(range(1000, 1128)) if not args.smoke else list(range(3, 35))
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    params = SamplingParams(temperature=0.0, max_tokens=args.decode_tokens, ignore_eos=True)
    [out] = llm.generate([prompt], params)
    m = out.metrics
    return {
        "decode_tokens_per_s": (len(out.outputs[0].token_ids) - 1)
        / (m.finished_time - m.first_token_time)
    }


def part_throughput(args: argparse.Namespace) -> dict:
    import random

    from infernetes import SamplingParams

    llm = _llm(args)
    rng = random.Random(args.seed)
    vocab = _config(args)["vocab_size"]
    prompts, params = [], []
    for _ in range(args.requests):
        prompts.append(
            [rng.randrange(3, vocab) for _ in range(rng.randint(args.min_len, args.max_len))]
        )
        params.append(
            SamplingParams(
                temperature=0.0, max_tokens=rng.randint(args.min_len, args.max_len), ignore_eos=True
            )
        )
    llm.generate([prompts[0]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    prompt_tokens = sum(len(p) for p in prompts)
    return {
        "output_tokens_per_s": generated / elapsed,
        "processed_tokens_per_s": (generated + prompt_tokens) / elapsed,
        "seconds": elapsed,
    }


def part_kernels(args: argparse.Namespace) -> dict:
    from infernetes.kernels import ops
    from infernetes.kernels.reference.fp8_block import quantize_block_fp8

    config = _config(args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    e, h, i = config["num_experts"], config["hidden_size"], config["moe_intermediate_size"]
    w13 = torch.randn(e, 2 * i, h, device=device, dtype=dtype) / h**0.5
    w2 = torch.randn(e, h, i, device=device, dtype=dtype) / i**0.5
    packed13 = _packed_experts(e, h, 2 * i, device, dtype)
    packed2 = _packed_experts(e, i, h, device, dtype)
    block = (128, 128)
    fp8_13, scale13 = quantize_block_fp8(w13, block)
    fp8_2, scale2 = quantize_block_fp8(w2, block)
    copy_bw = copy_bandwidth(1 << 20 if args.smoke else 1 << 30)
    rows = []
    for tokens in (1, 8, 32, 64) if not args.smoke else (1, 4):
        x = torch.randn(tokens, h, device=device, dtype=dtype)
        logits = torch.randn(tokens, e, device=device)
        weights, ids = ops.select_experts(logits, config["num_experts_per_tok"], True)
        step = replayable(
            lambda x=x, weights=weights, ids=ids: ops.fused_moe(x, w13, w2, weights, ids)
        )
        iters = 2 if args.smoke else 200
        seconds = seconds_per_call(step, iters)
        touched = ids.unique().numel() * 3 * h * i * dtype.itemsize
        packed_step = replayable(
            lambda x=x, weights=weights, ids=ids: ops.fused_moe_wna16(
                x, packed13, packed2, weights, ids
            )
        )
        packed_seconds = seconds_per_call(packed_step, iters)
        packed_touched = ids.unique().numel() * 3 * h * i * (0.5 + 2 / 128)
        fp8_step = replayable(
            lambda x=x, weights=weights, ids=ids: ops.fused_moe(
                x, fp8_13, fp8_2, weights, ids, scale13, scale2, block
            )
        )
        fp8_seconds = seconds_per_call(fp8_step, iters)
        fp8_touched = ids.unique().numel() * 3 * h * i * (1 + 4 / (block[0] * block[1]))
        rows.append(
            {
                "tokens": tokens,
                "experts_touched": ids.unique().numel(),
                "us": seconds * 1e6,
                "fraction_of_copy": touched / seconds / copy_bw,
                "w4a16_us": packed_seconds * 1e6,
                "w4a16_fraction_of_copy": packed_touched / packed_seconds / copy_bw,
                "block_fp8_us": fp8_seconds * 1e6,
                "block_fp8_fraction_of_copy": fp8_touched / fp8_seconds / copy_bw,
            }
        )
    return {"copy_bandwidth_GBps": copy_bw / 1e9, "moe": rows}


def _packed_experts(e: int, k: int, n: int, device: torch.device, dtype: torch.dtype):
    from infernetes.kernels.reference.wna16 import PackedExperts

    group = min(128, k)
    return PackedExperts(
        torch.randint(-(2**31), 2**31 - 1, (e, k // 8, n), device=device, dtype=torch.int32),
        torch.full((e, -(-k // group), n), 1e-4, device=device, dtype=dtype),
        None,
        (torch.arange(k, device=device, dtype=torch.int32) // group).expand(e, k).contiguous(),
        4,
    )


PART_FUNCTIONS = {"decode": part_decode, "throughput": part_throughput, "kernels": part_kernels}


def _report(device_name: str, config: dict, results: dict) -> None:
    params = active_parameters(config)
    element = 2 if config["torch_dtype"] == "bfloat16" else 4
    print(f"device: {device_name}; active parameters {params['active'] / 1e9:.2f} B")
    if "decode" in results:
        tps = results["decode"]["decode_tokens_per_s"]
        per_token = params["active"] * element
        print(
            f"decode: {tps:.1f} tok/s single stream; active weights {per_token / 1e9:.2f} GB a token"
        )
        bound = results["copy_bandwidth"] / per_token
        print("  " + against_bound("copy-bandwidth bound", tps, bound))
        bandwidth = nominal(NOMINAL_BANDWIDTH, device_name)
        if bandwidth:
            print("  " + against_bound("nominal-bandwidth bound", tps, bandwidth / per_token))
    if "throughput" in results:
        t = results["throughput"]
        print(
            f"throughput: {t['output_tokens_per_s']:.0f} output tok/s, {t['processed_tokens_per_s']:.0f} "
            f"tokens/s in and out ({t['seconds']:.1f} s)"
        )
        peak = nominal(NOMINAL_BF16_FLOPS, device_name)
        if peak:
            bound = peak / (2 * params["active"])
            print(
                f"  vs FLOPs bound of the active parameters {bound:.0f} tok/s: "
                f"{t['processed_tokens_per_s'] / bound:.1%}"
            )
    if "kernels" in results:
        k = results["kernels"]
        print(f"kernels: copy bandwidth {k['copy_bandwidth_GBps']:.0f} GB/s")
        for row in k["moe"]:
            print(
                f"  fused MoE, {row['tokens']} tokens ({row['experts_touched']} experts): "
                f"{row['us']:.0f} us, {row['fraction_of_copy']:.1%} of copy bandwidth; w4a16 "
                f"{row['w4a16_us']:.0f} us, {row['w4a16_fraction_of_copy']:.1%}; block fp8 "
                f"{row['block_fp8_us']:.0f} us, {row['block_fp8_fraction_of_copy']:.1%}"
            )
    if "w4a16-decode" in results:
        tps = results["w4a16-decode"]["decode_tokens_per_s"]
        per_token = active_bytes(config, quantized=True)
        bf16 = results["decode"]["decode_tokens_per_s"]
        print(
            f"w4a16: decode {tps:.1f} tok/s single stream; active weights {per_token / 1e9:.2f} GB "
            f"a token; vs copy-bandwidth bound: {tps * per_token / results['copy_bandwidth']:.1%}; "
            f"beside bf16 {bf16:.1f} tok/s: {tps / bf16:.2f}x"
        )
        print(throughput_beside_bf16(results["w4a16-throughput"], results["throughput"]))


def main(argv: list[str]) -> int:
    args = _parse(argv)
    if args.part:
        print(json.dumps(PART_FUNCTIONS[args.part](args)))
        return 0
    if not torch.cuda.is_available() and not args.smoke:
        print(
            "gpu_moe: no CUDA device here; skipped (run on an NVIDIA GPU, or --smoke for a dry run)"
        )
        return 0
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (smoke)"
    config = _config(args)
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "qwen3-30b-a3b-shape"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(config, indent=2))
        parts = args.parts.split(",")
        if "w4a16" in parts:  # beside bf16's figures of the same run
            parts = [p for p in ("decode", "throughput") if p not in parts] + parts
        for part in parts:
            if part == "w4a16":
                quantized_dir = Path(tmp) / "qwen3-30b-a3b-shape-w4a16"
                quantized_dir.mkdir()
                quantized = {**config, "quantization_config": W4A16}
                (quantized_dir / "config.json").write_text(json.dumps(quantized, indent=2))
                for measured in ("decode", "throughput"):
                    results[f"w4a16-{measured}"] = run_part(
                        measured,
                        argv,
                        quantized_dir,
                        args.smoke,
                        triton=True,
                        module="bench.gpu_moe",
                    )
                continue
            if part == "decode":
                results["copy_bandwidth"] = copy_bandwidth(1 << 20 if args.smoke else 1 << 30)
            results[part] = run_part(part, argv, model_dir, args.smoke, module="bench.gpu_moe")
    _report(device_name, config, results)
    write_json(args.json, "gpu_moe", device_name, argv, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
