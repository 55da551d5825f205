"""Tiny GGUF files for the tests: a checkpoint written by ``runtime.testing`` turned into a GGUF
file as llama.cpp's converter lays one out (its tensor names, the Llama Q/K rows interleaved per
rotary half), with its linear weights in a chosen block type, quantized by the ``gguf`` package.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import MODEL_ARCH, GGMLQuantizationType, GGUFWriter, get_tensor_name_map
from gguf.quants import quantize


def _interleave_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's order of a head's Q/K rows: the two rotary halves interleaved."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_gguf_llama(
    model_dir: str | Path, file: str | Path, qtype: GGMLQuantizationType = GGMLQuantizationType.F32
) -> Path:
    """The Llama checkpoint in ``model_dir`` as the GGUF file ``file``: 2-d weights in ``qtype``
    (the norms stay F32, as llama.cpp keeps 1-d tensors). No tokenizer is written: load the
    folder's with ``--tokenizer``."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    state = {}
    for part in sorted(Path(model_dir).glob("*.safetensors")):
        state.update(load_file(str(part)))
    writer = GGUFWriter(str(file), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(config.vocab_size)
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    names = get_tensor_name_map(MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for hf_name, tensor in state.items():
        base, _, suffix = hf_name.rpartition(".")
        name = f"{names.get_name(base)}.{suffix}"
        values = tensor.to(torch.float32).numpy()
        if ".attn_q." in name:
            values = _interleave_rotary(values, config.num_attention_heads)
        elif ".attn_k." in name:
            values = _interleave_rotary(values, config.num_key_value_heads)
        if values.ndim == 2 and qtype != GGMLQuantizationType.F32:
            writer.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(file)
