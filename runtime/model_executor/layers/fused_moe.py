"""The routed experts of a mixture-of-experts block, stacked as the kernels want them.

A checkpoint stores each expert's gate, up and down projections as separate tensors
(``experts.3.gate_proj.weight``, or Mixtral's ``w1``/``w3``/``w2``); they load into ``w13_weight``
``[E, 2 * I, H]`` and ``w2_weight`` ``[E, H, I]``. Under tensor parallelism every rank holds every
expert with a slice of its intermediate size (column-parallel gate/up, row-parallel down), and the
partial outputs are summed across ranks, as vLLM does without expert parallelism. With
``--enable-expert-parallel`` each rank holds ``E / tp`` whole experts instead; a token's routed
experts run on the ranks that hold them (the others skip them) and the same sum combines them.
"""

from __future__ import annotations

import torch
from infernetes.kernels import ops
from infernetes.kernels.reference.wna16 import PackedExperts
from infernetes.runtime.model_executor import parallel
from infernetes.runtime.model_executor.layers.deferred_weights import weight_parameter, writable
from infernetes.runtime.model_executor.lazy_weight import as_tensor
from infernetes.runtime.model_executor.parallel import all_reduce
from torch import nn

# Checkpoint names of an expert's projections -> this layer's shard ids.
EXPERT_PROJECTIONS = {
    "gate_proj": "w1",
    "up_proj": "w3",
    "down_proj": "w2",
    "w1": "w1",
    "w3": "w3",
    "w2": "w2",
}


class FusedMoE(nn.Module):
    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        renormalize: bool,
    ) -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok {top_k} must be in 1..{num_experts}")
        state = parallel.state()
        self.num_experts = num_experts
        self.top_k = top_k
        self.renormalize = renormalize
        # Either every expert with a slice of its intermediate size (tensor parallel), or whole
        # experts, a contiguous range of them per rank (expert parallel).
        self.expert_parallel = state.expert_parallel and state.tp_size > 1
        slices, groups = (1, state.tp_size) if self.expert_parallel else (state.tp_size, 1)
        if intermediate_size % slices or num_experts % groups:
            what, size = (
                ("experts", num_experts)
                if self.expert_parallel
                else ("intermediate size", intermediate_size)
            )
            raise ValueError(
                f"the MoE layer's {what} ({size}) is not divisible by the tensor-parallel size "
                f"({state.tp_size})"
            )
        self.shard = intermediate_size // slices
        self.slice_rank = 0 if self.expert_parallel else state.tp_rank
        self.num_local_experts = num_experts // groups
        self.first_expert = state.tp_rank * self.num_local_experts if self.expert_parallel else 0
        self.w13_weight = weight_parameter(self.num_local_experts, 2 * self.shard, hidden_size)
        self.w2_weight = weight_parameter(self.num_local_experts, hidden_size, self.shard)
        for param in (self.w13_weight, self.w2_weight):
            param.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # a loader rides on its parameter, as in vLLM
        self.w13_scale: torch.Tensor | None = None
        self.w2_scale: torch.Tensor | None = None
        self.scale_block: tuple[int, int] | None = None  # block-wise fp8 experts' block
        # The experts kept 4/8-bit packed (w13, w2) where the Triton kernels run, set after
        # loading (layers/quantization/kept_experts.py); the dense weights then stay empty.
        self.packed: tuple[PackedExperts, PackedExperts] | None = None

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str, expert_id: int
    ) -> None:
        """Load one expert's ``w1`` (gate), ``w3`` (up) or ``w2`` (down) projection."""
        if not 0 <= expert_id < self.num_experts:
            raise ValueError(f"expert {expert_id} is outside the model's {self.num_experts}")
        local = expert_id - self.first_expert
        if not 0 <= local < self.num_local_experts:
            return  # another rank's expert
        param = writable(self, "w2_weight" if shard_id == "w2" else "w13_weight", param)
        start = self.slice_rank * self.shard
        if shard_id == "w2":
            target = param.data[local]
            source = loaded.narrow(1, start, self.shard)
        else:
            offset = 0 if shard_id == "w1" else self.shard
            target = param.data[local].narrow(0, offset, self.shard)
            source = loaded.narrow(0, start, self.shard)
        if tuple(source.shape) != tuple(target.shape):
            raise ValueError(
                f"expert {expert_id} {shard_id} weight {tuple(loaded.shape)} does not fit "
                f"the layer's {tuple(param.shape)}"
            )
        target.copy_(as_tensor(source))

    def keep_packed(
        self, w13: PackedExperts, w2: PackedExperts, device: torch.device, dtype: torch.dtype
    ) -> None:
        """Run on the experts' packed weights (``w13`` ``[E, H * bits / 32, 2 * shard]``, ``w2``
        ``[E, shard * bits / 32, H]``, this rank's) instead of dense ones."""
        self.packed = (w13.to(device, dtype), w2.to(device, dtype))
        empty = torch.empty(0, device=device, dtype=dtype)
        self.w13_weight = nn.Parameter(empty, requires_grad=False)
        self.w2_weight = nn.Parameter(empty, requires_grad=False)

    def keep_fp8(
        self,
        w13: torch.Tensor,
        w13_scale: torch.Tensor,
        w2: torch.Tensor,
        w2_scale: torch.Tensor,
        device: torch.device,
        block: tuple[int, int] | None = None,
    ) -> None:
        """Run on a checkpoint's fp8 experts (``w13`` ``[E, 2 * shard, H]``, ``w2`` ``[E, H,
        shard]``, this rank's) with a scale per expert and output (``[E, N]``), or per
        ``block`` (``[E, ceil(N / bn), ceil(K / bk)]``)."""
        self.w13_weight = nn.Parameter(w13.to(device), requires_grad=False)
        self.w2_weight = nn.Parameter(w2.to(device), requires_grad=False)
        self.w13_scale = w13_scale.to(device, torch.float32)
        self.w2_scale = w2_scale.to(device, torch.float32)
        self.scale_block = block

    def quantize_fp8(self) -> None:
        """Online fp8 (``--quantization fp8``): each expert's weights with a per-expert scale."""
        for name in ("w13", "w2"):
            weight = getattr(self, f"{name}_weight").data
            pairs = [ops.quantize_weight_fp8(weight[e]) for e in range(self.num_local_experts)]
            qweight = torch.stack([q for q, _ in pairs])
            setattr(self, f"{name}_weight", nn.Parameter(qweight, requires_grad=False))
            setattr(self, f"{name}_scale", torch.stack([s.reshape(()).float() for _, s in pairs]))

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        weights, ids = ops.select_experts(router_logits, self.top_k, self.renormalize)
        return self.run_experts(hidden, weights, ids)

    def run_experts(
        self, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        """The experts of an already routed batch: ``weights``/``ids`` ``[T, top_k]`` (a model
        with its own routing, as DeepSeek's, calls this directly)."""
        if self.expert_parallel:  # this rank's experts by local index, the others' skipped (-1)
            ids = ids - self.first_expert
            ids = torch.where((ids >= 0) & (ids < self.num_local_experts), ids, -1)
        if self.packed is not None:
            out = ops.fused_moe_wna16(hidden, *self.packed, weights, ids)
        else:
            out = ops.fused_moe(
                hidden,
                self.w13_weight,
                self.w2_weight,
                weights,
                ids,
                self.w13_scale,
                self.w2_scale,
                self.scale_block,
            )
        return all_reduce(out)
