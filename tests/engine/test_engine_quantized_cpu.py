"""On the CPU, weight-only integer checkpoints (GPTQ, AWQ, compressed-tensors) stay packed: their
linear layers hold a `GroupQuantWeight` that the C kernel reads, no dense copy. Where GPTQ's
act-order reorders the inputs the layer loads dense. (That the tokens equal transformers' on the
dequantized model is test_engine_quantized.py's.)"""

from __future__ import annotations

import pytest
import torch
from infernetes.runtime.model_executor.layers.linear import LinearBase
from infernetes.runtime.model_executor.layers.quantization.group_quant import GroupQuantWeight
from infernetes.runtime.testing_quantized import write_awq, write_compressed_tensors, write_gptq

from infernetes import LLM, SamplingParams

SMALL = dict(dtype="float32", max_model_len=64, num_gpu_blocks_override=16, block_size=8)


def linear_layers(llm: LLM) -> dict[str, LinearBase]:
    model = llm.llm_engine.engine_core.executor.driver_worker.model_runner.model
    return {name: m for name, m in model.named_modules() if isinstance(m, LinearBase)}


def packed_bytes(layer: LinearBase) -> int:
    form = layer.quant_method
    assert isinstance(form, GroupQuantWeight)
    tensors = [form.qweight, form.scale] + ([form.offset] if form.offset is not None else [])
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.fixture(scope="module")
def base(model_factory):
    return model_factory("LlamaForCausalLM")


@pytest.mark.parametrize(
    "writer, bits",
    [
        (lambda b, o: write_gptq(b, o, bits=4, group=32, sym=False), 4),
        (lambda b, o: write_gptq(b, o, bits=8, group=64, sym=True), 8),
        (lambda b, o: write_awq(b, o, group=32), 4),
        (
            lambda b, o: write_compressed_tensors(
                b,
                o,
                fmt="pack-quantized",
                weights=dict(
                    num_bits=4, type="int", symmetric=True, strategy="group", group_size=32
                ),
            ),
            4,
        ),
    ],
    ids=["gptq4", "gptq8", "awq", "compressed-tensors"],
)
def test_layers_stay_packed_on_the_cpu(tmp_path, base, writer, bits):
    quantized, _ = writer(base, tmp_path / "q")
    llm = LLM(str(quantized), **SMALL)
    layers = {n: m for n, m in linear_layers(llm).items() if not n.endswith("lm_head")}
    assert layers
    for name, layer in layers.items():
        assert isinstance(layer.quant_method, GroupQuantWeight), name
        assert layer.quant_method.bits == bits
        assert layer.weight.numel() == 0  # no dense copy
        dense = layer.quant_method.outputs * layer.quant_method.inputs * 4
        assert packed_bytes(layer) < dense / (3 if bits == 4 else 2)
        assert layer.quant_method.qweight.device.type == "cpu"


def test_act_order_that_reorders_inputs_loads_dense(tmp_path, base):
    quantized, _ = write_gptq(base, tmp_path / "q", bits=4, group=32, desc_act=True)
    llm = LLM(str(quantized), **SMALL)
    for name, layer in linear_layers(llm).items():
        assert layer.quant_method is None, name
        assert layer.weight.dtype == torch.float32 and layer.weight.dim() == 2


def test_dummy_weights_of_a_quantized_model_are_packed(tmp_path, base):
    """``--load-format dummy`` of a model whose config declares GPTQ: random packed layers, in
    the CPU's form (what a benchmark of the shape alone measures)."""
    import json
    import shutil

    path = shutil.copytree(base, tmp_path / "dummy")
    config = json.loads((path / "config.json").read_text())
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True}
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": gptq}))
    llm = LLM(str(path), load_format="dummy", **SMALL)
    layers = [m for n, m in linear_layers(llm).items() if not n.endswith("lm_head")]
    assert all(isinstance(m.quant_method, GroupQuantWeight) for m in layers)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    [output] = llm.generate({"prompt_token_ids": [1, 2, 3]}, params)
    assert len(output.outputs[0].token_ids) == 3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_packed_qwen2_with_biases_answers_as_transformers_does(
    tmp_path, model_factory, hf_greedy, dtype
):
    """Qwen2's QKV projection has a bias: the kernel adds it. In float32 the greedy tokens equal
    transformers' on the dequantized weights; in bfloat16 (the dot product over bf16 weights)
    the model runs and its first token agrees."""
    from infernetes.runtime.testing_quantized import write_dense

    base = model_factory("Qwen2ForCausalLM")
    quantized, dense = write_gptq(base, tmp_path / "q", bits=4, group=32, sym=False)
    llm = LLM(str(quantized), **{**SMALL, "dtype": dtype})
    qkv = [m for n, m in linear_layers(llm).items() if n.endswith("qkv_proj")]
    assert qkv and all(isinstance(m.quant_method, GroupQuantWeight) for m in qkv)
    assert all(m.bias is not None for m in qkv)
    prompt = [1, 5, 9, 200, 17, 3, 44, 8]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    [output] = llm.generate({"prompt_token_ids": prompt}, params)
    expected = hf_greedy(write_dense(base, tmp_path / "dense", dense), prompt, 6)
    tokens = list(output.outputs[0].token_ids)
    assert tokens == expected if dtype == "float32" else tokens[0] == expected[0]
