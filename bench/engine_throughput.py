"""Offline throughput of the engine against Hugging Face transformers, same model, same run.

A Llama-shaped model with random weights (default: 8 layers, hidden 512, vocabulary 32000) is
written to a temporary folder. Both sides get the same prompts (random token ids, input lengths
drawn from ``--input-len``, output lengths from ``--output-len``), greedy (or sampled on both sides
with ``--temperature``/``--top-p``/``--top-k``), EOS ignored:

- infernetes: ``LLM.generate`` with every prompt at once (continuous batching, each request stops
  at its own length);
- transformers: ``model.generate`` on left-padded batches of ``--hf-batch-size`` prompts, each
  batch generating up to its longest requested output (as vLLM's ``benchmark_throughput`` does for
  its HF backend).

Throughput is requested output tokens per second; the ratio infernetes / transformers is printed.
``--async-scheduling`` also runs infernetes with ``--async-scheduling`` (the next step scheduled
while the worker thread runs this one), alternating with synchronous runs (``--rounds`` of each:
the first run in a process pays one-time costs, e.g. oneDNN's primitives), and prints the ratio
of the best of each.
Both sides compute in the same dtype: infernetes resolves ``--dtype`` (``auto``: bf16 on a CPU that
computes bf16 natively, as vLLM's CPU backend does) and transformers loads the model in that dtype
(``--hf-dtype same``, the default); each side's dtype is printed.
Run: ``python -m bench engine_throughput`` (``--help`` for sizes).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time


def _range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench engine_throughput", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=_range, default=(32, 256), help="min-max prompt tokens")
    parser.add_argument(
        "--output-len", type=_range, default=(64, 256), help="min-max output tokens"
    )
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hf-batch-size", type=int, default=64)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for both sides (1: on a small shared CPU a second OpenMP thread "
        "waits in barriers whenever its core is busy, making small ops 10-30x slower)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument(
        "--dtype",
        default="auto",
        help="infernetes dtype (auto: bf16 on a CPU with native bf16, as vLLM)",
    )
    parser.add_argument(
        "--hf-dtype",
        default="same",
        help="transformers dtype (same: the dtype infernetes resolved, a like-for-like run)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="0: greedy; else both sides sample"
    )
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--skip-hf", action="store_true", help="measure infernetes only")
    parser.add_argument(
        "--async-scheduling",
        action="store_true",
        help="also run infernetes with --async-scheduling; print its ratio to the synchronous run",
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="with --async-scheduling: runs of each mode"
    )
    return parser.parse_args(argv)


def make_requests(args: argparse.Namespace) -> list[tuple[list[int], int]]:
    rng = random.Random(args.seed)
    requests = []
    for _ in range(args.num_prompts):
        prompt = [rng.randrange(10, args.vocab) for _ in range(rng.randint(*args.input_len))]
        requests.append((prompt, rng.randint(*args.output_len)))
    return requests


def run_infernetes(path: str, requests, args, async_scheduling: bool = False) -> tuple[float, str]:
    from infernetes import LLM, SamplingParams

    longest = max(len(p) + n for p, n in requests)
    llm = LLM(
        path,
        dtype=args.dtype,
        max_model_len=max(longest, 512),
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory_bytes=2 << 30,
        enable_prefix_caching=False,
        skip_tokenizer_init=True,
        seed=args.seed,
        async_scheduling=async_scheduling,
    )
    params = [
        SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_tokens=n,
            ignore_eos=True,
            detokenize=False,
        )
        for _, n in requests
    ]
    llm.generate(
        [[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=4, detokenize=False)
    )  # warm-up
    start = time.perf_counter()
    outputs = llm.generate([p for p, _ in requests], params)
    elapsed = time.perf_counter() - start
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert produced == sum(n for _, n in requests), (
        "every request must produce its requested tokens"
    )
    dtype = str(llm.llm_engine.engine_core.config.model.info.dtype).removeprefix("torch.")
    llm.llm_engine.engine_core.shutdown()  # its worker thread, under async scheduling
    return elapsed, dtype


def run_transformers(path: str, requests, args, dtype: str) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    pad = 0
    with torch.inference_mode():
        model.generate(
            torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False, pad_token_id=pad
        )
        start = time.perf_counter()
        for i in range(0, len(requests), args.hf_batch_size):
            batch = requests[i : i + args.hf_batch_size]
            width = max(len(p) for p, _ in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, (prompt, _) in enumerate(batch):
                ids[row, width - len(prompt) :] = torch.tensor(prompt)
                mask[row, width - len(prompt) :] = 1
            new = max(n for _, n in batch)
            sampling = (
                dict(
                    do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k
                )
                if args.temperature > 0
                else dict(do_sample=False)
            )
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=pad,
                **sampling,
            )
        return time.perf_counter() - start


def write_llama(folder: str, layers: int, hidden: int, vocab: int) -> str:
    """A Llama-shaped model with random weights (64-wide heads, at least two) in ``folder``."""
    from infernetes.runtime.testing import make_tiny_model

    heads = max(hidden // 64, 2)
    return str(
        make_tiny_model(
            folder,
            "LlamaForCausalLM",
            hidden_size=hidden,
            intermediate_size=hidden * 11 // 4,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            max_position_embeddings=2048,
            vocab_size=vocab,
            initializer_range=0.02,
        )
    )


def compare_async(path: str, requests, args, first_sync: float) -> None:
    """Synchronous and async scheduling in turns; the best run of each, and their ratio."""
    output_tokens = sum(n for _, n in requests)
    runs: dict[bool, list[float]] = {False: [first_sync], True: []}
    for round_ in range(args.rounds):
        for mode in (True, False) if round_ < args.rounds - 1 else (True,):
            runs[mode].append(run_infernetes(path, requests, args, async_scheduling=mode)[0])
    for mode, label in ((False, "sync "), (True, "async")):
        best = min(runs[mode])
        shown = " ".join(f"{t:.2f}" for t in runs[mode])
        print(
            f"infernetes {label} scheduling: best {best:8.2f} s  "
            f"{output_tokens / best:9.1f} output tok/s  (runs: {shown} s)",
            flush=True,
        )
    print(f"ratio async / sync scheduling: {min(runs[False]) / min(runs[True]):.2f}x", flush=True)


def main(argv: list[str]) -> int:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    requests = make_requests(args)
    output_tokens = sum(n for _, n in requests)
    prompt_tokens = sum(len(p) for p, _ in requests)
    with tempfile.TemporaryDirectory(prefix="infernetes-bench-") as folder:
        path = write_llama(folder, args.layers, args.hidden, args.vocab)
        print(
            f"model: Llama {args.layers} layers, hidden {args.hidden}, vocab {args.vocab} (float32 checkpoint); "
            f"{len(requests)} prompts, {prompt_tokens} prompt tokens, {output_tokens} output tokens; "
            f"{args.threads} threads",
            flush=True,
        )
        ours, dtype = run_infernetes(path, requests, args)
        print(
            f"infernetes ({dtype}):   {ours:8.2f} s  {output_tokens / ours:9.1f} output tok/s  "
            f"{(output_tokens + prompt_tokens) / ours:9.1f} total tok/s",
            flush=True,
        )
        if args.async_scheduling:
            compare_async(path, requests, args, ours)
        if args.skip_hf:
            return 0
        hf_dtype = dtype if args.hf_dtype == "same" else args.hf_dtype
        theirs = run_transformers(path, requests, args, hf_dtype)
        print(
            f"transformers ({hf_dtype}): {theirs:8.2f} s  {output_tokens / theirs:9.1f} output tok/s  "
            f"(batched generate, batch size {args.hf_batch_size})",
            flush=True,
        )
    print(f"ratio infernetes / transformers: {theirs / ours:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
