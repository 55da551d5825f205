"""throughput: random requests (input and output lengths in --min-len..--max-len, EOS ignored):
output tokens/s of infernetes against transformers' batched `generate` on the same model shape."""

from __future__ import annotations

import argparse
import time

import torch

from bench._gpu import device, sync
from bench._llama8b.model import PartRunner, llm, model_config, workload


def part_throughput_engine(args: argparse.Namespace) -> dict:
    from infernetes import SamplingParams

    engine = llm(args)
    requests = workload(args, model_config(args)["vocab_size"])
    engine.generate(
        [requests[0][0]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    )
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in requests]
    start = time.perf_counter()
    outputs = engine.generate([p for p, _ in requests], params)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {
        "requests": len(requests),
        "output_tokens": generated,
        "seconds": elapsed,
        "output_tokens_per_s": generated / elapsed,
        "total_tokens_per_s": (generated + sum(len(p) for p, _ in requests)) / elapsed,
    }


def part_throughput_hf(args: argparse.Namespace) -> dict:
    """transformers' batched generate (left padding, batches of similar prompt length). A batch
    runs to its longest requested output; only each request's own tokens count as output."""
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = torch.bfloat16 if not args.smoke else torch.float32
    config = AutoConfig.from_pretrained(args.model_dir)
    with torch.device(device()):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    requests = workload(args, config.vocab_size)[: args.hf_requests]
    requests.sort(key=lambda r: len(r[0]))
    pad = 0
    start = time.perf_counter()
    useful = 0
    with torch.inference_mode():
        for i in range(0, len(requests), args.hf_batch_size):
            batch = requests[i : i + args.hf_batch_size]
            width = max(len(p) for p, _ in batch)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in batch], device=device())
            mask = torch.tensor(
                [[0] * (width - len(p)) + [1] * len(p) for p, _ in batch], device=device()
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
    sync()
    elapsed = time.perf_counter() - start
    return {
        "requests": len(requests),
        "output_tokens": useful,
        "seconds": elapsed,
        "output_tokens_per_s": useful / elapsed,
    }


PARTS = {"throughput-engine": part_throughput_engine, "throughput-hf": part_throughput_hf}


def measure(run: PartRunner, args: argparse.Namespace, results: dict) -> None:
    # ours first: transformers' baseline is the long part
    results["throughput-engine"] = run("throughput-engine")
    results["throughput-hf"] = run("throughput-hf")


def report(device_name: str, config: dict, results: dict) -> None:
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
