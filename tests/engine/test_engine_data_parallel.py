"""Data parallelism (``--data-parallel-size``): several engine cores (each a process of its own)
behind one AsyncEngine. Each
request goes to the least loaded core and gets the greedy tokens of a single engine; aborts reach
the core that holds the request; maintenance calls reach every core; each core's statistics
carry its index. The offline engine, which runs one core, refuses it."""

from __future__ import annotations

import asyncio

import pytest
from infernetes.runtime.engine.async_engine import AsyncEngine
from infernetes.runtime.engine.llm_engine import LLMEngine
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.runtime.testing import SAMPLE_PROMPTS

from infernetes.schema.config import build_config


class Recorder:
    def __init__(self) -> None:
        self.busy_engines: set[int] = set()
        self.finished: list[str] = []

    def record(self, scheduler_stats, iteration_stats) -> None:
        if scheduler_stats.num_running_reqs:
            self.busy_engines.add(scheduler_stats.engine_index)
        self.finished += [f.request_id for f in iteration_stats.finished_requests]


def _config(model: str, **overrides):
    return build_config(
        model,
        dtype="float32",
        max_model_len=128,
        num_gpu_blocks_override=64,
        block_size=8,
        data_parallel_size=2,
        **overrides,
    )


async def test_requests_spread_over_the_cores_with_single_engine_tokens(tiny_llama, hf_greedy):
    recorder = Recorder()
    engine = AsyncEngine.from_config(_config(tiny_llama), [recorder], multiprocess=True)
    try:
        assert len(engine.cores) == 2
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)

        async def run(i: int, prompt: str):
            return [out async for out in engine.generate(prompt, params, f"req-{i}")][-1]

        finals = await asyncio.gather(*(run(i, p) for i, p in enumerate(SAMPLE_PROMPTS)))
        for prompt, final in zip(SAMPLE_PROMPTS, finals, strict=True):
            ids = engine.tokenizer(prompt).input_ids
            assert final.outputs[0].token_ids == hf_greedy(tiny_llama, ids, 8)
        assert recorder.busy_engines == {0, 1}  # both cores served
        assert sorted(recorder.finished) == [f"req-{i}" for i in range(len(SAMPLE_PROMPTS))]
        assert engine._load == [0, 0]

        # An abort reaches the core holding the request; its stream ends with "abort".
        long = SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)
        streams = [engine.generate(SAMPLE_PROMPTS[i], long, f"long-{i}") for i in range(2)]
        firsts = [await anext(stream) for stream in streams]
        assert not any(first.finished for first in firsts)
        await engine.abort(["long-0", "long-1"])
        for stream in streams:
            last = [out async for out in stream][-1]
            assert last.outputs[0].finish_reason == "abort"
        assert engine._load == [0, 0]
        assert await engine.reset_prefix_cache() is True
    finally:
        await engine.shutdown()


def test_the_offline_engine_and_the_core_thread_refuse_it(tiny_llama):
    with pytest.raises(ValueError, match="data_parallel_size above 1 runs several engine cores"):
        LLMEngine(_config(tiny_llama))
    with pytest.raises(ValueError, match="needs each engine core in a process of its own"):
        AsyncEngine.from_config(_config(tiny_llama), multiprocess=False)
