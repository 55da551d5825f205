"""Quantized checkpoints on the Triton path (interpreted on a CPU): weight-only int4/int8 linear
layers keep the packed weights and run the dequantising GEMM, per-tensor and per-channel fp8 ones
keep their fp8 weights (a scale per output), fused layers (QKV, gate/up) included, and greedy
tokens equal transformers' on the model with the dequantised weights. Mixture-of-experts layers
keep their packed experts (GPTQ, AWQ; tensor and expert parallel) and run the packed MoE GEMMs.
The dense weights of what is kept stored are never allocated, so a model that fits only
quantized loads."""

import pytest
import torch
from infernetes.kernels import backend
from infernetes.runtime.model_executor.layers.linear import LinearBase
from infernetes.runtime.model_executor.layers.quantization.kept import Fp8BlockWeight
from infernetes.runtime.model_executor.loader import build_model, inspect_model, load_hf_config
from infernetes.runtime.testing import hf_greedy_tokens, make_tiny_llama, make_tiny_model
from infernetes.runtime.testing_quantized import (
    PROJECTIONS,
    read_state,
    write_awq,
    write_compressed_tensors,
    write_dense,
    write_fp8_blockwise,
    write_fp8_static,
    write_gptq,
)
from safetensors.torch import save_file
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from infernetes import LLM, SamplingParams

pytest.importorskip("triton")  # no Triton wheels outside Linux

PROMPT = [1, 5, 9, 200, 17, 3, 44, 8]
GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return str(make_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture
def triton_attn(monkeypatch):
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")
    assert backend.attention_backend(DEVICE) == backend.TRITON_ATTN


CASES = {
    "gptq-4bit-desc-act": (write_gptq, dict(bits=4, group=32, desc_act=True, sym=False)),
    "gptq-8bit": (write_gptq, dict(bits=8, group=64, desc_act=False, sym=True)),
    "awq": (write_awq, dict(group=32)),
    "compressed-tensors-w4a16-asym": (
        write_compressed_tensors,
        dict(
            fmt="pack-quantized",
            weights=dict(num_bits=4, type="int", symmetric=False, strategy="group", group_size=32),
        ),
    ),
    "compressed-tensors-w8a16-channel": (
        write_compressed_tensors,
        dict(
            fmt="pack-quantized",
            weights=dict(num_bits=8, type="int", symmetric=True, strategy="channel"),
        ),
    ),
    "fp8-per-tensor": (write_fp8_static, {}),
    "compressed-tensors-fp8-channel": (
        write_compressed_tensors,
        dict(
            fmt="float-quantized",
            weights=dict(num_bits=8, type="float", symmetric=True, strategy="channel"),
        ),
    ),
    "fp8-block-wise": (write_fp8_blockwise, {}),
    "compressed-tensors-fp8-block-wise": (
        write_compressed_tensors,
        dict(
            fmt="float-quantized",
            weights=dict(
                num_bits=8, type="float", symmetric=True, strategy="block", block_structure=[16, 16]
            ),
        ),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_packed_weights_run_the_wna16_gemm(tmp_path, base, triton_attn, case):
    writer, options = CASES[case]
    quantized, dense = writer(base, tmp_path / "q", **options)
    dense_dir = write_dense(base, tmp_path / "dense", dense)
    llm = LLM(
        str(quantized), dtype="float32", max_model_len=64, num_gpu_blocks_override=16, block_size=8
    )
    model = llm.llm_engine.engine_core.executor.driver_worker.model_runner.model
    layer = model.model.layers[0]
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj):
        if "fp8" not in case:
            assert linear.quant_method is not None and linear.weight.numel() == 0
        elif "block" in case:  # fp8 with its block scales, the block fp8 GEMM
            assert isinstance(linear.quant_method, Fp8BlockWeight)
            assert linear.quant_method.qweight.dtype == torch.float8_e4m3fn
        else:  # fused parts' per-tensor scales become one per output
            assert linear.weight.dtype == torch.float8_e4m3fn
            assert linear.weight_scale.shape == (linear.weight.shape[0],)
    [output] = llm.generate({"prompt_token_ids": PROMPT}, GREEDY)
    assert list(output.outputs[0].token_ids) == hf_greedy_tokens(dense_dir, PROMPT, 5)


def _dummy_llm(path, quant_config: dict) -> LLM:
    """``--load-format dummy`` of the model in ``path`` with ``quant_config`` in its config."""
    import json

    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": quant_config}))
    return LLM(
        str(path),
        load_format="dummy",
        dtype="float32",
        max_model_len=64,
        num_gpu_blocks_override=16,
        block_size=8,
    )


@pytest.mark.parametrize(
    "quant_config",
    [
        {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True},
        {"quant_method": "fp8", "activation_scheme": "dynamic"},
    ],
)
def test_dummy_weights_of_a_quantized_model_keep_the_stored_form(
    tmp_path, base, triton_attn, quant_config
):
    """What ``bench gpu_llama8b --parts w4a16,fp8`` measures: --load-format dummy of a model whose
    config declares the method fills the stored forms."""
    import shutil

    llm = _dummy_llm(shutil.copytree(base, tmp_path / "dummy"), quant_config)
    model = llm.llm_engine.engine_core.executor.driver_worker.model_runner.model
    qkv = model.model.layers[0].self_attn.qkv_proj
    if quant_config["quant_method"] == "gptq":
        assert qkv.quant_method is not None and qkv.quant_method.bits == 4
    else:
        assert qkv.weight.dtype == torch.float8_e4m3fn
    [output] = llm.generate({"prompt_token_ids": PROMPT}, GREEDY)
    assert len(output.outputs[0].token_ids) == 5


def _two_ranks_greedy(path, **settings) -> tuple[list[int], list[dict]]:
    """Greedy tokens of ``path`` with two tensor-parallel worker processes, and their reports."""
    from infernetes.runtime.engine.llm_engine import LLMEngine

    from infernetes.schema.config import build_config

    config = build_config(
        str(path),
        device="cpu",
        tensor_parallel_size=2,
        dtype="float32",
        max_model_len=64,
        num_gpu_blocks_override=16,
        block_size=8,
        **settings,
    )
    engine = LLMEngine(config, stat_loggers=[])
    try:
        reports = engine.engine_core.executor.collective_rpc("report")
        engine.add_request("0", PROMPT, GREEDY)
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    tokens = list(output.outputs[0].token_ids)
    finally:
        engine.shutdown()
    return tokens, reports


@pytest.mark.slow  # a worker process per rank, interpreted
@pytest.mark.parametrize("case", ["gptq-4bit-desc-act", "fp8-per-tensor", "fp8-block-wise"])
def test_tensor_parallel_ranks_keep_their_share(tmp_path, base, triton_attn, case):
    """Each rank keeps its share of the stored weights (QKV's replicated KV head, the merged
    gate/up, the row-parallel inputs with every group's scales) and greedy tokens still equal
    transformers'."""
    writer, options = CASES[case]
    quantized, dense = writer(base, tmp_path / "q", **options)
    dense_dir = write_dense(base, tmp_path / "dense", dense)
    tokens, _ = _two_ranks_greedy(quantized)
    assert tokens == hf_greedy_tokens(dense_dir, PROMPT, 5)


@pytest.mark.slow  # a worker process per rank, interpreted
@pytest.mark.parametrize("expert_parallel", [False, True])
@pytest.mark.parametrize("form", ["gptq", "fp8", "fp8-block-wise"])
def test_tensor_and_expert_parallel_ranks_keep_their_stored_experts(
    tmp_path, triton_attn, expert_parallel, form
):
    """Two ranks of a GPTQ or fp8 Qwen3-MoE: each keeps its slice of every expert's intermediate
    size (tensor parallel: the gate/up outputs, the down projection's inputs, on whole fp8
    blocks) or its half of the experts whole (expert parallel), as stored; greedy tokens equal
    transformers'."""
    base = make_tiny_model(tmp_path / "base", "Qwen3MoeForCausalLM")
    if form == "gptq":
        quantized, dense = write_gptq(str(base), tmp_path / "q", bits=4, group=16, desc_act=True)
    elif form == "fp8":
        quantized, dense = write_fp8_static(str(base), tmp_path / "q", per_channel=True)
    else:  # each rank's 16 of the 32 intermediate features are one block
        quantized, dense = write_fp8_blockwise(str(base), tmp_path / "q", block=(16, 16))
    dense_dir = write_dense(str(base), tmp_path / "dense", dense)
    tokens, reports = _two_ranks_greedy(quantized, enable_expert_parallel=expert_parallel)
    assert [r["quantized_moe_layers"] for r in reports] == [2, 2]  # both layers, on both ranks
    assert tokens == hf_greedy_tokens(dense_dir, PROMPT, 5)


class AllocatedBytes(TorchDispatchMode):
    """Adds up the bytes of every tensor an op returns in fresh storage (not a view or an
    in-place result of one of its inputs): what building the model allocates."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and not t.is_meta
        }
        for t in tree_leaves(out):
            fresh = isinstance(t, torch.Tensor) and not t.is_meta
            if fresh and t.untyped_storage().data_ptr() not in inputs:
                self.bytes += t.untyped_storage().nbytes()
        return out


def _build(path) -> tuple[torch.nn.Module, int]:
    info = inspect_model(path, load_hf_config(path), "float32", 64, torch.device(DEVICE))
    with AllocatedBytes() as allocated:
        model = build_model(info, torch.device(DEVICE), use_tqdm=False)
    return model, allocated.bytes


def _dense_weight_bytes(model: torch.nn.Module) -> int:
    """What the linear layers' and the experts' float32 weights take."""
    from infernetes.runtime.model_executor.layers.fused_moe import FusedMoE

    total = 0
    for m in model.modules():
        if isinstance(m, LinearBase):
            total += m.weight.numel() * 4
        elif isinstance(m, FusedMoE):
            total += (m.w13_weight.numel() + m.w2_weight.numel()) * 4
    return total


@pytest.mark.parametrize(
    "architecture,sizes",
    [
        ("LlamaForCausalLM", dict(hidden_size=256, intermediate_size=1024)),
        ("Qwen3MoeForCausalLM", dict(hidden_size=256, moe_intermediate_size=256)),
    ],
)
def test_a_packed_checkpoint_is_loaded_without_its_dense_weights(
    tmp_path, triton_attn, architecture, sizes
):
    """Building the model from a 4-bit checkpoint allocates less than the dense linear (and
    expert) weights alone would take (it used to allocate them, then swap in the packed form);
    the float checkpoint of the same model allocates them all."""
    base = make_tiny_model(tmp_path / "wide", architecture, **sizes)
    quantized, _ = write_gptq(str(base), tmp_path / "q", bits=4, group=32)
    dense_model, dense_allocated = _build(base)
    dense_bytes = _dense_weight_bytes(dense_model)
    assert dense_allocated > dense_bytes
    model, allocated = _build(quantized)
    attention = model.model.layers[0].self_attn
    assert attention.qkv_proj.quant_method is not None
    # 4-bit words are an eighth of float32; read, joined and stacked, with the embeddings, the
    # model stays well under the dense weights (which it used to allocate, and more).
    assert allocated < 0.6 * dense_bytes, (allocated, dense_bytes)


def test_a_fused_layer_stored_two_ways_is_loaded_dense(tmp_path, base, triton_attn):
    """A checkpoint that left one projection of a fused layer unquantised: that layer (QKV) is
    loaded dense from its packed parts and its float part; the others stay packed; greedy
    tokens still equal transformers'."""
    quantized, dense = write_gptq(base, tmp_path / "q", bits=4, group=32)
    state = read_state(str(quantized))
    v_proj = "model.layers.0.self_attn.v_proj"
    for part in ("qweight", "qzeros", "scales", "g_idx"):
        del state[f"{v_proj}.{part}"]
    state[f"{v_proj}.weight"] = dense[f"{v_proj}.weight"]
    save_file(state, str(quantized / "model.safetensors"))
    dense_dir = write_dense(base, tmp_path / "dense", dense)
    llm = LLM(
        str(quantized), dtype="float32", max_model_len=64, num_gpu_blocks_override=16, block_size=8
    )
    model = llm.llm_engine.engine_core.executor.driver_worker.model_runner.model
    attention = model.model.layers[0].self_attn
    assert attention.qkv_proj.quant_method is None
    assert (
        attention.qkv_proj.weight.dtype == torch.float32 and not attention.qkv_proj.weight.is_meta
    )
    assert attention.o_proj.quant_method is not None
    assert model.model.layers[1].self_attn.qkv_proj.quant_method is not None
    [output] = llm.generate({"prompt_token_ids": PROMPT}, GREEDY)
    assert list(output.outputs[0].token_ids) == hf_greedy_tokens(dense_dir, PROMPT, 5)


def test_layers_read_as_tensors_and_moe_experts_are_loaded_dense(tmp_path, triton_attn):
    """A DeepSeek-V2 GPTQ checkpoint with every projection packed, MLA's kv_b_proj (read as the
    absorbed W_UK/W_UV, never multiplied) and the routed experts included: those two are loaded
    dense, the attention's other projections stay packed, and greedy tokens equal
    transformers'."""
    base = make_tiny_model(tmp_path / "v2", "DeepseekV2ForCausalLM")
    quantized, dense = write_gptq(
        str(base), tmp_path / "q", bits=4, group=32, projections=(*PROJECTIONS, "kv_b_proj")
    )
    dense_dir = write_dense(str(base), tmp_path / "dense", dense)
    llm = LLM(
        str(quantized), dtype="float32", max_model_len=64, num_gpu_blocks_override=16, block_size=8
    )
    model = llm.llm_engine.engine_core.executor.driver_worker.model_runner.model
    attention = model.model.layers[1].self_attn
    assert attention.kv_b_proj.quant_method is None and attention.kv_b_proj.weight.numel() > 0
    assert attention.q_proj.quant_method is not None
    assert attention.o_proj.quant_method is not None
    [output] = llm.generate({"prompt_token_ids": PROMPT}, GREEDY)
    assert list(output.outputs[0].token_ids) == hf_greedy_tokens(dense_dir, PROMPT, 5)


MIXTRAL_PROJECTIONS = (*PROJECTIONS, "w1", "w2", "w3")
MOE_CASES = {
    "qwen3-moe-gptq-4bit-desc-act": (
        "Qwen3MoeForCausalLM",
        write_gptq,
        dict(bits=4, group=32, desc_act=True, sym=False),
    ),
    "mixtral-gptq-8bit": (
        "MixtralForCausalLM",
        write_gptq,
        dict(bits=8, group=32, projections=MIXTRAL_PROJECTIONS),
    ),
    "mixtral-awq": (
        "MixtralForCausalLM",
        write_awq,
        dict(group=32, projections=MIXTRAL_PROJECTIONS),
    ),
    # a shared expert (intermediate size 48: groups of 16) and a dense layer
    "qwen2-moe-gptq-4bit": ("Qwen2MoeForCausalLM", write_gptq, dict(bits=4, group=16)),
}


@pytest.mark.parametrize("case", list(MOE_CASES))
def test_packed_experts_run_the_packed_moe_gemm(tmp_path, triton_attn, case):
    """A GPTQ or AWQ mixture-of-experts checkpoint: every MoE layer keeps its experts packed (no dense
    expert weights) and runs the packed MoE GEMMs; greedy tokens equal transformers' on the
    dequantised model."""
    from infernetes.runtime.model_executor.layers.fused_moe import FusedMoE

    architecture, writer, options = MOE_CASES[case]
    base = make_tiny_model(tmp_path / "base", architecture)
    quantized, dense = writer(str(base), tmp_path / "q", **options)
    dense_dir = write_dense(str(base), tmp_path / "dense", dense)
    llm = LLM(
        str(quantized), dtype="float32", max_model_len=64, num_gpu_blocks_override=16, block_size=8
    )
    model = llm.llm_engine.engine_core.executor.driver_worker.model_runner.model
    experts = [m for m in model.modules() if isinstance(m, FusedMoE)]
    assert experts and all(m.packed is not None for m in experts)
    assert all(m.w13_weight.numel() == 0 and m.w2_weight.numel() == 0 for m in experts)
    assert experts[0].packed[0].bits == options.get("bits", 4)
    [output] = llm.generate({"prompt_token_ids": PROMPT}, GREEDY)
    assert list(output.outputs[0].token_ids) == hf_greedy_tokens(dense_dir, PROMPT, 5)


def test_dummy_weights_of_a_quantized_moe_keep_packed_experts(tmp_path, triton_attn):
    """What ``bench gpu_moe --parts w4a16`` measures: --load-format dummy of a MoE model whose
    config declares GPTQ fills packed experts (drawn on the device) as well as packed linear
    layers."""
    from infernetes.runtime.model_executor.layers.fused_moe import FusedMoE

    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
    llm = _dummy_llm(make_tiny_model(tmp_path / "moe", "Qwen3MoeForCausalLM"), gptq)
    model = llm.llm_engine.engine_core.executor.driver_worker.model_runner.model
    experts = [m for m in model.modules() if isinstance(m, FusedMoE)]
    assert experts and all(m.packed is not None and m.packed[0].bits == 4 for m in experts)
    [output] = llm.generate({"prompt_token_ids": PROMPT}, GREEDY)
    assert len(output.outputs[0].token_ids) == 5


@pytest.mark.parametrize(
    ("architecture", "scales"),
    [
        ("Qwen3MoeForCausalLM", "tensor"),
        ("Qwen3MoeForCausalLM", "channel"),
        ("Qwen3MoeForCausalLM", "block"),
        ("DeepseekV3ForCausalLM", "block"),  # its own format: fine-grained fp8, MLA
    ],
)
def test_fp8_experts_stay_fp8(tmp_path, triton_attn, architecture, scales):
    """An fp8 MoE checkpoint (a scale per tensor, per channel or per block): every MoE layer
    keeps its experts in fp8 with a scale per expert and output, or per expert and block, and
    runs the fp8 MoE GEMMs; greedy tokens equal transformers' on the dequantised model."""
    from infernetes.runtime.model_executor.layers.fused_moe import FusedMoE

    base = make_tiny_model(tmp_path / "base", architecture)
    block = (16, 32) if architecture.startswith("Qwen") else (8, 8)  # MLA's ranks are 8s
    if scales == "block":
        quantized, dense = write_fp8_blockwise(str(base), tmp_path / "q", block=block)
    else:
        quantized, dense = write_fp8_static(
            str(base), tmp_path / "q", per_channel=scales == "channel"
        )
    dense_dir = write_dense(str(base), tmp_path / "dense", dense)
    llm = LLM(
        str(quantized), dtype="float32", max_model_len=64, num_gpu_blocks_override=16, block_size=8
    )
    model = llm.llm_engine.engine_core.executor.driver_worker.model_runner.model
    experts = [m for m in model.modules() if isinstance(m, FusedMoE)]
    assert experts
    for m in experts:
        assert m.w13_weight.dtype == m.w2_weight.dtype == torch.float8_e4m3fn
        if scales == "block":  # [E, N, K] in bn x bk blocks
            assert m.scale_block == block
            for w, scale in ((m.w13_weight, m.w13_scale), (m.w2_weight, m.w2_scale)):
                e, n, k = w.shape
                assert scale.shape == (e, n // block[0], k // block[1])
        else:
            assert m.w13_scale.shape == m.w13_weight.shape[:2]
            assert m.w2_scale.shape == m.w2_weight.shape[:2]
    [output] = llm.generate({"prompt_token_ids": PROMPT}, GREEDY)
    assert list(output.outputs[0].token_ids) == hf_greedy_tokens(dense_dir, PROMPT, 5)
