"""Greedy generation equals transformers token for token (float32), under every scheduling path."""

from __future__ import annotations

import pytest
from infernetes.runtime.testing import SAMPLE_PROMPTS as PROMPTS
from infernetes.runtime.testing import StepTotals

from infernetes import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _check_exact(hf_greedy, llm: LLM, path: str, outputs, prompts=PROMPTS, max_tokens=12) -> None:
    tokenizer = llm.get_tokenizer()
    for prompt, output in zip(prompts, outputs, strict=True):
        ids = tokenizer(prompt).input_ids if isinstance(prompt, str) else prompt
        assert output.prompt_token_ids == ids
        assert output.outputs[0].token_ids == hf_greedy(path, ids, max_tokens), prompt


def test_single_prompt_matches_transformers(hf_greedy, tiny_llama):
    llm = LLM(tiny_llama, dtype="float32", max_model_len=128, num_gpu_blocks_override=32)
    [output] = llm.generate(PROMPTS[1], GREEDY)
    assert output.finished and output.outputs[0].finish_reason == "length"
    _check_exact(hf_greedy, llm, tiny_llama, [output], [PROMPTS[1]])


def test_batch_of_different_lengths_matches_transformers(hf_greedy, tiny_llama):
    llm = LLM(tiny_llama, dtype="float32", max_model_len=128, num_gpu_blocks_override=64)
    _check_exact(hf_greedy, llm, tiny_llama, llm.generate(PROMPTS, GREEDY))


def test_chunked_prefill_matches_transformers(hf_greedy, tiny_llama):
    # A budget of 8 tokens per step splits every prompt into chunks mixed with decodes.
    llm = LLM(
        tiny_llama,
        dtype="float32",
        max_model_len=128,
        num_gpu_blocks_override=64,
        max_num_batched_tokens=8,
        enable_chunked_prefill=True,
        block_size=8,
    )
    _check_exact(hf_greedy, llm, tiny_llama, llm.generate(PROMPTS, GREEDY))


def test_long_prefill_threshold_and_partial_prefill_limits(hf_greedy, tiny_llama):
    llm = LLM(
        tiny_llama,
        dtype="float32",
        max_model_len=128,
        num_gpu_blocks_override=64,
        long_prefill_token_threshold=5,
        max_num_partial_prefills=2,
        max_long_partial_prefills=1,
    )
    _check_exact(hf_greedy, llm, tiny_llama, llm.generate(PROMPTS, GREEDY))


def test_prefix_cache_hit_is_exact(hf_greedy, tiny_llama):
    llm = LLM(
        tiny_llama, dtype="float32", max_model_len=128, num_gpu_blocks_override=64, block_size=8
    )
    shared = PROMPTS[3]
    first = llm.generate(shared + " One", GREEDY)
    second = llm.generate(shared + " Two", GREEDY)
    assert first[0].num_cached_tokens == 0
    assert second[0].num_cached_tokens >= 16  # the shared prefix spans several full blocks
    _check_exact(hf_greedy, llm, tiny_llama, first + second, [shared + " One", shared + " Two"])


@pytest.mark.parametrize(
    ("policy", "caching"), [("fcfs", False), ("priority", False), ("fcfs", True)]
)
def test_preemption_by_recompute_is_exact(hf_greedy, tiny_llama, policy, caching):
    llm = LLM(
        tiny_llama,
        dtype="float32",
        max_model_len=64,
        num_gpu_blocks_override=10,
        block_size=8,
        scheduling_policy=policy,
        enable_prefix_caching=caching,
    )
    totals = StepTotals.attach(llm)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, priority=[0, 1, 2, 3] if policy == "priority" else None)
    assert totals.preemptions > 0
    _check_exact(hf_greedy, llm, tiny_llama, outputs, max_tokens=24)
    assert llm.llm_engine.engine_core.block_manager.num_free_blocks == 10


def test_abort_mid_generation_frees_blocks(hf_greedy, tiny_llama):
    llm = LLM(
        tiny_llama, dtype="float32", max_model_len=128, num_gpu_blocks_override=40, block_size=8
    )
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, params)
    for _ in range(3):
        engine.step()
    assert engine.engine_core.block_manager.num_free_blocks < 40
    aborted = engine.abort_request(["r0", "r2"])
    assert [o.outputs[0].finish_reason for o in aborted] == ["abort", "abort"]
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
    assert set(finished) == {"r1", "r3"}
    assert engine.engine_core.block_manager.num_free_blocks == 40
    assert engine.engine_core.scheduler.num_running == engine.engine_core.scheduler.num_waiting == 0
    tokenizer = llm.get_tokenizer()
    for request_id in ("r1", "r3"):
        prompt = PROMPTS[int(request_id[1])]
        assert finished[request_id].outputs[0].token_ids == hf_greedy(
            tiny_llama, tokenizer(prompt).input_ids, 30
        )
