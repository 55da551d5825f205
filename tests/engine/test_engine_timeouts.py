"""A hung engine fails instead of hanging: VLLM_ENGINE_ITERATION_TIMEOUT_S bounds an engine step
while requests are in flight, VLLM_RPC_TIMEOUT the core's answer to a maintenance call."""

from __future__ import annotations

import asyncio
import time

import pytest
from infernetes.runtime.engine.async_engine import AsyncEngine, EngineDeadError
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.runtime.testing import SAMPLE_PROMPTS

from infernetes.schema.config import build_config

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture
def config(tiny_llama):
    return build_config(
        model=tiny_llama,
        dtype="float32",
        max_model_len=128,
        num_gpu_blocks_override=32,
        block_size=8,
    )


async def _generate(engine: AsyncEngine, request_id: str) -> list[int]:
    outputs = [out async for out in engine.generate(SAMPLE_PROMPTS[0], PARAMS, request_id)]
    return outputs[-1].outputs[0].token_ids


async def test_a_step_longer_than_the_iteration_timeout_fails_the_engine(config, monkeypatch):
    monkeypatch.setenv("VLLM_ENGINE_ITERATION_TIMEOUT_S", "1")
    engine = AsyncEngine.from_config(config)
    step = engine.engine.step

    def stuck_step():
        time.sleep(3)
        return step()

    engine.engine.step = stuck_step
    started = time.monotonic()
    with pytest.raises(EngineDeadError, match="VLLM_ENGINE_ITERATION_TIMEOUT_S=1"):
        await _generate(engine, "stuck")
    assert time.monotonic() - started < 2.9  # failed by the deadline, not by the step's end
    assert engine.errored
    with pytest.raises(EngineDeadError):
        await engine.check_health()
    await engine.shutdown()


async def test_idle_time_and_quick_steps_are_not_a_timeout(config, monkeypatch):
    monkeypatch.setenv("VLLM_ENGINE_ITERATION_TIMEOUT_S", "1")
    engine = AsyncEngine.from_config(config)
    first = await _generate(engine, "a")
    await asyncio.sleep(1.6)  # idle past the limit: no request is owed a step
    assert await _generate(engine, "b") == first
    assert not engine.errored
    await engine.shutdown()


async def test_an_unanswered_maintenance_call_fails_the_engine(config, monkeypatch):
    monkeypatch.setenv("VLLM_RPC_TIMEOUT", "300")
    engine = AsyncEngine.from_config(config)
    engine.engine.reset_prefix_cache = lambda: time.sleep(2)
    started = time.monotonic()
    with pytest.raises(
        EngineDeadError, match="did not answer reset_prefix_cache within VLLM_RPC_TIMEOUT=300 ms"
    ):
        await engine.reset_prefix_cache()
    assert time.monotonic() - started < 1.5
    assert engine.errored
    await engine.shutdown()
