"""On an NVIDIA GPU, every model family and quantized format the docs list generates the CPU's
greedy tokens for the same tiny random model, and each family serves with dummy bf16 weights
(``bench/gpu/run.sh smoke`` runs this file); GGUF files give transformers' tokens.

The CPU's tokens are the reference here: the CPU tests already hold them equal to transformers'.
Skipped without a GPU (CI).
"""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from infernetes.runtime.testing import SAMPLE_PROMPTS
from infernetes.runtime.testing_gguf import hf_gguf_greedy, write_gguf
from infernetes.runtime.testing_quantized import (
    write_awq,
    write_fp8_blockwise,
    write_fp8_static,
    write_gptq,
)

from infernetes import LLM, SamplingParams

from .gpu_smoke import assert_same_greedy_tokens

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

ENGINE = dict(dtype="float32", max_model_len=128, num_gpu_blocks_override=64, block_size=16)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
FAMILIES = [
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "MixtralForCausalLM",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "GemmaForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Phi3ForCausalLM",
    "GraniteForCausalLM",
    "Olmo2ForCausalLM",
    "Starcoder2ForCausalLM",
    "OPTForCausalLM",
    "GPT2LMHeadModel",
]
# Each quantized format as runtime.testing_quantized writes it, with the options it is read with.
FORMATS = {
    "gptq-4bit": (write_gptq, {}),
    "gptq-8bit": (write_gptq, {"bits": 8}),
    "gptq-desc-act": (write_gptq, {"desc_act": True}),
    "awq": (write_awq, {}),
    "fp8-block": (write_fp8_blockwise, {}),
    "fp8-per-tensor": (write_fp8_static, {}),
    "fp8-per-channel": (write_fp8_static, {"per_channel": True}),
}


def _assert_same_tokens(path: str, **engine) -> None:
    assert_same_greedy_tokens(path, SAMPLE_PROMPTS, GREEDY, {**ENGINE, **engine})


@pytest.mark.parametrize("architecture", FAMILIES)
def test_gpu_family_generates_the_cpus_tokens(model_factory, architecture):
    _assert_same_tokens(model_factory(architecture))


@pytest.mark.parametrize("architecture", FAMILIES)
def test_gpu_family_serves_dummy_weights_in_bf16(model_factory, architecture):
    engine = {**ENGINE, "dtype": "bfloat16", "load_format": "dummy"}
    llm = LLM(model_factory(architecture), device="cuda", **engine)
    for output in llm.generate(SAMPLE_PROMPTS, GREEDY):
        assert len(output.outputs[0].token_ids) == GREEDY.max_tokens


@pytest.mark.parametrize("architecture", FAMILIES[:1])
def test_gpu_graphs_off_generates_the_cpus_tokens(model_factory, architecture):
    _assert_same_tokens(model_factory(architecture), enforce_eager=True)


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Qwen3MoeForCausalLM"])
def test_gpu_quantized_format_generates_the_cpus_tokens(
    model_factory, tmp_path, architecture, name
):
    write, options = FORMATS[name]
    quantized, _ = write(model_factory(architecture), tmp_path / name, **options)
    _assert_same_tokens(str(quantized))


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_gpu_gguf_generates_transformers_tokens(model_factory, tmp_path, qtype):
    """A GGUF file on the GPU (its blocks dequantised at load) against transformers' reader: the
    CPU keeps the blocks and may round its activations as llama.cpp does, so transformers'
    float32 dequantisation is the reference here, as in tests/engine/test_engine_gguf.py."""
    # rows of whole K-quant super-blocks (256 values)
    model_dir = model_factory("LlamaForCausalLM", hidden_size=256, intermediate_size=512)
    file = write_gguf(model_dir, tmp_path / f"model-{qtype.name}.gguf", qtype)
    llm = LLM(str(file), tokenizer=str(model_dir), device="cuda", **ENGINE)
    prompts = [[1, 17, 29, 41, 5, 9], [1, 300, 12, 7]]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY)
    for prompt, output in zip(prompts, outputs, strict=True):
        assert list(output.outputs[0].token_ids) == hf_gguf_greedy(file, prompt, 12)
