"""KV-cache scales from the checkpoint (``<attention>.k_scale`` / ``v_scale``), handed to the
attention layers for an fp8 KV cache (``--kv-cache-dtype fp8``)."""

from __future__ import annotations

from infernetes.runtime.model_executor.layers.attention import Attention
from torch import nn


def attach_kv_scales(model: nn.Module, scales: dict[str, dict[str, float]]) -> int:
    """Give each attention layer the scales its checkpoint prefix (the module holding it, such
    as ``model.layers.0.self_attn``) carries; returns how many layers got both."""
    attached = 0
    for name, module in model.named_modules():
        if isinstance(module, Attention):
            found = scales.get(name.rpartition(".")[0], {})
            module.checkpoint_k_scale = found.get("k")
            module.checkpoint_v_scale = found.get("v")
            attached += "k" in found and "v" in found
    return attached
