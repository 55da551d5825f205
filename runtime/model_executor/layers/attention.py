"""Attention over the paged KV cache: store this step's keys/values, then attend.

The cache tensors ``k_cache``/``v_cache`` (``[num_blocks, block_size, num_kv_heads, head_dim]``)
are bound by the ModelRunner after it sizes the cache. Keys and values of the whole batch are
stored before any query attends, so a request may read blocks another request of the same step is
filling (prefix-cache hits on blocks computed in this very step).

With a KV connector in the step's metadata, a layer waits for its part of the connector's load
before it touches its cache and hands its cache to the connector to save after attending.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from infernetes.kernels import ops
from infernetes.runtime.model_executor.context import AttentionMetadata, get_attention_metadata
from torch import nn


class Attention(nn.Module):
    # Cache tensors per layer: a key and a value cache (a latent-attention layer keeps one).
    cache_tensors = 2

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: int | None = None,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window  # attend to the last N positions only
        self.softcap = softcap  # Gemma 2's attention logit soft-capping
        self.sinks: torch.Tensor | None = None  # gpt-oss: a logit per head, no value
        self.k_cache = torch.tensor([])
        self.v_cache = torch.tensor([])
        # fp8 caches store x / scale; 1.0 unless --calculate-kv-scales measures them.
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None
        # Scales a quantized checkpoint carries for this layer (layers/quantization/kv_scales.py).
        self.checkpoint_k_scale: float | None = None
        self.checkpoint_v_scale: float | None = None
        # A decoder served as a pooling model (a reranker) keeps no cache: each prompt is whole
        # in its step and attends causally within itself.
        self.without_cache = False
        self.layer_name = ""  # its module name, set by the ModelRunner (the KV connector's key)

    def _measure_scales(self, k: torch.Tensor, v: torch.Tensor) -> None:
        fp8_max = torch.finfo(self.k_cache.dtype).max
        assert self.k_scale is not None and self.v_scale is not None  # fp8 caches carry scales
        self.k_scale.copy_((k.abs().max().float() / fp8_max).clamp(min=1e-6))
        self.v_scale.copy_((v.abs().max().float() / fp8_max).clamp(min=1e-6))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q ``[T, H*D]``, k/v ``[T, Hkv*D]`` -> ``[T, H*D]``."""
        meta = get_attention_metadata()
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.without_cache:
            return self._within_prompts(q, k, v, meta.cu_seqlens_q)
        if meta.calculate_kv_scales and self.k_scale is not None:
            self._measure_scales(k, v)
        connector = meta.kv_connector
        if connector is not None:
            connector.wait_for_layer_load(self.layer_name)
        ops.store_kv(
            k, v, self.k_cache, self.v_cache, meta.slot_mapping, self.k_scale, self.v_scale
        )
        out = self._attend(q, meta)
        if meta.image_spans:
            ops.attend_within_images(
                q,
                self.k_cache,
                self.v_cache,
                meta.block_tables,
                meta.image_spans,
                self.scale,
                out,
                self.k_scale,
                self.v_scale,
                self.sliding_window,
                self.softcap,
            )
        out = out.reshape(-1, self.num_heads * self.head_dim)
        if connector is not None:
            connector.save_kv_layer(self.layer_name, (self.k_cache, self.v_cache), meta)
        return out

    def _attend(self, q: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """``q`` ``[T, H, D]`` over the paged cache -> ``[T, H, D]``."""
        return ops.paged_attention(
            q,
            self.k_cache,
            self.v_cache,
            meta.block_tables,
            meta.cu_seqlens_q,
            meta.seq_lens,
            self.scale,
            self.k_scale,
            self.v_scale,
            self.sliding_window,
            self.softcap,
            self.sinks,
        )

    def _within_prompts(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor
    ) -> torch.Tensor:
        """Causal attention of each whole prompt over itself (no cache), grouped-query heads
        repeated to the query heads."""
        group = self.num_heads // self.num_kv_heads
        out = torch.empty_like(q)
        bounds = cu_seqlens.tolist()
        for start, end in itertools.pairwise(bounds):
            span = slice(start, end)
            keys = k[span].repeat_interleave(group, dim=1).transpose(0, 1)
            values = v[span].repeat_interleave(group, dim=1).transpose(0, 1)
            out[span] = F.scaled_dot_product_attention(
                q[span].transpose(0, 1), keys, values, is_causal=True, scale=self.scale
            ).transpose(0, 1)
        return out.reshape(-1, self.num_heads * self.head_dim)


class LatentAttention(Attention):
    """Multi-head latent attention (DeepSeek's MLA) over a cache of one latent per token.

    Each token stores ``[compressed_kv (kv_lora_rank), rotated k_pe (rope_dim)]`` once, as a
    single "KV head" of ``head_dim = kv_lora_rank + rope_dim``: the key and value caches are one
    tensor (``cache_tensors = 1``, so the KV-cache sizing counts it once). The caller has already
    absorbed the key up-projection into the queries, so every head attends over the latent as
    multi-query attention; the value is the latent's first ``kv_lora_rank`` entries, so the
    output is cut to those (the caller applies the value up-projection after).
    """

    cache_tensors = 1
    # Query heads per attention call: the Triton kernels tile every query head of a KV head at
    # once, and one latent head serves up to 128 (DeepSeek-V3 on one rank), which as one
    # [heads, 1024] float32 accumulator would not fit a GPU's registers. vLLM's Triton MLA decode
    # also works on blocks of 16 heads.
    heads_per_call = 16

    def __init__(self, num_heads: int, kv_lora_rank: int, rope_dim: int, scale: float) -> None:
        super().__init__(num_heads, kv_lora_rank + rope_dim, scale, num_kv_heads=1)
        self.kv_lora_rank = kv_lora_rank

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q ``[T, H, kv_lora_rank + rope_dim]``, the latent k ``[T, kv_lora_rank + rope_dim]``
        -> ``[T, H, kv_lora_rank]``."""
        out = super().forward(q.reshape(q.shape[0], -1), k, k)
        return out.view(-1, self.num_heads, self.head_dim)[..., : self.kv_lora_rank]

    def _attend(self, q: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        if self.num_heads <= self.heads_per_call:
            return super()._attend(q, meta)
        attend = super()._attend  # (a comprehension has no zero-argument super)
        return torch.cat([attend(part, meta) for part in q.split(self.heads_per_call, dim=1)], 1)
