"""A GGUF file as the model, as vLLM loads one: ``--model x.gguf``, a folder holding one (and no
config.json), or ``--load-format gguf``. The HF config and the tokenizer (with its chat template)
come from the file's metadata through transformers (``gguf_file=``) unless ``--hf-config-path`` /
``--tokenizer`` are given; the tensors are read with the ``gguf`` package, renamed to the HF
checkpoint names the model loads (``gguf.get_tensor_name_map``) and undo what llama.cpp's converter did to
them (the rotary interleave of Llama's Q/K rows, Gemma's ``1 +`` norms), as transformers' GGUF
reader does. Quantized blocks come as ``GroupQuantWeight``s (layers/quantization/gguf_blocks.py).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import MODEL_ARCH_NAMES, GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf import get_tensor_name_map as gguf_tensor_names
from infernetes.runtime.model_executor.layers.quantization.gguf_blocks import (
    BLOCK_TYPES,
    group_quant_weight,
)
from infernetes.runtime.model_executor.layers.quantization.group_quant import GroupQuantWeight
from infernetes.runtime.model_executor.loader import ModelLoadError
from torch import nn
from transformers import PretrainedConfig

logger = logging.getLogger(__name__)

SUFFIX = ".gguf"
DENSE = {
    GGMLQuantizationType.F32: torch.float32,
    GGMLQuantizationType.F16: torch.float16,
    GGMLQuantizationType.BF16: torch.bfloat16,
}
# llama.cpp's converter interleaves the rotary halves of each head's Q and K rows for these
# architectures (transformers' GGUF reader undoes it for the same ones).
PERMUTED_QK = ("llama",)
# ... and stores Gemma's RMSNorm weights as ``1 + w``.
NORM_PLUS_ONE = ("gemma2", "gemma3")

# Sizes transformers' GGUF reader maps for some families only, leaving the others their config
# defaults (Qwen3's heads of 128, Qwen MoE's expert sizes), which a smaller model would not fit.
SIZES_TRANSFORMERS_DROPS = {
    "attention.key_length": "head_dim",
    "expert_feed_forward_length": "moe_intermediate_size",
    "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
}
# llama.cpp stacks each layer's experts: ``blk.3.ffn_gate_exps`` holds every expert's gate_proj.
STACKED_EXPERTS = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")

GGUFWeight = torch.Tensor | GroupQuantWeight


def is_gguf(path: Path) -> bool:
    return path.suffix == SUFFIX and path.is_file()


def gguf_file(path: Path, load_format: str) -> Path | None:
    """The GGUF file the model at ``path`` is, or None when it is a checkpoint of another format.
    ``--load-format gguf`` asks for one; ``auto`` takes a folder's only .gguf file when the folder
    has no config.json."""
    if path.is_file():
        if path.suffix != SUFFIX:
            raise ModelLoadError(f"model path {path} is a file but not a GGUF (.gguf) file")
        if load_format not in ("auto", "gguf", "dummy"):
            raise ModelLoadError(
                f"{path} is a GGUF file; load_format {load_format!r} does not read it (use auto or "
                "gguf)"
            )
        return path
    if load_format not in ("auto", "gguf") or not path.is_dir():
        return None
    found = sorted(path.glob("*" + SUFFIX))
    if load_format == "auto" and (len(found) != 1 or (path / "config.json").is_file()):
        return None
    if len(found) != 1:
        names = ", ".join(f.name for f in found) or "none"
        raise ModelLoadError(
            f"load_format gguf needs a .gguf file or a folder holding exactly one; {path} holds "
            f"{names}: pass the file itself as the model"
        )
    return found[0]


def pretrained_source(file: Path) -> tuple[str, dict[str, Any]]:
    """The folder and keywords transformers' ``from_pretrained`` reads a GGUF file with."""
    return str(file.parent), {"gguf_file": file.name}


def load_config(file: Path) -> PretrainedConfig:
    """The HF config transformers derives from the file's metadata, with the architecture its
    model type names (GGUF metadata has none of its own)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    folder, keywords = pretrained_source(file)
    try:
        config = AutoConfig.from_pretrained(folder, **keywords)
    except (ValueError, KeyError, OSError) as error:
        raise ModelLoadError(f"cannot read the model config from {file}: {error}") from error
    if not getattr(config, "architectures", None):
        architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
        config.architectures = [architecture] if architecture else []
    metadata = _architecture_metadata(file)
    if config.model_type == "llama" and metadata.get("expert_count"):
        config = _mixtral_config(config, metadata)
    for key, attribute in SIZES_TRANSFORMERS_DROPS.items():
        if key in metadata and hasattr(config, attribute):
            setattr(config, attribute, int(metadata[key]))
    _rotary_dims_from_file(metadata, config)
    return config


def _mixtral_config(llama: PretrainedConfig, metadata: dict[str, Any]) -> PretrainedConfig:
    """llama.cpp writes Mixtral as a Llama with experts, which transformers' reader reads as a
    dense Llama: the same config as Mixtral's, with its experts."""
    from transformers import MixtralConfig

    settings = {
        k: v for k, v in llama.to_dict().items() if k not in ("model_type", "architectures")
    }
    settings.update(
        num_local_experts=int(metadata["expert_count"]),
        num_experts_per_tok=int(metadata["expert_used_count"]),
        sliding_window=None,
        architectures=["MixtralForCausalLM"],
    )
    return MixtralConfig(**settings)


def _rotary_dims_from_file(metadata: dict[str, Any], config: PretrainedConfig) -> None:
    """A rotary part of each head (Phi-4-mini rotates 3/4 of it) from ``rope.dimension_count``,
    which transformers' reader drops for the families that have a ``partial_rotary_factor``."""
    dims = metadata.get("rope.dimension_count")
    rope = getattr(config, "rope_parameters", None)
    if dims is None or not isinstance(rope, dict) or "partial_rotary_factor" not in rope:
        return
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope["partial_rotary_factor"] = config.partial_rotary_factor = int(dims) / head_dim


def _architecture(reader: GGUFReader) -> str:
    """The file's ``general.architecture`` ("" when it has none)."""
    field = reader.fields.get("general.architecture")
    return str(field.contents()) if field is not None else ""


def _architecture_metadata(file: Path) -> dict[str, Any]:
    """The file's ``<architecture>.*`` metadata keyed without the architecture."""
    reader = GGUFReader(file)
    fields = reader.fields
    architecture = _architecture(reader)
    if not architecture:
        return {}
    prefix = f"{architecture}."
    return {
        key.removeprefix(prefix): field.contents()
        for key, field in fields.items()
        if key.startswith(prefix)
    }


def _hf_names(model: nn.Module, architecture: str, layers: int) -> dict[str, str]:
    """GGUF tensor name -> the checkpoint name the model loads, through the gguf package's map:
    a fused layer's parts (``stacked_params``: the HF checkpoints of most families store them
    apart) before its own name, since the map reads some fused names too (``gate_up_proj`` is
    ``ffn_up``), unless the architecture has no tensor for one of the parts."""
    from infernetes.runtime.model_executor.layers.quantization.kept import checkpoint_parts

    arch = next((key for key, name in MODEL_ARCH_NAMES.items() if name == architecture), None)
    if arch is None:
        raise ModelLoadError(f"GGUF architecture {architecture!r} is not known to the gguf package")
    gguf_names = gguf_tensor_names(arch, layers)
    stacked = list(getattr(model, "stacked_params", []))
    names: dict[str, str] = {}
    for param, _ in model.named_parameters(remove_duplicate=False):
        prefix, _, suffix = param.rpartition(".")
        parts = [part for part, _ in checkpoint_parts(prefix, stacked)]
        if any(gguf_names.get_name(part) is None for part in parts):
            parts = []  # the architecture stores this layer fused (Phi-3's ``ffn_up`` is gate+up)
        for candidate in [*parts, prefix]:
            gguf_name = gguf_names.get_name(candidate)
            if gguf_name is not None:
                names.setdefault(f"{gguf_name}.{suffix}", f"{candidate}.{suffix}")
    return names


def _tensor(tensor: ReaderTensor) -> GGUFWeight:
    qtype = GGMLQuantizationType(tensor.tensor_type)
    if qtype in DENSE:
        raw = torch.from_numpy(np.array(tensor.data, copy=True))
        return raw.view(DENSE[qtype]).reshape(tuple(reversed([int(n) for n in tensor.shape])))
    if qtype in BLOCK_TYPES and len(tensor.shape) == 2:
        return group_quant_weight(tensor.data, qtype)
    supported = ", ".join(t.name for t in [*DENSE, *BLOCK_TYPES])
    raise ModelLoadError(
        f"GGUF tensor {tensor.name!r} ({len(tensor.shape)}-d) is of type {qtype.name}, which is "
        f"not supported; supported: {supported} (quantized types as 2-d weights)"
    )


def _expert_tensors(
    tensor: ReaderTensor, layer: str, projection: str
) -> Iterator[tuple[str, torch.Tensor]]:
    """A stacked expert tensor as each expert's checkpoint tensor, dense (experts are held dense
    on every device, as GPTQ's and AWQ's are)."""
    qtype = GGMLQuantizationType(tensor.tensor_type)
    data = np.asarray(tensor.data)
    for expert in range(data.shape[0]):
        if qtype in DENSE:
            value = torch.from_numpy(np.array(data[expert], copy=True)).view(DENSE[qtype])
        elif qtype in BLOCK_TYPES:
            value = group_quant_weight(data[expert], qtype).dequantize(torch.float32)
        else:
            raise ModelLoadError(
                f"GGUF tensor {tensor.name!r} (MoE experts) is of type {qtype.name}, which is "
                "not supported"
            )
        yield f"model.layers.{layer}.mlp.experts.{expert}.{projection}_proj.weight", value


def _rotary_order(rows: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's interleave of each head's two rotary halves."""
    return torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)


def _undo_conversion(name: str, value: GGUFWeight, architecture: str, hf_config: Any) -> GGUFWeight:
    heads = None
    if architecture in PERMUTED_QK and ".attn_q." in name:
        heads = hf_config.num_attention_heads
    elif architecture in PERMUTED_QK and ".attn_k." in name:
        heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    if heads is not None:
        rows = value.outputs if isinstance(value, GroupQuantWeight) else value.shape[0]
        order = _rotary_order(rows, heads)
        return value.select_outputs(order) if isinstance(value, GroupQuantWeight) else value[order]
    if architecture in NORM_PLUS_ONE and "norm.weight" in name and isinstance(value, torch.Tensor):
        return value - 1
    if ".ffn_gate_inp_shexp." in name and isinstance(value, torch.Tensor) and value.dim() == 1:
        return value.unsqueeze(0)  # a vector in the file, the one-output gate's weight here
    return value


def gguf_weights(
    file: Path, model: nn.Module, hf_config: PretrainedConfig
) -> Iterator[tuple[str, GGUFWeight]]:
    """Each tensor of the file by the checkpoint name ``model`` loads it under: dense types as
    tensors, quantized ones as ``GroupQuantWeight``s. Tensors no parameter maps to (llama.cpp's
    precomputed rope frequencies) are left out."""
    try:
        reader = GGUFReader(file)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot read the GGUF file {file}: {error}") from error
    architecture = _architecture(reader)
    names = _hf_names(model, architecture, hf_config.num_hidden_layers)
    skipped = []
    for tensor in reader.tensors:
        experts = STACKED_EXPERTS.match(tensor.name)
        if experts is not None:
            yield from _expert_tensors(tensor, *experts.groups())
            continue
        hf_name = names.get(tensor.name)
        if hf_name is None:
            skipped.append(tensor.name)
            continue
        yield hf_name, _undo_conversion(tensor.name, _tensor(tensor), architecture, hf_config)
    if skipped:
        logger.info("GGUF tensors without a parameter, left out: %s", ", ".join(skipped))


def keeps_quantized(device: torch.device) -> bool:
    """On the CPU the blocks stay as stored (``GroupQuantWeight``'s matmul); Triton kernels for
    them are planned, so a GPU loads them dense."""
    return device.type == "cpu"


def load_gguf(
    model: Any, file: Path, hf_config: PretrainedConfig, dtype: torch.dtype, device: torch.device
) -> set[str]:
    """``model.load_weights`` over the file's tensors; on the CPU the quantized ones go to the
    layers as stored (the kept-layers mechanism, layers/quantization/kept.py)."""
    from infernetes.runtime.model_executor.layers.quantization.kept import KeptWeight
    from infernetes.runtime.model_executor.layers.quantization.loading import install_kept

    keep = keeps_quantized(device)
    kept: dict[str, KeptWeight] = {}
    dense: list[str] = []

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        for name, value in gguf_weights(file, model, hf_config):
            if isinstance(value, GroupQuantWeight):
                prefix, _, suffix = name.rpartition(".")
                if keep and suffix == "weight":
                    kept[prefix] = value
                    continue
                value = value.dequantize(dtype)
                dense.append(name)
            yield name, value

    loaded = model.load_weights(stream())
    if dense:
        logger.info(
            "GGUF: %d quantized tensors dequantised to %s at load (GPU kernels for GGUF blocks "
            "are planned)",
            len(dense),
            str(dtype).removeprefix("torch."),
        )
    if kept:
        loaded |= install_kept(model, kept, device, dtype)
    return loaded
