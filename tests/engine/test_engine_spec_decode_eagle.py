"""EAGLE-1 and EAGLE-3 heads (``--speculative-config '{"method": "eagle", "model": ...}'``, and
``eagle3``) in the published layouts, random here: the engine emits with one the tokens it emits
without (greedy; under chunked prefill and preemption) while its drafts are verified and
counted, the head's guesses do not depend on how its cache was filled, and heads that do not
fit the target are refused."""

from __future__ import annotations

import json

import pytest
from infernetes.runtime.spec_decode.config import speculative_config
from infernetes.runtime.spec_decode.draft_model import DraftModelProposer
from infernetes.runtime.testing import make_tiny_eagle, make_tiny_eagle3

from infernetes import LLM

from .test_engine_spec_decode_ngram import GREEDY, PROMPTS, SMALL, generate, runner


def eagle_config(model: str) -> dict:
    return {"method": "eagle", "model": model, "num_speculative_tokens": 3}


@pytest.fixture(scope="module")
def head(tiny_llama, tmp_path_factory):
    return str(make_tiny_eagle(tmp_path_factory.mktemp("eagle"), tiny_llama))


@pytest.fixture(scope="module")
def plain(tiny_llama):
    tokens, _, _ = generate(LLM(tiny_llama, **SMALL), PROMPTS, GREEDY)
    return tokens


def test_method_parsed_as_vllms():
    spec = speculative_config(eagle_config("/heads/eagle"))
    assert spec is not None and (spec.method, spec.draft_model) == ("eagle", "/heads/eagle")
    inferred = speculative_config({"model": "org/EAGLE-LLaMA3-8B", "num_speculative_tokens": 2})
    assert inferred is not None and inferred.method == "eagle"


@pytest.mark.parametrize(
    "settings",
    [{}, {"enable_chunked_prefill": True, "max_num_batched_tokens": 16}],
    ids=["whole", "chunked"],
)
def test_greedy_tokens_equal_those_without(tiny_llama, head, plain, settings):
    llm = LLM(tiny_llama, speculative_config=eagle_config(head), **SMALL, **settings)
    proposer = runner(llm).proposer
    assert isinstance(proposer, DraftModelProposer) and proposer.shift == 1
    tokens, (drafts, draft_tokens, accepted), _ = generate(llm, PROMPTS, GREEDY)
    assert tokens == plain
    assert drafts > 0 and 0 <= accepted <= draft_tokens


def test_preemption(tiny_llama, head, plain):
    small_cache = {**SMALL, "num_gpu_blocks_override": 16}
    llm = LLM(tiny_llama, speculative_config=eagle_config(head), **small_cache)
    scheduler = llm.llm_engine.engine_core.scheduler
    preempt = scheduler._preempt
    preempted = []

    def counted(request):
        preempted.append(request.request_id)
        return preempt(request)

    scheduler._preempt = counted
    try:
        tokens, (drafts, _, _), _ = generate(llm, PROMPTS, GREEDY)
    finally:
        del scheduler._preempt
    assert preempted and drafts > 0
    assert tokens == plain


def test_a_head_of_another_width_is_refused(model_factory, head):
    wider = model_factory("LlamaForCausalLM", hidden_size=128, intermediate_size=256)
    with pytest.raises(ValueError, match="has hidden_size 64 and the target 128"):
        LLM(wider, speculative_config=eagle_config(head), **SMALL)


def test_a_head_is_not_served_as_a_model(head, tmp_path):
    """A head whose config.json names vLLM's EagleLlamaForCausalLM is refused as the target."""
    import shutil

    named = shutil.copytree(head, tmp_path / "named")
    config = json.loads((named / "config.json").read_text())
    config["architectures"] = ["EagleLlamaForCausalLM"]
    (named / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="is a speculative decoding head, not a model to serve"):
        LLM(str(named), **SMALL)


@pytest.fixture(scope="module")
def deeper_llama(model_factory):
    """Four layers: EAGLE-3's default reads the hidden states entering layers 2, 2 and 1."""
    return model_factory("LlamaForCausalLM", num_hidden_layers=4)


@pytest.fixture(scope="module")
def head3(deeper_llama, tmp_path_factory):
    return str(make_tiny_eagle3(tmp_path_factory.mktemp("eagle3"), deeper_llama))


@pytest.mark.parametrize(
    "settings",
    [{}, {"enable_chunked_prefill": True, "max_num_batched_tokens": 16}],
    ids=["whole", "chunked"],
)
def test_eagle3_greedy_tokens_equal_those_without(deeper_llama, head3, settings):
    expected, _, _ = generate(LLM(deeper_llama, **SMALL), PROMPTS, GREEDY)
    spec = {"method": "eagle3", "model": head3, "num_speculative_tokens": 3}
    llm = LLM(deeper_llama, speculative_config=spec, **SMALL, **settings)
    proposer = runner(llm).proposer
    assert isinstance(proposer, DraftModelProposer) and proposer.aux_layers == (2, 2, 1)
    proposed: list[int] = []
    propose = proposer.propose

    def recorded(*args):
        drafts = propose(*args)
        proposed.extend(token for request in drafts for token in request)
        return drafts

    proposer.propose = recorded
    tokens, (drafts, draft_tokens, accepted), _ = generate(llm, PROMPTS, GREEDY)
    assert tokens == expected
    assert drafts > 0 and 0 <= accepted <= draft_tokens
    # d2t maps the head's 256 ids onto every other target id: no odd token is ever guessed
    assert proposed and all(token % 2 == 0 for token in proposed)


def test_eagle3_needs_the_layers_it_reads(tiny_llama, head3):
    spec = {"method": "eagle3", "model": head3, "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match=r"at layers \[2, 1, -1\], which a target of 2 layers"):
        LLM(tiny_llama, speculative_config=spec, **SMALL)


def drafts_by_prompt(llm: LLM) -> dict[tuple[int, ...], list[list[int]]]:
    """Every draft list the head proposes for each prompt while ``llm`` generates ``PROMPTS``."""
    proposer = runner(llm).proposer
    propose = proposer.propose
    recorded: dict[tuple[int, ...], list[list[int]]] = {}

    def recording(batch, num_scheduled, sampling, hidden):
        drafts = propose(batch, num_scheduled, sampling, hidden)
        for i, proposed in zip(sampling, drafts, strict=True):
            recorded.setdefault(tuple(batch[i].prompt_token_ids), []).append(proposed)
        return drafts

    proposer.propose = recording
    generate(llm, PROMPTS, GREEDY)
    return recorded


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_a_heads_guesses_do_not_depend_on_how_its_cache_was_filled(
    method, tiny_llama, deeper_llama, head, head3
):
    """The head's keys and values written by a whole prefill, by chunks beside other requests,
    or again after a preemption, are the same: so are its guesses at each step."""
    target, model = (tiny_llama, head) if method == "eagle" else (deeper_llama, head3)
    spec = {"method": method, "model": model, "num_speculative_tokens": 3}
    whole = drafts_by_prompt(LLM(target, speculative_config=spec, **SMALL))
    chunked = {**SMALL, "enable_chunked_prefill": True, "max_num_batched_tokens": 8}
    assert drafts_by_prompt(LLM(target, speculative_config=spec, **chunked)) == whole
    preempting = {**SMALL, "num_gpu_blocks_override": 16}
    assert drafts_by_prompt(LLM(target, speculative_config=spec, **preempting)) == whole


def test_lora_requests_and_structured_outputs(tiny_llama, head, tmp_path):
    """An EAGLE head beside LoRA requests (the target verifies with the adapter; the head
    guesses from the adapted hidden states) and constrained requests (a grammar mask at every
    draft position): the tokens a run without speculation emits, valid."""
    import re

    from infernetes.runtime.lora.request import LoRARequest
    from infernetes.runtime.sampling_params import StructuredOutputsParams
    from infernetes.runtime.testing import SAMPLE_PROMPTS, make_tiny_lora

    from infernetes import SamplingParams

    from .test_engine_spec_decode_draft_model import per_position_counts
    from .test_engine_structured_output import REGEX, SCHEMA, _is_answer

    settings = {**SMALL, "enable_lora": True, "max_lora_rank": 8}
    lora = LoRARequest("adapter", 1, str(make_tiny_lora(tiny_llama, tmp_path / "adapter")))
    plain = LLM(tiny_llama, **settings)
    expected = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, GREEDY, lora_request=lora)]
    llm = LLM(tiny_llama, speculative_config=eagle_config(head), **settings)
    per_pos, outputs = per_position_counts(llm, PROMPTS, GREEDY, lora_request=lora)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert per_pos[0] > 0  # drafts were made and verified

    def constrained(kind: str, spec) -> SamplingParams:
        return SamplingParams(
            temperature=0.0,
            max_tokens=40,
            structured_outputs=StructuredOutputsParams(kind, spec, compact=True),
        )

    requests = [*PROMPTS, *SAMPLE_PROMPTS[:2]]
    sampling = [GREEDY] * len(PROMPTS) + [constrained("json", SCHEMA), constrained("regex", REGEX)]
    expected = [o.outputs[0].token_ids for o in plain.generate(requests, sampling)]
    scheduler = llm.llm_engine.engine_core.scheduler
    update, drafted = scheduler.update_from_output, []

    def counted(scheduler_output, model_output):
        updated, iteration = update(scheduler_output, model_output)
        drafted.append(iteration.num_draft_tokens)
        return updated, iteration

    scheduler.update_from_output = counted
    outputs = llm.generate(requests, sampling)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert sum(drafted) > 0  # drafts were verified beside the constrained requests
    assert _is_answer(outputs[-2].outputs[0].text)
    assert re.fullmatch(REGEX, outputs[-1].outputs[0].text)
