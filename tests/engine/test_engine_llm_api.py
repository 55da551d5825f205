"""The offline LLM API: prompt forms, per-prompt params, chat, metrics."""

from __future__ import annotations

import pytest
from infernetes.runtime.testing import SAMPLE_PROMPTS

from infernetes import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(
        tiny_llama, dtype="float32", max_model_len=128, num_gpu_blocks_override=64, block_size=8
    )


def test_prompt_forms_give_the_same_tokens(llm):
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    ids = llm.get_tokenizer()(SAMPLE_PROMPTS[0]).input_ids
    by_text = llm.generate(SAMPLE_PROMPTS[0], params)[0]
    by_ids = llm.generate([ids], params)[0]
    by_dict = llm.generate({"prompt_token_ids": ids}, params)[0]
    assert by_text.prompt == SAMPLE_PROMPTS[0] and by_ids.prompt is None
    assert (
        by_text.outputs[0].token_ids == by_ids.outputs[0].token_ids == by_dict.outputs[0].token_ids
    )


def test_per_prompt_params_n_and_metrics(llm):
    params = [
        SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),
        SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=4, ignore_eos=True),
    ]
    first, second = llm.generate(SAMPLE_PROMPTS[:2], params)
    assert len(first.outputs) == 1 and len(first.outputs[0].token_ids) == 3
    assert len(second.outputs) == 2 and all(len(c.token_ids) == 4 for c in second.outputs)
    metrics = first.metrics
    assert metrics.arrival_time <= metrics.first_scheduled_time <= metrics.first_token_time
    assert metrics.first_token_time <= metrics.last_token_time <= metrics.finished_time
    with pytest.raises(ValueError, match="got 1 sampling params for 2 prompts"):
        llm.generate(SAMPLE_PROMPTS[:2], [params[0]])
    with pytest.raises(ValueError, match="priority is only allowed"):
        llm.generate(SAMPLE_PROMPTS[:1], params[0], priority=[1])


def test_chat_uses_the_chat_template(llm):
    messages = [{"role": "user", "content": "Hello!"}]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    [output] = llm.chat(messages, params)
    tokenizer = llm.get_tokenizer()
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert output.prompt_token_ids == tokenizer(expected, add_special_tokens=False).input_ids
    assert len(output.outputs[0].token_ids) == 4
