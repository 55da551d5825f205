"""Sampling parameters: seeds independent of the batch, logprobs, stops, biases, penalties."""

from __future__ import annotations

import math

import pytest
import torch
from infernetes.runtime.testing import SAMPLE_PROMPTS

from infernetes import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(
        tiny_llama,
        dtype="float32",
        max_model_len=128,
        num_gpu_blocks_override=96,
        block_size=8,
        seed=0,
    )


def _greedy(llm, prompt, n=12, **kw):
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)
    return llm.generate(prompt, params)[0].outputs[0]


@pytest.mark.parametrize("top_k", [50, 0])  # top_p among the top-k candidates, or by rejection
def test_seeded_sampling_is_independent_of_the_batch(llm, top_k):
    params = SamplingParams(
        temperature=1.0, top_p=0.9, top_k=top_k, seed=1234, max_tokens=16, ignore_eos=True
    )
    alone = llm.generate(SAMPLE_PROMPTS[0], params)[0].outputs[0].token_ids
    busy = [
        SamplingParams(
            temperature=0.8, top_p=0.7 if i % 2 else 1.0, max_tokens=24, ignore_eos=True, seed=i
        )
        for i in range(5)
    ]
    busy += [SamplingParams(temperature=1.2, max_tokens=20, ignore_eos=True)] * 3
    prompts = [SAMPLE_PROMPTS[i % 4] for i in range(8)]
    # The seeded request sits in the middle of a busy batch of other sampled requests.
    outputs = llm.generate(
        [*prompts[:4], SAMPLE_PROMPTS[0], *prompts[4:]], [*busy[:4], params, *busy[4:]]
    )
    assert outputs[4].outputs[0].token_ids == alone
    again = llm.generate(SAMPLE_PROMPTS[0], params)[0].outputs[0].token_ids
    assert again == alone
    other_seed = SamplingParams(
        temperature=1.0, top_p=0.9, top_k=top_k, seed=99, max_tokens=16, ignore_eos=True
    )
    assert llm.generate(SAMPLE_PROMPTS[0], other_seed)[0].outputs[0].token_ids != alone


def test_n_samples_with_seed(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    [output] = llm.generate(SAMPLE_PROMPTS[1], params)
    assert [c.index for c in output.outputs] == [0, 1, 2]
    samples = [tuple(c.token_ids) for c in output.outputs]
    assert len(set(samples)) == 3
    assert [
        tuple(c.token_ids) for c in llm.generate(SAMPLE_PROMPTS[1], params)[0].outputs
    ] == samples


def test_filters_that_reduce_to_greedy(llm):
    greedy = _greedy(llm, SAMPLE_PROMPTS[1]).token_ids
    for kw in (dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0)):
        params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, **kw)
        assert llm.generate(SAMPLE_PROMPTS[1], params)[0].outputs[0].token_ids == greedy, kw


def test_logprobs_match_transformers(llm, tiny_llama):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    prompt = SAMPLE_PROMPTS[3]
    params = SamplingParams(
        temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2
    )
    [output] = llm.generate(prompt, params)
    completion = output.outputs[0]
    ids = output.prompt_token_ids + completion.token_ids
    with torch.inference_mode():
        reference = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    n_prompt = len(output.prompt_token_ids)
    assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == n_prompt
    for pos in range(1, n_prompt):
        entry = output.prompt_logprobs[pos]
        token = ids[pos]
        assert math.isclose(entry[token].logprob, reference[pos - 1, token].item(), abs_tol=1e-4)
        assert entry[token].rank == int((reference[pos - 1] > reference[pos - 1, token]).sum()) + 1
        assert len(entry) in (2, 3)  # the prompt token plus the top 2 (which may include it)
    total = 0.0
    for step, entry in enumerate(completion.logprobs):
        token = completion.token_ids[step]
        expected = reference[n_prompt + step - 1, token].item()
        assert math.isclose(entry[token].logprob, expected, abs_tol=1e-4)
        assert entry[token].rank == 1 and len(entry) == 3
        assert entry[token].decoded_token == llm.get_tokenizer().decode([token])
        total += entry[token].logprob
    assert math.isclose(completion.cumulative_logprob, total, abs_tol=1e-5)


def test_prompt_logprobs_under_chunked_prefill(tiny_llama, llm):
    chunked = LLM(
        tiny_llama,
        dtype="float32",
        max_model_len=128,
        num_gpu_blocks_override=32,
        block_size=8,
        max_num_batched_tokens=8,
    )
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=0)
    expected = llm.generate(SAMPLE_PROMPTS[1], params)[0].prompt_logprobs
    got = chunked.generate(SAMPLE_PROMPTS[1], params)[0].prompt_logprobs
    assert len(got) == len(expected)
    for a, b in zip(got[1:], expected[1:], strict=True):
        assert a.keys() == b.keys()
        assert all(math.isclose(a[k].logprob, b[k].logprob, abs_tol=1e-4) for k in a)


def test_stop_strings_and_stop_token_ids(llm):
    full = _greedy(llm, SAMPLE_PROMPTS[1], n=16)
    text = full.text
    stop = text[5:8]
    cut = text.index(stop)
    stopped = _greedy(llm, SAMPLE_PROMPTS[1], n=16, stop=[stop])
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop
    assert stopped.text == text[:cut]
    included = _greedy(llm, SAMPLE_PROMPTS[1], n=16, stop=stop, include_stop_str_in_output=True)
    assert included.text == text[: cut + len(stop)]
    token = full.token_ids[3]
    by_id = _greedy(llm, SAMPLE_PROMPTS[1], n=16, stop_token_ids=[token])
    first = full.token_ids.index(token)
    assert by_id.token_ids == full.token_ids[: first + 1]
    assert by_id.finish_reason == "stop" and by_id.stop_reason == token
    # min_tokens masks the stop token until enough tokens were generated
    delayed = _greedy(llm, SAMPLE_PROMPTS[1], n=16, stop_token_ids=[token], min_tokens=first + 2)
    assert len(delayed.token_ids) > first + 1
    assert token not in delayed.token_ids[: first + 2]


def test_eos_stops_unless_ignored(llm):
    eos = llm.get_tokenizer().eos_token_id
    params = SamplingParams(temperature=0.0, max_tokens=10, logit_bias={eos: 100.0})
    out = llm.generate(SAMPLE_PROMPTS[0], params)[0].outputs[0]
    assert out.token_ids == [eos] and out.finish_reason == "stop" and out.stop_reason is None
    assert out.text == ""
    ignored = SamplingParams(
        temperature=0.0, max_tokens=10, logit_bias={eos: 100.0}, ignore_eos=True
    )
    assert llm.generate(SAMPLE_PROMPTS[0], ignored)[0].outputs[0].token_ids == [eos] * 10


def test_logit_bias_allowed_tokens_and_logits_processors(llm):
    biased = _greedy(llm, SAMPLE_PROMPTS[0], n=5, logit_bias={42: 100.0})
    assert biased.token_ids == [42] * 5
    allowed = _greedy(llm, SAMPLE_PROMPTS[0], n=8, allowed_token_ids=[100, 101, 102])
    assert set(allowed.token_ids) <= {100, 101, 102}
    seen = []

    def force_77(output_ids, logits):
        seen.append(list(output_ids))
        logits = logits.clone()
        logits[77] = 1e9
        return logits

    forced = _greedy(llm, SAMPLE_PROMPTS[0], n=3, logits_processors=[force_77])
    assert forced.token_ids == [77, 77, 77]
    assert seen == [[], [77], [77, 77]]


def test_repetition_penalty_matches_transformers(llm, tiny_llama):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    ids = llm.get_tokenizer()(SAMPLE_PROMPTS[3]).input_ids
    ours = _greedy(llm, SAMPLE_PROMPTS[3], n=12, repetition_penalty=1.5).token_ids
    with torch.inference_mode():
        ref = hf.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=12,
            min_new_tokens=12,
            do_sample=False,
            repetition_penalty=1.5,
            pad_token_id=0,
        )[0, len(ids) :].tolist()
    assert ours == ref


def test_frequency_and_presence_penalties():
    from infernetes.runtime.model_executor.sampler import Sampler
    from infernetes.runtime.worker.request_state import CachedRequestState

    params = SamplingParams(
        temperature=0.0, frequency_penalty=1.0, presence_penalty=0.5, max_tokens=5
    )
    request = CachedRequestState("r", [0, 1, 3, 3, 4], 2, params, None, -1, 0)  # 3, 3, 4 sampled
    logits = torch.zeros(1, 6)
    logits[0, 3] = 2.4  # 2.4 - 2*1.0 - 0.5 = -0.1 < 0
    logits[0, 4] = 1.4  # 1.4 - 1.0 - 0.5 = -0.1
    logits[0, 5] = -0.05
    assert Sampler(0)(logits, [request])[0].token_id in (0, 1, 2)  # untouched zeros win
    logits[0, :3] = -1.0
    assert Sampler(0)(logits, [request])[0].token_id == 5


def test_incremental_detokenization_keeps_multibyte_characters(llm):
    from infernetes.runtime.sampling_params import RequestOutputKind

    tokenizer = llm.get_tokenizer()
    engine = llm.llm_engine
    # Force a sequence of byte tokens that spells "café 🙂" one token at a time.
    target = tokenizer("café 🙂 日本語", add_special_tokens=False).input_ids
    position = {"i": 0}

    def spell(output_ids, logits):
        logits = torch.full_like(logits, -1e9)
        logits[target[len(output_ids)]] = 0.0
        return logits

    params = SamplingParams(
        temperature=0.0,
        max_tokens=len(target),
        logits_processors=[spell],
        output_kind=RequestOutputKind.DELTA,
    )
    engine.add_request("mb", "Hello", params)
    pieces = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            pieces.append(output.outputs[0].text)
    del position
    assert "".join(pieces) == "café 🙂 日本語"
    assert all("\ufffd" not in piece for piece in pieces)


def test_stop_string_is_never_streamed(llm):
    from infernetes.runtime.sampling_params import RequestOutputKind

    full = _greedy(llm, SAMPLE_PROMPTS[2], n=20).text
    stop = full[6:10]
    params = SamplingParams(
        temperature=0.0,
        max_tokens=20,
        ignore_eos=True,
        stop=[stop],
        output_kind=RequestOutputKind.DELTA,
    )
    engine = llm.llm_engine
    engine.add_request("s", SAMPLE_PROMPTS[2], params)
    streamed = ""
    while engine.has_unfinished_requests():
        for output in engine.step():
            streamed += output.outputs[0].text
            assert stop not in streamed
    assert streamed == full[: full.index(stop)]


def test_failing_logits_processor_ends_only_its_request(llm):
    def broken(output_ids, logits):
        raise RuntimeError("grammar exploded")

    params = [
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logits_processors=[broken]),
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
    ]
    bad, good = llm.generate(SAMPLE_PROMPTS[:2], params)
    assert (
        bad.outputs[0].finish_reason == "abort" and "grammar exploded" in bad.outputs[0].stop_reason
    )
    assert good.outputs[0].token_ids == _greedy(llm, SAMPLE_PROMPTS[1], n=6).token_ids
    assert (
        llm.llm_engine.engine_core.block_manager.num_free_blocks
        == llm.llm_engine.engine_core.num_blocks
    )


def _allowed_by_definition(row: torch.Tensor, params: SamplingParams) -> set[int]:
    """The tokens a request may draw, straight from the definitions, one token at a time."""
    scaled = row / params.temperature
    probs = torch.softmax(scaled, dim=-1)
    allowed = set(range(row.shape[-1]))
    if params.min_p > 0:
        allowed = {i for i in allowed if probs[i] >= params.min_p * probs.max()}
    order = sorted(allowed, key=lambda i: -float(scaled[i]))
    if params.top_k > 0:
        order = order[: params.top_k]
    if params.top_p < 1.0:
        weights = torch.softmax(scaled[order], dim=-1).tolist()
        kept, before = [], 0.0
        for token, weight in zip(order, weights, strict=True):
            if before > params.top_p:  # the tokens before this one already reach top_p
                break
            kept.append(token)
            before += weight
        order = kept
    return set(order)


def test_batched_filters_keep_each_rows_own_tokens():
    from infernetes.runtime.model_executor.sampler import filter_logits

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 60, generator=gen) * 3
    params = [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.6),
        SamplingParams(temperature=0.9, min_p=0.2),
        SamplingParams(temperature=1.0, top_k=12, top_p=0.8),
        SamplingParams(temperature=0.5, top_k=1),
        SamplingParams(temperature=2.0, min_p=0.05, top_k=30, top_p=0.9),
    ]
    for only_some in (params, params[1:2] + params[4:6]):  # with and without a row of no top_k
        rows = [params.index(p) for p in only_some]
        filtered, nucleus = filter_logits(logits[rows], only_some)
        for out, i, top_p in zip(filtered, rows, nucleus, strict=True):
            kept = set(torch.isfinite(out).nonzero()[:, 0].tolist())
            # top_p without top_k is left to the draw: the filter passes its top_p on
            has_top_k = params[i].top_k > 0
            assert top_p == (1.0 if has_top_k else params[i].top_p)
            definition = (
                params[i]
                if has_top_k
                else SamplingParams(temperature=params[i].temperature, min_p=params[i].min_p)
            )
            assert kept == _allowed_by_definition(logits[i], definition), params[i]
            assert torch.equal(out[sorted(kept)], logits[i][sorted(kept)] / params[i].temperature)


def test_sampling_draws_by_the_filtered_probabilities():
    from infernetes.runtime.model_executor.sampler import Sampler
    from infernetes.runtime.worker.request_state import CachedRequestState

    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = probs.log().repeat(4000, 1)
    # top_p keeps a token while the probability ranked above it is at most top_p
    for params, expected in (
        (SamplingParams(temperature=1.0), probs),
        (SamplingParams(temperature=1.0, top_k=2), torch.tensor([0, 0, 3 / 7, 4 / 7])),
        (SamplingParams(temperature=1.0, top_p=0.5), torch.tensor([0, 0, 3 / 7, 4 / 7])),
        (SamplingParams(temperature=1.0, top_p=0.75), torch.tensor([0, 2 / 9, 3 / 9, 4 / 9])),
        (SamplingParams(temperature=1.0, top_k=3, top_p=0.5), torch.tensor([0, 0, 3 / 7, 4 / 7])),
    ):
        requests = [
            CachedRequestState(f"r{i}", [1], 1, params, None, -1, 0) for i in range(len(logits))
        ]
        tokens = torch.tensor([s.token_id for s in Sampler(0)(logits, requests)])
        frequencies = torch.bincount(tokens, minlength=4) / len(tokens)
        torch.testing.assert_close(frequencies, expected, atol=0.03, rtol=0)
        assert frequencies[expected == 0].sum() == 0  # a filtered-out token is never drawn


def test_cpu_row_groups_draw_what_one_batch_draws(monkeypatch):
    from infernetes.runtime.model_executor import sampler
    from infernetes.runtime.worker.request_state import CachedRequestState

    logits = torch.randn(20, 50, generator=torch.Generator().manual_seed(3))
    params = [
        SamplingParams(temperature=0.9, top_p=0.8, seed=i)
        if i % 2
        else SamplingParams(temperature=1.1, top_k=7, seed=i)
        for i in range(20)
    ]

    def draw() -> list[int]:
        requests = [
            CachedRequestState(
                f"r{i}", [1], 1, p, None, -1, 0, torch.Generator().manual_seed(p.seed)
            )
            for i, p in enumerate(params)
        ]
        return [s.token_id for s in sampler.Sampler(0)(logits, requests)]

    whole = draw()
    monkeypatch.setattr(sampler, "_CPU_GROUP_BYTES", 3 * 50 * 4)  # groups of 3 rows
    assert sampler._row_groups(list(range(7)), logits) == [[0, 1, 2], [3, 4, 5], [6]]
    assert draw() == whole


def _penalised_by_definition(row, params, prompt, output):
    """One row penalised token by token, as Hugging Face's repetition processor and OpenAI's
    frequency and presence penalties define it."""
    row = row.clone()
    vocab = row.shape[0]
    counts = [0] * vocab
    for token in output:
        if token < vocab:
            counts[token] += 1
    seen = {min(t, vocab - 1) for t in prompt} | {t for t in range(vocab) if counts[t]}
    for token in range(vocab):
        value = float(row[token])
        if token in seen and params.repetition_penalty != 1.0:
            penalty = params.repetition_penalty
            value = value / penalty if value > 0 else value * penalty
        value -= params.frequency_penalty * counts[token]
        value -= params.presence_penalty * (counts[token] > 0)
        row[token] = value
    return row


@pytest.mark.parametrize(
    "params",
    [
        [SamplingParams(repetition_penalty=1.3), SamplingParams(repetition_penalty=0.8)],
        [SamplingParams(frequency_penalty=0.7), SamplingParams()],
        [SamplingParams(presence_penalty=-0.4), SamplingParams(presence_penalty=1.5)],
        [
            SamplingParams(repetition_penalty=1.2, frequency_penalty=-1.2, presence_penalty=0.3),
            SamplingParams(frequency_penalty=0.5),
        ],
    ],
)
def test_batched_penalties_are_each_rows_own(params):
    """Rows with different penalties (each alone, and mixed), prompts and outputs (ids past the
    vocabulary included) penalised together equal each row penalised by the definition."""
    from infernetes.runtime.model_executor.penalties import apply_penalties

    logits = torch.randn(2, 40, generator=torch.Generator().manual_seed(0)) * 3
    prompts, outputs = [[1, 2, 3, 41], [5] * 9], [[7, 7, 2, 45], []]
    batched = apply_penalties(logits, params, prompts, outputs)
    for r in range(2):
        expected = _penalised_by_definition(logits[r], params[r], prompts[r], outputs[r])
        assert torch.allclose(batched[r], expected, atol=1e-6), r


def test_batched_logprobs_are_each_rows_own():
    from infernetes.runtime.model_executor.sampler import _top_logprobs, top_logprobs

    gen = torch.Generator().manual_seed(1)
    logprobs = torch.log_softmax(torch.randn(3, 50, generator=gen), dim=-1)
    tokens, ks = [4, 17, 49], [2, 0, 5]
    batched = top_logprobs(logprobs, tokens, ks)
    assert batched == [_top_logprobs(logprobs[r], tokens[r], ks[r]) for r in range(3)]


def test_the_batched_sampler_draws_what_the_row_by_row_one_draws(monkeypatch):
    """A batch of every kind of row (greedy and seeded, penalties alone or after a bias or
    min_tokens, a logits processor, logprobs of several k): the same tokens and logprobs whether
    penalties and logprobs go row by row or all at once."""
    from infernetes.runtime.model_executor import sampler
    from infernetes.runtime.model_executor.sampler import Sampler
    from infernetes.runtime.worker.request_state import CachedRequestState

    batches: list[int] = []  # rows penalised together, per call
    apply = sampler.apply_penalties
    monkeypatch.setattr(
        sampler,
        "apply_penalties",
        lambda logits, *rest: batches.append(len(logits)) or apply(logits, *rest),
    )

    def boost_last(output_ids, row):
        return row + torch.nn.functional.one_hot(torch.tensor(59), 60) * 0.5

    kinds = [
        dict(temperature=0.0, logprobs=2),
        dict(temperature=0.9, seed=1, frequency_penalty=0.6, logprobs=0),
        dict(temperature=0.0, repetition_penalty=1.4, presence_penalty=0.2),
        dict(temperature=0.7, seed=2, repetition_penalty=1.1, logit_bias={3: 2.0}, logprobs=5),
        dict(temperature=0.0, min_tokens=9, frequency_penalty=0.3, stop_token_ids=[5]),
        dict(temperature=1.1, seed=3, presence_penalty=0.4, logits_processors=[boost_last]),
        dict(temperature=0.5, seed=4, top_k=7, top_p=0.8),
    ]

    def requests():
        made = []
        for i, kind in enumerate(kinds):
            params = SamplingParams(max_tokens=20, **kind)
            generator = None if params.seed is None else torch.Generator().manual_seed(params.seed)
            tokens = [1 + i, 2, 3, 5, 5, 7 + i, 3]
            made.append(CachedRequestState(f"r{i}", tokens, 3, params, 0, -1, 0, generator))
        return made

    logits = torch.randn(len(kinds), 60, generator=torch.Generator().manual_seed(3)) * 2
    for _ in range(3):
        row_by_row = Sampler(0, batched=False)(logits, requests())
        assert not batches
        batched = Sampler(0, batched=True)(logits, requests())
        assert batches.pop() == 3  # the rows with penalties and no bias or min_tokens
        assert [s.token_id for s in batched] == [s.token_id for s in row_by_row]
        for a, b in zip(batched, row_by_row, strict=True):
            assert (a.logprobs is None) == (b.logprobs is None)
            if a.logprobs is not None:
                assert (a.logprobs.rank, a.logprobs.top_ids) == (
                    b.logprobs.rank,
                    b.logprobs.top_ids,
                )
                assert a.logprobs.logprob == pytest.approx(b.logprobs.logprob, abs=1e-6)
        logits = logits.roll(1, dims=1)


def test_min_tokens_masks_eos_even_with_ignore_eos(llm):
    eos = llm.get_tokenizer().eos_token_id
    params = SamplingParams(
        temperature=0.0, max_tokens=6, min_tokens=4, logit_bias={eos: 100.0}, ignore_eos=True
    )
    tokens = llm.generate(SAMPLE_PROMPTS[0], params)[0].outputs[0].token_ids
    assert eos not in tokens[:4] and tokens[4:] == [eos, eos]


def test_runs_without_a_seed_sample_alike(tiny_llama):
    # --seed is 0 unless set (vLLM V1): two servers started alike sample alike
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    runs = [
        LLM(tiny_llama, dtype="float32", max_model_len=64, num_gpu_blocks_override=32)
        .generate(SAMPLE_PROMPTS[0], params)[0]
        .outputs[0]
        .token_ids
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
