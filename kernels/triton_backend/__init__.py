"""The Triton implementations of the ops, with the signatures of `infernetes.kernels.ops`.

Import this package only when TRITON_ATTN is selected: Triton decides at import whether kernels
are compiled or interpreted (TRITON_INTERPRET)."""

from infernetes.kernels.triton_backend.activation import silu_and_mul
from infernetes.kernels.triton_backend.attention import paged_attention
from infernetes.kernels.triton_backend.cache import store_kv
from infernetes.kernels.triton_backend.fp8 import fp8_linear, scaled_fp8_quant
from infernetes.kernels.triton_backend.fp8_block import block_fp8_linear
from infernetes.kernels.triton_backend.lora import lora_expand, lora_shrink
from infernetes.kernels.triton_backend.moe import fused_moe
from infernetes.kernels.triton_backend.moe_wna16 import fused_moe_wna16
from infernetes.kernels.triton_backend.norm import rms_norm
from infernetes.kernels.triton_backend.rotary import rotary_embedding
from infernetes.kernels.triton_backend.wna16 import wna16_linear

__all__ = [
    "block_fp8_linear",
    "fp8_linear",
    "fused_moe",
    "fused_moe_wna16",
    "lora_expand",
    "lora_shrink",
    "paged_attention",
    "rms_norm",
    "rotary_embedding",
    "scaled_fp8_quant",
    "silu_and_mul",
    "store_kv",
    "wna16_linear",
]
