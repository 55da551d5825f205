"""A prompt given as embeddings (vLLM's ``{"prompt_embeds": tensor}``) generates what the same
prompt given as token ids does, chunked and batched beside token prompts, and never shares
prefix-cache blocks with a token prompt."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from infernetes.runtime.testing import SAMPLE_PROMPTS as PROMPTS
from infernetes.runtime.testing import StepTotals
from infernetes.runtime.worker.request_state import CachedRequestState

from infernetes import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
ENGINE = dict(
    dtype="float32",
    max_model_len=128,
    num_gpu_blocks_override=64,
    block_size=8,
    enable_prompt_embeds=True,
)


def _embed(llm: LLM, ids: list[int]) -> torch.Tensor:
    """The model's own embedding of ``ids``: what its forward starts from on token ids."""
    model = llm.llm_engine.engine_core.executor.driver_worker.model_runner.model
    with torch.no_grad():
        return model.embed_input_ids(torch.tensor(ids))


def _tokens(outputs) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in outputs]


@pytest.fixture(scope="module")
def llama(tiny_llama):
    return LLM(tiny_llama, **ENGINE)


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "GemmaForCausalLM"])
def test_embeds_equal_token_ids_chunked_beside_token_prompts(model_factory, architecture):
    # A budget of 8 tokens a step splits the longer prompts into chunks, each a slice of its
    # tensor, mixed with other prompts' chunks and decodes.
    llm = LLM(
        model_factory(architecture), **ENGINE, max_num_batched_tokens=8, enable_chunked_prefill=True
    )
    ids = [llm.get_tokenizer()(prompt).input_ids for prompt in PROMPTS]
    assert max(len(i) for i in ids) > 16
    expected = llm.generate(ids, GREEDY)
    llm.reset_prefix_cache()
    mixed = [{"prompt_embeds": _embed(llm, i)} if k % 2 else i for k, i in enumerate(ids)]
    outputs = llm.generate(mixed, GREEDY)
    assert _tokens(outputs) == _tokens(expected)
    assert outputs[1].prompt_token_ids == []  # no token ids are known
    assert outputs[0].prompt_token_ids == ids[0]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_embeds_survive_preemption_by_recompute(tiny_llama, async_scheduling):
    # 10 blocks for 4 prompts of up to 24 + 24 tokens: requests are preempted and recompute
    # their prompts from their embeddings again.

    llm = LLM(
        tiny_llama,
        **{**ENGINE, "max_model_len": 64, "num_gpu_blocks_override": 10},
        async_scheduling=async_scheduling,
    )
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    ids = [llm.get_tokenizer()(prompt).input_ids for prompt in PROMPTS]
    expected = llm.generate(ids, params)
    totals = StepTotals.attach(llm)
    outputs = llm.generate([{"prompt_embeds": _embed(llm, i)} for i in ids], params)
    assert totals.preemptions > 0
    assert _tokens(outputs) == _tokens(expected)


def test_prefix_cache_keeps_embeds_and_token_prompts_apart(llama):
    ids = llama.get_tokenizer()(PROMPTS[3]).input_ids
    embeds = {"prompt_embeds": _embed(llama, ids)}
    # An embeds prompt's token ids are placeholder zeros: a token prompt of zeros caches blocks
    # its hashes would match, were the embeddings not part of them.
    llama.generate([0] * len(ids), GREEDY)
    [first] = llama.generate(embeds, GREEDY)
    assert first.num_cached_tokens == 0
    [again] = llama.generate(embeds, GREEDY)  # the same embeddings share their blocks
    assert again.num_cached_tokens >= 16
    [tokens] = llama.generate(ids, GREEDY)
    assert tokens.num_cached_tokens == 0
    assert _tokens([first]) == _tokens([again]) == _tokens([tokens])


@pytest.mark.parametrize(
    ("embeds", "params", "message"),
    [
        (torch.zeros(4, 3), GREEDY, r"prompt_embeds must be a floating-point tensor of shape"),
        (torch.zeros(4, 64, dtype=torch.long), GREEDY, "floating-point"),
        (torch.zeros(0, 64), GREEDY, "The prompt cannot be empty"),
        (torch.zeros(200, 64), GREEDY, "longer than the maximum model length of 128"),
        (torch.zeros(4, 64), SamplingParams(prompt_logprobs=1), "prompt_logprobs needs"),
    ],
)
def test_bad_embeds_are_refused(llama, embeds, params, message):
    with pytest.raises(ValueError, match=message):
        llama.generate({"prompt_embeds": embeds}, params)
    assert not llama.llm_engine.has_unfinished_requests()


def test_embeds_need_the_flag_and_a_model_that_takes_them(tiny_llama, model_factory):
    embeds = {"prompt_embeds": torch.zeros(4, 64)}
    without_flag = LLM(tiny_llama, dtype="float32", max_model_len=128, num_gpu_blocks_override=8)
    with pytest.raises(ValueError, match=r"prompt_embeds needs .* --enable-prompt-embeds"):
        without_flag.generate(embeds, GREEDY)
    gpt2 = LLM(model_factory("GPT2LMHeadModel"), **{**ENGINE, "num_gpu_blocks_override": 16})
    with pytest.raises(ValueError, match="prompt_embeds is not supported by GPT2LMHeadModel"):
        gpt2.generate(embeds, GREEDY)


def test_penalties_see_no_placeholder_ids(llama):
    # A repetition penalty reads the prompt's token ids: an embeds prompt has none, so its
    # placeholder zeros must not count as tokens it holds.
    state = CachedRequestState("r", [0, 0, 0, 7], 3, GREEDY, None, -1, 0)
    assert state.prompt_token_ids == [0, 0, 0]
    state.prompt_embeds = torch.zeros(3, 64)
    assert state.prompt_token_ids == []
    assert state.output_token_ids == [7]
    penalised = SamplingParams(temperature=0.0, max_tokens=4, repetition_penalty=1.5)
    [output] = llama.generate({"prompt_embeds": torch.randn(5, 64)}, penalised)
    assert len(output.outputs[0].token_ids) == 4


@pytest.mark.slow  # a worker process per rank, about ten seconds a case
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_embeds_equal_token_ids_across_ranks(tiny_llama, tp, pp):
    # The tensor crosses to every rank; the first stage embeds (sharded across tensor ranks).
    from safetensors.torch import load_file

    [weights] = Path(tiny_llama).glob("*.safetensors")
    table = load_file(weights)["model.embed_tokens.weight"]
    llm = LLM(
        tiny_llama,
        **ENGINE,
        device="cpu",
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_num_batched_tokens=8,
    )
    ids = [llm.get_tokenizer()(prompt).input_ids for prompt in PROMPTS[1:3]]
    expected = llm.generate(ids, GREEDY)
    llm.reset_prefix_cache()
    outputs = llm.generate([{"prompt_embeds": table[ids[0]]}, ids[1]], GREEDY)
    assert _tokens(outputs) == _tokens(expected)
