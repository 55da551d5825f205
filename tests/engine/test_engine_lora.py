"""LoRA adapters in the engine: one batch mixing several PEFT adapters and the base model gives,
for each request, transformers + peft's greedy tokens with that request's adapter. Adapters are
made by peft in the test (random A and B), on the tiny models; they differ in rank, alpha,
rslora and target modules (attention only, MLP only, both: the fused QKV and gate/up layers
each take one slice per projection)."""

from __future__ import annotations

import pytest
from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.sampling_params import SamplingParams

from infernetes.schema.config import build_config

MAX_TOKENS = 8
PROMPTS = [[1, 5, 9, 200, 17, 3, 44], [1, 77, 4, 150, 6], [1, 8, 8, 31, 2, 90], [1, 12, 13]]
ADAPTERS = {
    "attn": dict(rank=8, alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    "mlp": dict(rank=4, alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"]),
    "all": dict(
        rank=16,
        alpha=32,
        use_rslora=True,
        target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    ),
}
ENGINE = {
    "dtype": "float32",
    "max_model_len": 64,
    "block_size": 8,
    "num_gpu_blocks_override": 32,
    "enable_lora": True,
    "max_loras": 3,
    "max_lora_rank": 16,
}


@pytest.fixture(scope="module")
def adapters(model_factory, tmp_path_factory):
    """{architecture: (base path, {name: adapter path})}, made on first use."""
    from infernetes.runtime.testing import make_tiny_lora

    made: dict[str, tuple[str, dict[str, str]]] = {}

    def make(architecture: str) -> tuple[str, dict[str, str]]:
        if architecture not in made:
            base = model_factory(architecture)
            paths = {}
            for seed, (name, spec) in enumerate(ADAPTERS.items()):
                folder = tmp_path_factory.mktemp(f"{architecture}-{name}")
                paths[name] = str(make_tiny_lora(base, folder, seed=seed, **spec))
            made[architecture] = (base, paths)
        return made[architecture]

    return make


def _llm(base: str, **overrides):
    from infernetes.runtime.llm import LLM

    return LLM(**build_config(base, device="cpu", **{**ENGINE, **overrides}).to_dict())


def _mixed_batch(paths: dict[str, str]) -> list[LoRARequest | None]:
    """One request per adapter and one for the base model."""
    loras = [LoRARequest(name, i + 1, path) for i, (name, path) in enumerate(paths.items())]
    return [*loras, None]


@pytest.mark.parametrize(
    "architecture", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]
)
def test_mixed_adapters_match_peft(adapters, architecture, hf_greedy):
    from infernetes.runtime.testing import hf_peft_greedy_tokens

    base, paths = adapters(architecture)
    loras = _mixed_batch(paths)
    llm = _llm(base)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, lora_request=loras)
    for prompt, lora, output in zip(PROMPTS, loras, outputs, strict=True):
        if lora is None:
            expected = hf_greedy(base, prompt, MAX_TOKENS)
        else:
            expected = hf_peft_greedy_tokens(base, lora.lora_path, prompt, MAX_TOKENS)
        assert output.outputs[0].token_ids == expected, lora
    # the adapters do change the output (else the comparison above proves nothing)
    base_only = llm.generate(PROMPTS[:3], params)
    assert all(
        a.outputs[0].token_ids != b.outputs[0].token_ids
        for a, b in zip(base_only, outputs[:3], strict=True)
    )


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async-scheduling"])
def test_one_slot_queues_adapters_and_reloads_from_disk(adapters, async_scheduling):
    """--max-loras 1 --max-cpu-loras 1: requests of different adapters never share a step (the
    scheduler holds the others back), the slot and the CPU cache are evicted and read again,
    and every request still gets its own adapter's tokens (with --async-scheduling too: the
    adapters are read on the worker thread, between its steps)."""
    from infernetes.runtime.testing import hf_peft_greedy_tokens

    base, paths = adapters("LlamaForCausalLM")
    loras = _mixed_batch(paths) * 2  # each adapter comes back after the others
    prompts = PROMPTS * 2
    llm = _llm(base, max_loras=1, max_cpu_loras=1, async_scheduling=async_scheduling)
    seen_together: list[int] = []
    runner = llm.llm_engine.engine_core.executor.driver_worker.model_runner  # this process's
    original = runner.lora.prepare

    def spy(requests, num_scheduled):
        seen_together.append(len({r.lora_int_id for r in requests if r is not None}))
        return original(requests, num_scheduled)

    runner.lora.prepare = spy
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate(prompts, params, lora_request=loras)
    assert max(seen_together) == 1
    assert len(runner.lora.cpu_cache) == 1
    for prompt, lora, output in zip(prompts, loras, outputs, strict=True):
        if lora is not None:
            expected = hf_peft_greedy_tokens(base, lora.lora_path, prompt, MAX_TOKENS)
            assert output.outputs[0].token_ids == expected, lora


def test_prefix_cache_keeps_adapters_apart(adapters, hf_greedy):
    """The same prompt under an adapter and under the base model: the prefix-cache hashes
    include the adapter, so neither reuses the other's KV blocks."""
    from infernetes.runtime.testing import hf_peft_greedy_tokens

    base, paths = adapters("LlamaForCausalLM")
    prompt = [1, *range(20, 40)]  # two full blocks and more
    lora = LoRARequest("attn", 1, paths["attn"])
    llm = _llm(base, enable_prefix_caching=True)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    first = llm.generate([prompt], params, lora_request=lora)[0]
    plain = llm.generate([prompt], params)[0]
    again = llm.generate([prompt], params, lora_request=lora)[0]
    assert plain.outputs[0].token_ids == hf_greedy(base, prompt, MAX_TOKENS)
    expected = hf_peft_greedy_tokens(base, paths["attn"], prompt, MAX_TOKENS)
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == expected
    assert plain.num_cached_tokens == 0  # nothing shared with the adapter's blocks
    assert again.num_cached_tokens > 0  # but the adapter's own are reused


def test_bad_adapters_are_refused_by_name(adapters, tmp_path):
    from infernetes.runtime.testing import make_tiny_lora

    base, paths = adapters("LlamaForCausalLM")
    llm = _llm(base, max_lora_rank=8)
    params = SamplingParams(max_tokens=2)
    with pytest.raises(ValueError, match=r"LoRA rank 16 .* greater than --max-lora-rank 8"):
        llm.generate([PROMPTS[0]], params, lora_request=LoRARequest("all", 3, paths["all"]))
    with pytest.raises(ValueError, match=r"no adapter_config\.json|cannot be read"):
        llm.generate([PROMPTS[0]], params, lora_request=LoRARequest("x", 4, str(tmp_path)))
    head = make_tiny_lora(base, tmp_path / "head", target_modules=["lm_head"])
    with pytest.raises(ValueError, match="lm_head"):
        llm.generate([PROMPTS[0]], params, lora_request=LoRARequest("head", 5, str(head)))
    # the engine goes on serving
    assert llm.generate([PROMPTS[0]], params)[0].outputs[0].token_ids
    without = _llm(base, enable_lora=False, max_loras=1, max_lora_rank=16)
    with pytest.raises(ValueError, match="without --enable-lora"):
        without.generate([PROMPTS[0]], params, lora_request=LoRARequest("attn", 1, paths["attn"]))


@pytest.mark.slow  # a worker process per rank
@pytest.mark.parametrize(
    ("overrides", "tp", "pp"),
    [({}, 2, 1), ({"num_key_value_heads": 1}, 2, 1), ({}, 1, 2)],
)
def test_parallel_adapters_match_peft(model_factory, tmp_path, overrides, tp, pp):
    """TP 2: column-parallel layers hold their rows of B, row-parallel ones their columns of A
    (the shrink summed over the ranks); with one KV head it is replicated, and so is its B.
    PP 2: each stage reads the adapter's tensors of its own layers."""
    from infernetes.runtime.engine.llm_engine import LLMEngine
    from infernetes.runtime.testing import hf_peft_greedy_tokens, make_tiny_lora

    base = model_factory("LlamaForCausalLM", **overrides)
    paths = {
        name: str(make_tiny_lora(base, tmp_path / name, seed=seed, **spec))
        for seed, (name, spec) in enumerate(ADAPTERS.items())
    }
    loras = _mixed_batch(paths)
    engine = LLMEngine(
        build_config(
            base, device="cpu", tensor_parallel_size=tp, pipeline_parallel_size=pp, **ENGINE
        )
    )
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    try:
        for i, (prompt, lora) in enumerate(zip(PROMPTS, loras, strict=True)):
            engine.add_request(str(i), prompt, params, lora_request=lora)
        results = {}
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    results[output.request_id] = output.outputs[0].token_ids
    finally:
        engine.shutdown()
    for i, (prompt, lora) in enumerate(zip(PROMPTS, loras, strict=True)):
        if lora is not None:
            assert results[str(i)] == hf_peft_greedy_tokens(
                base, lora.lora_path, prompt, MAX_TOKENS
            ), lora


def test_decode_graphs_replay_a_step_mixing_adapters(adapters, hf_greedy, monkeypatch):
    """With decode graphs on (the RerunBackend replays them on the CPU), decode steps mixing
    adapters and the base model replay from the static slot buffer and give peft's tokens."""
    from infernetes.runtime.model_executor import cuda_graph
    from infernetes.runtime.testing import hf_peft_greedy_tokens

    monkeypatch.setattr(
        cuda_graph, "select_graph_backend", lambda device: cuda_graph.RerunBackend()
    )
    base, paths = adapters("LlamaForCausalLM")
    loras = _mixed_batch(paths)
    llm = _llm(base, cuda_graph_sizes=[1, 2, 4], max_num_seqs=4)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, lora_request=loras)
    graphs = llm.llm_engine.engine_core.executor.driver_worker.model_runner.decode_graphs
    assert graphs.replays[4] >= MAX_TOKENS - 1  # every decode step of the four replayed
    for prompt, lora, output in zip(PROMPTS, loras, outputs, strict=True):
        expected = (
            hf_greedy(base, prompt, MAX_TOKENS)
            if lora is None
            else hf_peft_greedy_tokens(base, lora.lora_path, prompt, MAX_TOKENS)
        )
        assert output.outputs[0].token_ids == expected, lora


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("use_dora", True, "DoRA adapters are not supported"),
        ("bias", "lora_only", "trained biases"),
        ("modules_to_save", ["lm_head"], "modules_to_save"),
        ("rank_pattern", {"q_proj": 4}, "rank_pattern"),
        ("peft_type", "IA3", "peft_type 'IA3' is not served"),
        ("r", 0, "positive integer 'r'"),
    ],
)
def test_unsupported_peft_features_are_refused_naming_the_field(
    adapters, tmp_path, field, value, message
):
    import json
    import shutil

    from infernetes.runtime.lora.adapter import LoRAAdapterError, read_adapter_config

    _, paths = adapters("LlamaForCausalLM")
    folder = tmp_path / "adapter"
    shutil.copytree(paths["attn"], folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    assert read_adapter_config(folder, 16).scaling == config["lora_alpha"] / config["r"]
    config[field] = value
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(LoRAAdapterError, match=message):
        read_adapter_config(folder, 16)
