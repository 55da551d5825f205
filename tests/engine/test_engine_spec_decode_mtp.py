"""DeepSeek's multi-token-prediction layer as a draft head (``--speculative-config '{"method":
"mtp", "num_speculative_tokens": ...}'``), read from the target's own checkpoint: the engine
emits with it the tokens it emits without (greedy; under chunked prefill), while its drafts are
verified and counted, and its guesses do not depend on how its cache was filled; targets without
MTP layers are refused."""

from __future__ import annotations

import pytest
from infernetes.runtime.spec_decode.draft_model import DraftModelProposer
from infernetes.runtime.testing import make_tiny_deepseek_mtp

from infernetes import LLM

from .test_engine_spec_decode_ngram import GREEDY, PROMPTS, SMALL, generate, runner

MTP = {"method": "mtp", "num_speculative_tokens": 2}


@pytest.fixture(scope="module")
def deepseek_with_mtp(model_factory, tmp_path_factory):
    target = model_factory("DeepseekV3ForCausalLM")
    return str(make_tiny_deepseek_mtp(tmp_path_factory.mktemp("mtp") / "model", target))


@pytest.mark.parametrize(
    "settings",
    [{}, {"enable_chunked_prefill": True, "max_num_batched_tokens": 16}],
    ids=["whole", "chunked"],
)
def test_greedy_tokens_equal_those_without(deepseek_with_mtp, settings):
    expected, _, _ = generate(LLM(deepseek_with_mtp, **SMALL), PROMPTS, GREEDY)
    llm = LLM(deepseek_with_mtp, speculative_config=MTP, **SMALL, **settings)
    proposer = runner(llm).proposer
    assert isinstance(proposer, DraftModelProposer) and proposer.shift == 1
    tokens, (drafts, draft_tokens, accepted), _ = generate(llm, PROMPTS, GREEDY)
    assert tokens == expected
    assert drafts > 0 and 0 <= accepted <= draft_tokens


def test_a_target_without_mtp_layers_is_refused(model_factory, tiny_llama):
    with pytest.raises(ValueError, match="LlamaForCausalLM with num_nextn_predict_layers=0"):
        LLM(tiny_llama, speculative_config=MTP, **SMALL)
    # transformers' DeepSeek-V3 config says one MTP layer, and its checkpoint holds none
    with pytest.raises(ValueError, match="lacks weights for"):
        LLM(model_factory("DeepseekV3ForCausalLM"), speculative_config=MTP, **SMALL)


def test_its_guesses_do_not_depend_on_how_its_cache_was_filled(deepseek_with_mtp):
    from .test_engine_spec_decode_eagle import drafts_by_prompt

    whole = drafts_by_prompt(LLM(deepseek_with_mtp, speculative_config=MTP, **SMALL))
    chunked = {**SMALL, "enable_chunked_prefill": True, "max_num_batched_tokens": 8}
    assert drafts_by_prompt(LLM(deepseek_with_mtp, speculative_config=MTP, **chunked)) == whole
