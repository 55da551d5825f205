"""Tiny GGUF files for the tests: a checkpoint written by ``runtime.testing`` turned into a GGUF
file as llama.cpp's converter lays one out (its tensor names, the Llama Q/K rows interleaved per
rotary half), with its linear weights in a chosen block type, quantized by the ``gguf`` package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import MODEL_ARCH_NAMES, GGMLQuantizationType, GGUFWriter, get_tensor_name_map
from gguf.quants import quantize
from infernetes.runtime.model_executor.layers.quantization.gguf_blocks import BLOCK_TYPES
from infernetes.runtime.model_executor.layers.quantization.group_quant import GroupQuantWeight

Q = GGMLQuantizationType
# Byte offsets of each block type's f16 fields; the rest of a block is integers of any value.
F16_FIELDS = {
    Q.Q8_0: (0,),
    Q.Q4_0: (0,),
    Q.Q4_1: (0, 2),
    Q.Q5_0: (0,),
    Q.Q5_1: (0, 2),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
}
# Types the gguf package quantizes; the others are written as random blocks.
QUANTIZABLE = (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1)


def random_blocks(
    qtype: GGMLQuantizationType,
    rows: int,
    blocks_per_row: int,
    rng: np.random.Generator,
    magnitude: float | None = None,
) -> np.ndarray:
    """Random ``[rows, bytes]`` blocks of ``qtype`` with finite f16 scales of both signs, of
    about ``magnitude`` (None: many magnitudes)."""
    block_bytes = BLOCK_TYPES[qtype][0]
    raw = rng.integers(0, 256, size=(rows, blocks_per_row, block_bytes), dtype=np.uint8)
    for at in F16_FIELDS[qtype]:
        scale = 10.0 ** rng.integers(-6, 2) if magnitude is None else magnitude
        values = (rng.standard_normal((rows, blocks_per_row)) * scale).astype(np.float16)
        raw[..., at : at + 2] = values.reshape(rows, blocks_per_row, 1).view(np.uint8)
    return raw.reshape(rows, -1)


def _interleave_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's order of a head's Q/K rows: the two rotary halves interleaved."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _stack_experts(state: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint with each layer's experts stacked into one 3-d tensor per projection
    (``mlp.experts.gate_proj.weight``: ``[experts, out, in]``), as llama.cpp stores them."""
    import torch
    from infernetes.runtime.model_executor.models.moe import EXPERT_TENSOR

    stacked: dict[str, Any] = {}
    groups: dict[str, dict[int, Any]] = {}
    for name, tensor in state.items():
        match = EXPERT_TENSOR.match(name)
        if match is None:
            stacked[name] = tensor
            continue
        prefix, index, projection = match.groups()
        groups.setdefault(f"{prefix}.experts.{projection}.weight", {})[int(index)] = tensor
    for name, by_index in groups.items():
        stacked[name] = torch.stack([by_index[i] for i in sorted(by_index)])
    return stacked


def write_gguf(
    model_dir: str | Path,
    file: str | Path,
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
    seed: int = 0,
    types: dict[str, GGMLQuantizationType] | None = None,
) -> Path:
    """The checkpoint in ``model_dir`` (the GGUF architecture is its model type; MoE experts
    stacked per layer) as the GGUF file ``file``: 2-d weights in ``qtype`` (norms and biases stay F32,
    as llama.cpp keeps 1-d tensors): quantized by the gguf package where it can, else random
    blocks of that type (the K-quants), which makes a random model of the same shape. No
    tokenizer is written: load the folder's with ``--tokenizer``. ``types`` gives some tensors
    another type, by the GGUF name's part (``{"attn_v": Q.Q6_K}``, as llama.cpp's mixes do)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    state = {}
    for part in sorted(Path(model_dir).glob("*.safetensors")):
        state.update(load_file(str(part)))
    arch = {
        "gemma3_text": "gemma3",
        "qwen2_moe": "qwen2moe",
        "qwen3_moe": "qwen3moe",
        "mixtral": "llama",  # llama.cpp writes Mixtral as a Llama with experts
    }.get(config.model_type, config.model_type)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer = GGUFWriter(str(file), arch)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    rope = config.rope_parameters
    rope = rope.get("full_attention", rope)  # Gemma 3 keeps one per layer kind
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    partial = rope.get("partial_rotary_factor") or getattr(config, "partial_rotary_factor", 1.0)
    writer.add_rope_dimension_count(int(head_dim * (partial or 1.0)))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(config.vocab_size)
    if getattr(config, "sliding_window", None):
        writer.add_sliding_window(config.sliding_window)
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    if getattr(config, "pad_token_id", None) is not None:
        writer.add_pad_token_id(config.pad_token_id)  # else Phi-3's config default (32000) stays
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        if getattr(config, "moe_intermediate_size", None):
            writer.add_expert_feed_forward_length(config.moe_intermediate_size)
        if getattr(config, "shared_expert_intermediate_size", None):
            writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    model_arch = next(key for key, name in MODEL_ARCH_NAMES.items() if name == arch)
    names = get_tensor_name_map(model_arch, config.num_hidden_layers)
    rng = np.random.default_rng(seed)
    for hf_name, tensor in _stack_experts(state).items():
        base, _, suffix = hf_name.rpartition(".")
        name = f"{names.get_name(base)}.{suffix}"
        values = tensor.to(torch.float32).numpy()
        if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
            values = values + 1  # llama.cpp stores Gemma's RMSNorm scale as 1 + w
        elif ".ffn_gate_inp_shexp." in name:
            values = values.reshape(-1)  # llama.cpp keeps the shared expert's gate as a vector
        elif arch != "llama":  # only llama.cpp's Llama converter interleaves
            pass
        elif ".attn_q." in name:
            values = _interleave_rotary(values, config.num_attention_heads)
        elif ".attn_k." in name:
            values = _interleave_rotary(values, config.num_key_value_heads)
        kind = next((t for part, t in (types or {}).items() if f".{part}." in name), qtype)
        if values.ndim >= 2 and kind in QUANTIZABLE:
            writer.add_tensor(name, quantize(values, kind), raw_dtype=kind)
        elif values.ndim >= 2 and kind == Q.F16:
            writer.add_tensor(name, values.astype(np.float16))
        elif values.ndim == 2 and kind != Q.F32:
            per_row, rest = divmod(values.shape[1], BLOCK_TYPES[kind][1])
            if rest or not per_row:
                raise ValueError(
                    f"{name}: rows of {values.shape[1]} values are not whole {kind.name} "
                    f"blocks of {BLOCK_TYPES[kind][1]}"
                )
            blocks = random_blocks(kind, values.shape[0], per_row, rng, magnitude=1e-4)
            writer.add_tensor(name, blocks, raw_dtype=kind)
        else:
            writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(file)


def hf_gguf_greedy(file: Path, prompt: list[int], max_tokens: int, config: Any = None) -> list[int]:
    """transformers' greedy tokens for ``prompt`` from the GGUF ``file`` (its reader dequantises
    every tensor to float32): the reference for a GGUF model's tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    extra = {} if config is None else {"config": config}
    model = AutoModelForCausalLM.from_pretrained(
        str(file.parent), gguf_file=file.name, dtype=torch.float32, **extra
    ).eval()
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=[],
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def held_tensor_bytes(model: torch.nn.Module) -> int:
    """Bytes of every weight the model holds, each storage once: parameters, persistent buffers,
    tensors kept as module attributes (a packed copy), and the stored forms of quantized layers
    and vocabularies. Derived tables (the rotary cache) and the KV cache are not weights."""
    storages: dict[int, int] = {}

    def hold(tensor: object) -> None:
        if isinstance(tensor, torch.Tensor) and tensor.numel():
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()

    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            hold(parameter)
        for name, buffer in module.named_buffers(recurse=False):
            if name not in module._non_persistent_buffers_set:
                hold(buffer)
        for name, value in vars(module).items():
            if name not in ("k_cache", "v_cache"):
                hold(value)
        for form in (getattr(module, "quant_method", None), getattr(module, "quantized", None)):
            if isinstance(form, GroupQuantWeight):
                for kept in (form.qweight, form.scale, form.offset):
                    hold(kept)
    return sum(storages.values())
