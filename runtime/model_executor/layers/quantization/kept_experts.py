"""Mixture-of-experts layers that run on the checkpoint's own expert weights where the Triton
kernels run, as kept.py does for linear layers: packed int4/int8 (``ops.fused_moe_wna16``) or
fp8 with a scale per output or per block (``ops.fused_moe``'s fp8 paths).

A checkpoint stores each expert's gate, up and down projections as separate layers
(``mlp.experts.3.gate_proj.qweight``, Mixtral's ``w1``/``w3``/``w2``). Once the stream is done,
each ``FusedMoE`` whose local experts all came in one kept form takes them: per expert, this
rank's slice of the intermediate size (the gate and up outputs, the down projection's inputs, on
whole packed words), gate and up joined, then the experts stacked. A layer whose experts do not
line up (a projection missing or stored another way, groups of other sizes, a slice off the
words or the fp8 blocks) is left to the dense load.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import torch
from infernetes.kernels.reference.wna16 import PackedExperts
from infernetes.runtime.model_executor.layers.fused_moe import EXPERT_PROJECTIONS, FusedMoE
from infernetes.runtime.model_executor.layers.quantization.kept import (
    Fp8BlockWeight,
    Fp8Weight,
    KeptWeight,
)
from infernetes.runtime.model_executor.layers.quantization.packed_int import (
    PackedInt,
    with_common_zeros,
)

logger = logging.getLogger(__name__)

# "model.layers.3.mlp.experts.17.gate_proj" -> ("model.layers.3.mlp", "17", "gate_proj")
_EXPERT_LAYER = re.compile(r"^(.*)\.experts\.(\d+)\.(\w+)$")

# (expert, "w1" | "w3" | "w2") -> (checkpoint layer name, its kept form)
Parts = dict[tuple[int, str], tuple[str, KeptWeight]]


def _stacked(parts: list[PackedInt]) -> PackedExperts | None:
    """The experts' packed weights stacked, or None when their layouts differ."""
    first = parts[0]
    if any(p.bits != first.bits or p.scales.shape != first.scales.shape for p in parts):
        return None
    parts = with_common_zeros(parts)
    zeros = [p.zeros for p in parts if p.zeros is not None]
    return PackedExperts(
        qweight=torch.stack([p.qweight for p in parts]),
        scales=torch.stack([p.scales for p in parts]),
        zeros=torch.stack(zeros) if zeros else None,
        g_idx=torch.stack([p.g_idx for p in parts]),
        bits=first.bits,
    )


def _rank_experts(
    layer: FusedMoE, parts: Parts
) -> tuple[list[KeptWeight], list[KeptWeight]] | None:
    """Per local expert, this rank's (w13, w2) in the experts' kept form, or None."""
    start, size = layer.slice_rank * layer.shard, layer.shard
    outputs = torch.arange(start, start + size)
    w13: list[KeptWeight] = []
    w2: list[KeptWeight] = []
    for expert in range(layer.first_expert, layer.first_expert + layer.num_local_experts):
        found = [parts.get((expert, shard)) for shard in ("w1", "w3", "w2")]
        if any(f is None for f in found):
            return None
        gate, up, down = (f[1] for f in found if f is not None)
        if gate.outputs != size:  # a slice of the intermediate size (tensor parallel)
            gate_slice, up_slice = gate.select_outputs(outputs), up.select_outputs(outputs)
            if gate_slice is None or up_slice is None:
                return None
            gate, up = gate_slice, up_slice
        joined: KeptWeight | None = None
        if isinstance(gate, PackedInt) and isinstance(up, PackedInt):
            joined = PackedInt.concat_outputs([gate, up])
        elif isinstance(gate, Fp8Weight) and isinstance(up, Fp8Weight):
            joined = Fp8Weight.concat_outputs([gate, up])
        elif isinstance(gate, Fp8BlockWeight) and isinstance(up, Fp8BlockWeight):
            joined = Fp8BlockWeight.concat_outputs([gate, up])
        inputs = down if down.inputs == size else down.select_inputs(start, size)
        if joined is None or inputs is None:
            return None
        w13.append(joined)
        w2.append(inputs)
    return w13, w2


def _keep(layer: FusedMoE, w13: list[KeptWeight], w2: list[KeptWeight], device, dtype) -> bool:
    """Install the stacked experts in ``layer``; False when they are not all of one form."""
    packed13 = [p for p in w13 if isinstance(p, PackedInt)]
    packed2 = [p for p in w2 if isinstance(p, PackedInt)]
    if len(packed13) == len(w13) and len(packed2) == len(w2):
        stacked13, stacked2 = _stacked(packed13), _stacked(packed2)
        if stacked13 is None or stacked2 is None:
            return False
        layer.keep_packed(stacked13, stacked2, device, dtype)
        return True
    for form in (Fp8Weight, Fp8BlockWeight):
        fp8_13 = [p for p in w13 if isinstance(p, form)]
        fp8_2 = [p for p in w2 if isinstance(p, form)]
        if len(fp8_13) == len(w13) and len(fp8_2) == len(w2):
            return _keep_fp8(layer, fp8_13, fp8_2, device)
    return False


def _keep_fp8(layer: FusedMoE, w13: list[Any], w2: list[Any], device) -> bool:
    """Install fp8 experts of one form (``Fp8Weight`` or ``Fp8BlockWeight``) stacked."""
    parts = w13 + w2
    if len({p.qweight.dtype for p in parts}) > 1:
        return False
    blocks = {getattr(p, "block", None) for p in parts}
    if len(blocks) > 1:
        return False

    def scales(kept: list[Any]) -> torch.Tensor:
        return torch.stack([p.scale if isinstance(p, Fp8Weight) else p.scale_inv for p in kept])

    layer.keep_fp8(
        torch.stack([p.qweight for p in w13]),
        scales(w13),
        torch.stack([p.qweight for p in w2]),
        scales(w2),
        device,
        blocks.pop(),
    )
    return True


def keep_moe_experts(
    model: Any, kept: dict[str, Any], device: torch.device, dtype: torch.dtype
) -> tuple[set[str], set[str]]:
    """Give each MoE layer its experts' kept form; returns the names of the parameters they
    hold now (loaded with them) and the checkpoint layers taken."""
    rename = getattr(model, "checkpoint_name", lambda name: name)
    by_layer: dict[str, Parts] = {}
    for prefix, form in kept.items():
        match = _EXPERT_LAYER.match(rename(prefix + ".weight").removesuffix(".weight"))
        if match is None:
            continue
        block, expert, projection = match.groups()
        if projection in EXPERT_PROJECTIONS:
            shard = EXPERT_PROJECTIONS[projection]
            by_layer.setdefault(block + ".experts", {})[(int(expert), shard)] = (prefix, form)
    modules = dict(model.named_modules())
    held: set[str] = set()
    taken: set[str] = set()
    for name, parts in by_layer.items():
        layer = modules.get(name)
        if not isinstance(layer, FusedMoE):
            continue
        experts = _rank_experts(layer, parts)
        if experts is None or not _keep(layer, *experts, device, dtype):
            logger.info("%s stays dense: its experts are not stored alike", name)
            continue
        held |= {f"{name}.w13_weight", f"{name}.w2_weight"}
        taken |= {prefix for prefix, _ in parts.values()}
    return held, taken


def dummy_pack_moe_experts(
    model: Any, bits: int, group: int, device: torch.device, dtype: torch.dtype, seed: int
) -> int:
    """Random packed experts for every MoE layer (``--load-format dummy`` of a model whose config
    declares a weight-only integer method: benchmarks of the shape alone). The words are drawn
    on the device: a large MoE has billions of weights."""
    generator = torch.Generator(device=device).manual_seed(seed)
    count = 0
    for module in model.modules():
        if not isinstance(module, FusedMoE):
            continue
        experts, hidden = module.num_local_experts, module.w2_weight.shape[1]
        shapes = ((hidden, 2 * module.shard), (module.shard, hidden))  # (K, N) of w13, w2
        if any(k % (32 // bits) for k, _ in shapes):
            continue
        packed = []
        for k, n in shapes:
            groups = -(-k // group)
            words = torch.randint(
                -(2**31),
                2**31 - 1,
                (experts, k * bits // 32, n),
                generator=generator,
                device=device,
                dtype=torch.int32,
            )
            packed.append(
                PackedExperts(
                    qweight=words,
                    scales=torch.full((experts, groups, n), 1e-3 / 2**bits, device=device),
                    zeros=None,
                    g_idx=(torch.arange(k, device=device, dtype=torch.int32) // group)
                    .expand(experts, k)
                    .contiguous(),
                    bits=bits,
                )
            )
        module.keep_packed(packed[0], packed[1], device, dtype)
        count += 1
    return count
