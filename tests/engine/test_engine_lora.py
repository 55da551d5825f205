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
