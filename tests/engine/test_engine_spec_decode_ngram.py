"""N-gram prompt lookup (``--speculative-config '{"method": "ngram", ...}'``): the lookup on
hand-made histories, the settings vLLM's SpeculativeConfig allows, and an engine built with it
that emits the tokens it emits without drafts (greedy; with chunked prefill and prefix-cache hits)
while it verifies and accepts some."""

from __future__ import annotations

import itertools
import json

import pytest
from infernetes.runtime.config import SpeculativeConfig
from infernetes.runtime.spec_decode.config import speculative_config
from infernetes.runtime.spec_decode.ngram import NgramProposer, lookup
from infernetes.runtime.spec_decode.proposer import NoProposer, Proposer
from infernetes.runtime.testing import SAMPLE_PROMPTS

from infernetes import LLM, SamplingParams
from infernetes.cli import main as cli_main

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}
SMALL = dict(dtype="float32", max_model_len=128, num_gpu_blocks_override=96, block_size=8)
# text that repeats, so the lookup finds its last tokens earlier on
PROMPTS = [
    "the cat sat on the mat, the cat sat on the mat, the cat sat on the",
    f"{SAMPLE_PROMPTS[1]}. {SAMPLE_PROMPTS[1]}",
    "one two three four one two three four one two",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        # the last three tokens (1, 2, 3) occurred twice: the most recent occurrence wins
        ([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], [7, 8, 1]),
        # (4, 2, 3) never occurred, (2, 3) did: the longest that occurred wins over the later 3
        ([2, 3, 5, 6, 3, 8, 4, 2, 3], [5, 6, 3]),
        ([3, 1, 5, 3, 6, 7, 9, 3], [6, 7, 9]),  # one token: its latest earlier occurrence
        ([1, 2, 3, 4, 5, 6, 7, 8, 1], [2, 3, 4]),  # capped at k
        ([4, 5, 6, 4], [5, 6, 4]),  # what followed may run into the matched tokens themselves
        ([1, 2, 3, 4], []),  # none occurred
        ([7], []),
        ([], []),
    ],
)
def test_lookup(history, expected):
    assert lookup(history, 1, 3, 3) == expected


def test_lookup_needs_min_n_tokens_to_match():
    assert lookup([2, 3, 9, 5, 3], 2, 3, 3) == []  # only the last token (3) occurred before
    assert lookup([2, 3, 9, 5, 3], 1, 3, 3) == [9, 5, 3]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"method": "ngram", "num_speculative_tokens": 4}, (4, 5, 5)),  # vLLM's default bounds
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}, (2, 3, 3)),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2}, (2, 2, 2)),
        ({"model": "[ngram]", "num_speculative_tokens": 1}, (1, 5, 5)),
        (NGRAM, (3, 1, 3)),
    ],
)
def test_settings_default_as_vllms(given, expected):
    k, low, high = expected
    assert speculative_config(given) == SpeculativeConfig("ngram", k, low, high)
    assert speculative_config(None) is None


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"method": "ngram"}, "num_speculative_tokens must be an integer of 1 or more; got None"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be"),
        ({"num_speculative_tokens": 2}, 'method must be "ngram"'),
        (
            {**NGRAM, "prompt_lookup_min": 4},
            "prompt_lookup_min=4 must be <= prompt_lookup_max=3",
        ),
        ({**NGRAM, "prompt_lookup_min": 0}, "prompt_lookup_min must be an integer of 1 or more"),
        ({**NGRAM, "bogus": 2}, "unknown key(s) bogus; allowed:"),
        ({**NGRAM, "disable_by_batch_size": 0}, "disable_by_batch_size must be an integer of 1"),
        ({**NGRAM, "draft_tensor_parallel_size": 2}, "is for a draft model; method ngram has none"),
    ],
)
def test_settings_vllm_refuses_are_refused(given, message):
    with pytest.raises(ValueError, match="speculative_config") as caught:
        speculative_config(given)
    assert message in str(caught.value)


def test_pipeline_stages_with_drafts_are_refused():
    with pytest.raises(ValueError, match="across pipeline stages is planned"):
        speculative_config(NGRAM, pipeline_parallel_size=2)


def config_refusal(argv: list[str], capsys) -> tuple[int, str]:
    """``infernetes config``'s exit status and stderr for a model id no folder holds."""
    try:
        code = cli_main.main(["config", "example-org/absent-model", *argv])
    except SystemExit as exc:  # the support table's refusals exit as argparse errors do
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_config_refuses_other_methods_and_pipeline_stages(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    eagle = {"method": "suffix", "num_speculative_tokens": 3}
    code, err = config_refusal(["--speculative-config", json.dumps(eagle)], capsys)
    assert code == 2
    assert "--speculative-config.method suffix is not supported" in err
    argv = ["--speculative-config", json.dumps(NGRAM), "--pipeline-parallel-size", "2"]
    code, err = config_refusal(argv, capsys)
    assert code == 2 and "speculative decoding across pipeline stages is planned" in err


def runner(llm: LLM):
    return llm.llm_engine.engine_core.executor.driver_worker.model_runner


def generate(
    llm: LLM, prompts: list, params: SamplingParams, proposer: Proposer | None = None
) -> tuple[dict[tuple[int, ...], list[int]], list[int], int]:
    """Tokens by prompt ids; [steps with drafts, draft tokens, accepted ones]; cached tokens.
    ``proposer`` stands in for the engine's own for this call."""
    model_runner = runner(llm)
    own = model_runner.proposer
    model_runner.proposer = proposer or own
    scheduler = llm.llm_engine.engine_core.scheduler
    update = scheduler.update_from_output
    counts = [0, 0, 0]

    def counted(scheduler_output, model_output):
        updated, iteration = update(scheduler_output, model_output)
        counts[0] += iteration.num_drafts
        counts[1] += iteration.num_draft_tokens
        counts[2] += iteration.num_accepted_tokens
        # vLLM's per-position vector: each position's acceptances sum to the accepted tokens,
        # and a later position is accepted only after every earlier one
        per_pos = iteration.num_accepted_tokens_per_pos
        assert sum(per_pos) == iteration.num_accepted_tokens
        assert all(a >= b for a, b in itertools.pairwise(per_pos))
        return updated, iteration

    scheduler.update_from_output = counted
    try:
        outputs = llm.generate(prompts, params)
    finally:
        del scheduler.update_from_output
        model_runner.proposer = own
    tokens = {tuple(o.prompt_token_ids): list(o.outputs[0].token_ids) for o in outputs}
    return tokens, counts, sum(o.num_cached_tokens for o in outputs)


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, speculative_config=NGRAM, **SMALL)


@pytest.fixture(scope="module")
def plain(llm):
    """Each prompt's greedy tokens without drafts."""
    tokens, counts, _ = generate(llm, PROMPTS, GREEDY, NoProposer())
    assert counts == [0, 0, 0]
    return tokens


def test_greedy_tokens_equal_those_without_drafts(llm, plain, tiny_llama, hf_greedy):
    assert isinstance(runner(llm).proposer, NgramProposer)
    prompt = next(iter(plain))
    assert plain[prompt] == hf_greedy(tiny_llama, list(prompt), 24)
    drafted, (drafts, draft_tokens, accepted), cached = generate(llm, PROMPTS, GREEDY)
    assert drafted == plain
    assert drafts > 0 and 0 < accepted <= draft_tokens <= 3 * drafts
    assert cached > 0  # the prompts' blocks, cached by the run without drafts


def test_blocks_written_while_drafting_serve_prefix_cache_hits(llm, plain, tiny_llama, hf_greedy):
    """A prompt that continues an earlier one with its drafted output reads that output's KV
    from the prefix cache: KV written at rejected drafts' positions must not be in it."""
    fresh = [f"again: {prompt}" for prompt in PROMPTS]  # blocks no earlier run cached
    drafted, (drafts, _, _), _ = generate(llm, fresh, GREEDY)
    assert drafts > 0
    longer = [list(prompt) + tokens[:20] for prompt, tokens in drafted.items()]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    tokens, (drafts, _, _), cached = generate(
        llm, [{"prompt_token_ids": ids} for ids in longer], params
    )
    # every block but a prompt's last two (its partial one, and the one recomputed for logits)
    assert cached >= sum(len(ids) - 15 for ids in longer)
    assert drafts > 0
    for ids in longer:
        assert tokens[tuple(ids)] == hf_greedy(tiny_llama, ids, 12)


def test_chunked_prefill(tiny_llama, plain):
    chunked = LLM(
        tiny_llama,
        speculative_config=NGRAM,
        enable_chunked_prefill=True,
        max_num_batched_tokens=16,
        **SMALL,
    )
    tokens, (drafts, _, accepted), _ = generate(chunked, PROMPTS, GREEDY)
    assert tokens == plain
    assert drafts > 0 and accepted > 0


def test_seeded_sampling_gives_valid_tokens(llm):
    params = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=7)
    tokens, (drafts, _, _), _ = generate(llm, PROMPTS, params)
    vocab = runner(llm).config.model.vocab_size
    assert drafts > 0
    for output in tokens.values():
        assert len(output) == 24 and all(0 <= t < vocab for t in output)


def test_disable_by_batch_size(tiny_llama, plain):
    """No drafts are verified in a step of that many requests or more (vLLM's setting)."""
    assert speculative_config({**NGRAM, "disable_by_batch_size": 3}) == SpeculativeConfig(
        "ngram", 3, 1, 3, disable_by_batch_size=3
    )
    loaded = LLM(tiny_llama, speculative_config={**NGRAM, "disable_by_batch_size": 3}, **SMALL)
    tokens, (drafts, _, _), _ = generate(loaded, PROMPTS, GREEDY)  # three at once, throughout
    assert tokens == plain and drafts == 0
    _, (drafts, _, _), _ = generate(loaded, PROMPTS[:2], GREEDY)
    assert drafts > 0
