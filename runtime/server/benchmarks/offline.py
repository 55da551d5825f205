"""``infernetes bench throughput`` and ``bench latency``: the engine alone, no HTTP, on the same
kind of prompts as ``bench serve``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
from infernetes.runtime.server.benchmarks.datasets import BenchRequest

if TYPE_CHECKING:
    from infernetes.runtime.engine.llm_engine import LLMEngine

    from infernetes.schema.config import ServeConfig


def load_engine(config: ServeConfig) -> LLMEngine:
    from infernetes.runtime.engine.llm_engine import LLMEngine

    return LLMEngine.from_config(config)


def _params(output_len: int, ignore_eos: bool) -> Any:
    from infernetes.runtime.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(
        temperature=0.0,
        max_tokens=output_len,
        ignore_eos=ignore_eos,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def run_until_done(engine: LLMEngine) -> list[Any]:
    finished: list[Any] = []
    while engine.has_unfinished_requests():
        finished.extend(o for o in engine.step() if o.finished)
    return finished


def throughput(
    engine: LLMEngine, requests: list[BenchRequest], ignore_eos: bool = True
) -> dict[str, Any]:
    """All requests at once, as fast as the engine goes: requests/s and tokens/s."""
    start = time.perf_counter()
    for index, request in enumerate(requests):
        engine.add_request(
            f"bench-{index}", request.prompt, _params(request.output_len, ignore_eos)
        )
    outputs = run_until_done(engine)
    elapsed = time.perf_counter() - start
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    input_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    return {
        "elapsed_s": elapsed,
        "num_requests": len(outputs),
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(outputs) / elapsed,
        "output_throughput": output_tokens / elapsed,
        "total_token_throughput": (input_tokens + output_tokens) / elapsed,
    }


def latency(
    engine: LLMEngine, batch: list[BenchRequest], warmup_iters: int, iters: int
) -> dict[str, Any]:
    """Time to finish one batch, repeated: mean and percentiles in seconds."""

    def one_batch(tag: str) -> float:
        start = time.perf_counter()
        for index, request in enumerate(batch):
            engine.add_request(f"{tag}-{index}", request.prompt, _params(request.output_len, True))
        run_until_done(engine)
        return time.perf_counter() - start

    for i in range(warmup_iters):
        one_batch(f"warmup{i}")
    times = np.array([one_batch(f"iter{i}") for i in range(iters)])
    result: dict[str, Any] = {"avg_latency_s": float(times.mean()), "latencies_s": times.tolist()}
    for p in (10, 25, 50, 75, 90, 99):
        result[f"p{p}_latency_s"] = float(np.percentile(times, p))
    return result
