"""Speculative decoding (n-gram, or ``--method draft_model --draft PATH``) on a prompt-copying
workload, against no speculation, same model,
same prompts, same run: single-request output tokens/s and the throughput of a batch of
``--concurrency`` requests, as ratios speculation / none, with the acceptance figures vLLM logs
(mean acceptance length, per-position acceptance rates).

The workload asks a chat model to repeat a passage the prompt holds, as edit and summarise tasks
do: the output copies spans of the prompt, where prompt lookup proposes the right tokens. The
default model is the demo's SmolLM2-135M-Instruct GGUF file (a real model: a random one copies
nothing); ``--model`` names another. Greedy in float32 (``--dtype``), so both sides generate the same tokens (reported).
Each side runs ``--rounds`` times, alternating; the best round counts.

    python -m bench spec_decode [--model PATH] [--num-speculative-tokens 4] [--concurrency 32]
    python -m bench spec_decode --method draft_model [--draft PATH]   (default: the model itself,
                                                                      every draft accepted)
    python -m bench spec_decode --disable-by-batch-size 16   (a third side: speculation that
                                                             stops verifying drafts at that load)
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

PASSAGES = [
    "The cache keeps the keys and values of every token it has seen, so that each new token "
    "attends to the past without computing it again. When the cache is full, the oldest blocks "
    "that no request needs are evicted first, and a request that comes back later computes "
    "them again.",
    "A rolling update replaces the pods of a service one at a time: a new pod starts, waits "
    "until its engine answers, joins the service, and only then does an old pod stop taking "
    "requests and drain the ones it holds.",
    "Speculative decoding guesses several tokens ahead and lets the model check all of them in "
    "one step. Every guess the model agrees with is a token that cost no step of its own; a "
    "wrong guess costs only the work of checking it.",
    "Prometheus scrapes the metrics of every pod each interval, stores them as time series, and "
    "answers queries over them; a dashboard draws those answers, and an autoscaler reads them "
    "to decide how many pods the load needs.",
]


def _messages(passage: str) -> list[dict[str, str]]:
    return [
        {
            "role": "user",
            "content": f"Repeat this text word for word, and nothing else:\n\n{passage}",
        }
    ]


def _run(llm: Any, prompts: list[Any], params: Any) -> tuple[float, list[list[int]], float]:
    """(output tokens/s, tokens of each prompt, accepted tokens per draft step)."""
    scheduler = llm.llm_engine.engine_core.scheduler
    update = scheduler.update_from_output
    drafts = accepted = 0

    def counted(scheduler_output, model_output):
        nonlocal drafts, accepted
        updated, iteration = update(scheduler_output, model_output)
        drafts += iteration.num_drafts
        accepted += iteration.num_accepted_tokens
        return updated, iteration

    scheduler.update_from_output = counted
    try:
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
    finally:
        del scheduler.update_from_output
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    return sum(map(len, tokens)) / seconds, tokens, (accepted / drafts if drafts else 0.0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench spec_decode",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", help="model path (default: the demo's SmolLM2 GGUF file)")
    parser.add_argument("--method", choices=("ngram", "draft_model"), default="ngram")
    parser.add_argument("--draft", help="draft_model: its checkpoint (default: the model itself)")
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--prompt-lookup-max", type=int, default=4)
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--disable-by-batch-size",
        type=int,
        help="also run speculation with this disable_by_batch_size (below --concurrency: the "
        "batch runs without drafts, the single request with them)",
    )
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument(
        "--dtype",
        default="float32",
        help="float32 (default): greedy tokens must then be identical with and without",
    )
    args = parser.parse_args(argv)

    from infernetes.runtime.sampling_params import SamplingParams

    from infernetes import LLM

    if args.model is None:
        from infernetes.runtime.server.demo import demo_gguf

        args.model = str(demo_gguf())
    speculative: dict[str, Any] = {
        "method": args.method,
        "num_speculative_tokens": args.num_speculative_tokens,
    }
    if args.method == "ngram":
        speculative["prompt_lookup_max"] = args.prompt_lookup_max
        speculative["prompt_lookup_min"] = args.prompt_lookup_min
    else:
        speculative["model"] = args.draft or args.model
    common = {
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        "seed": 0,
        "max_num_seqs": args.concurrency,
    }
    sides = {
        "none": LLM(args.model, **common),
        args.method: LLM(args.model, speculative_config=speculative, **common),
    }
    disabled = f"{args.method}_disable_by_batch_size_{args.disable_by_batch_size}"
    if args.disable_by_batch_size:
        sides[disabled] = LLM(
            args.model,
            speculative_config={**speculative, "disable_by_batch_size": args.disable_by_batch_size},
            **common,
        )
    plain = sides["none"]
    tokenizer = plain.get_tokenizer()
    rng = random.Random(0)
    batch = [
        tokenizer.apply_chat_template(
            _messages(rng.choice(PASSAGES)),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for _ in range(args.concurrency)
    ]
    prompts = [{"prompt_token_ids": list(ids)} for ids in batch]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    results: dict[str, dict[str, list[float]]] = {
        name: {"single": [], "batch": []} for name in sides
    }
    for llm in sides.values():  # first calls pay one-time costs (kernel builds, oneDNN shapes)
        _run(llm, prompts[:2], SamplingParams(temperature=0.0, max_tokens=8))
    acceptance = 0.0
    reference: list[list[int]] = []
    same = True
    for _ in range(args.rounds):
        for name, llm in sides.items():
            single, one, _ = _run(llm, prompts[:1], params)
            rate, tokens, per_step = _run(llm, prompts, params)
            results[name]["single"].append(single)
            results[name]["batch"].append(rate)
            if name == "none":
                reference = tokens
                continue
            same = same and tokens == reference and one == reference[:1]
            if name == args.method:
                acceptance = per_step
    best = {name: {k: max(v) for k, v in r.items()} for name, r in results.items()}
    summary = {
        "model": args.model,
        "speculative_config": speculative,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "single_request_tok_s": {name: best[name]["single"] for name in best},
        "batch_tok_s": {name: best[name]["batch"] for name in best},
        "single_ratio": best[args.method]["single"] / best["none"]["single"],
        "batch_ratio": best[args.method]["batch"] / best["none"]["batch"],
        **(
            {"disabled_batch_ratio": best[disabled]["batch"] / best["none"]["batch"]}
            if args.disable_by_batch_size
            else {}
        ),
        "mean_acceptance_length": 1 + acceptance,
        "dtype": args.dtype,
        "greedy_tokens_identical": same,
    }
    print(json.dumps(summary, indent=2))
    print(
        f"{args.method} speculation / none: single request {summary['single_ratio']:.2f}x, "
        f"concurrency {args.concurrency} {summary['batch_ratio']:.2f}x; mean acceptance length "
        f"{summary['mean_acceptance_length']:.2f} (vLLM documents a 1.4-1.8x slowdown at high "
        "load as the cost not to exceed)"
    )
    if args.disable_by_batch_size:
        print(
            f"with disable_by_batch_size {args.disable_by_batch_size}: concurrency "
            f"{args.concurrency} {summary['disabled_batch_ratio']:.2f}x"
        )
    return 0
