"""Throughput with LoRA adapters: a batch spread over 4 adapters against the base model alone.

A Llama-shaped model with random weights (default: 4 layers, hidden 512) and 4 PEFT adapters made
by peft (rank ``--rank`` on every attention and MLP projection, random A and B) are written to a
temporary folder. One engine (``--enable-lora --max-loras 4``) runs the same prompts twice,
greedy, EOS ignored: once on the base model alone, once with the requests spread round-robin
over the 4 adapters, so every step mixes them (the batched shrink/expand by adapter per token).
Throughput is output tokens per second; the ratio adapters / base is printed (1.0 would mean
the adapters cost nothing).
Run: ``python -m bench lora`` (``--help`` for sizes).

Measured on the development machine's CPU (4 layers, hidden 512, bfloat16, 1 thread; 4 adapters
of rank 16 on all seven projections): about 0.7x the base model's output tokens per second
(0.69x, 0.71x, 0.78x in three runs). Not measured on a GPU yet.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.engine_throughput import _range, make_requests, write_llama

ADAPTERS = 4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench lora", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=_range, default=(32, 128), help="min-max prompt tokens")
    parser.add_argument("--output-len", type=_range, default=(32, 64), help="min-max output tokens")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def _timed(llm, prompts, params, loras) -> tuple[float, int]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, lora_request=loras)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outputs)


def main(argv: list[str]) -> int:
    import torch
    from infernetes.runtime.lora.request import LoRARequest
    from infernetes.runtime.testing import make_tiny_lora

    from infernetes import LLM, SamplingParams

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    requests = make_requests(args)
    prompts = [p for p, _ in requests]
    params = [
        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
        for _, n in requests
    ]
    with tempfile.TemporaryDirectory(prefix="infernetes-bench-lora-") as folder:
        path = write_llama(str(Path(folder) / "base"), args.layers, args.hidden, args.vocab)
        adapters = [
            LoRARequest(
                f"adapter-{i}",
                i + 1,
                str(
                    make_tiny_lora(
                        path,
                        Path(folder) / f"adapter-{i}",
                        rank=args.rank,
                        alpha=2 * args.rank,
                        target_modules=TARGETS,
                        seed=i,
                    )
                ),
            )
            for i in range(ADAPTERS)
        ]
        longest = max(len(p) + n for p, n in requests)
        llm = LLM(
            path,
            dtype=args.dtype,
            device=args.device,
            max_model_len=max(longest, 512),
            max_num_seqs=args.max_num_seqs,
            kv_cache_memory_bytes=1 << 30,
            enable_prefix_caching=False,
            skip_tokenizer_init=True,
            enable_lora=True,
            max_loras=ADAPTERS,
            max_lora_rank=args.rank,
            seed=args.seed,
        )
        warm = SamplingParams(temperature=0.0, max_tokens=4, detokenize=False)
        llm.generate([[1, 2, 3]] * ADAPTERS, warm, lora_request=adapters)  # reads the adapters
        spread = [adapters[i % ADAPTERS] for i in range(len(prompts))]
        base_s, base_tokens = _timed(llm, prompts, params, None)
        lora_s, lora_tokens = _timed(llm, prompts, params, spread)
    dtype = str(llm.llm_engine.engine_core.config.model.info.dtype).removeprefix("torch.")
    device = llm.llm_engine.engine_core.config.device.device
    print(
        f"model: Llama {args.layers} layers, hidden {args.hidden} ({dtype} on {device}); "
        f"{len(prompts)} prompts, {base_tokens} output tokens; {ADAPTERS} adapters of rank "
        f"{args.rank} on {', '.join(TARGETS)}",
        flush=True,
    )
    print(f"base model alone:     {base_s:8.2f} s  {base_tokens / base_s:9.1f} output tok/s")
    print(f"spread over adapters: {lora_s:8.2f} s  {lora_tokens / lora_s:9.1f} output tok/s")
    print(f"ratio adapters / base: {base_s / lora_s:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
