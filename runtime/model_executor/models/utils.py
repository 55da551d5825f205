"""Weight loading shared by the models: map checkpoint names onto (possibly fused) parameters."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from infernetes.runtime.model_executor.lazy_weight import as_tensor
from torch import nn


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"weight shape {tuple(loaded.shape)} does not fit {tuple(param.shape)}")
    param.data.copy_(as_tensor(loaded))


def load_stacked_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    stacked: Sequence[tuple[str, str, object]],
    skip: tuple[str, ...] = (),
    rename=lambda name: name,
) -> set[str]:
    """Load ``weights`` into ``model``. ``stacked`` lists ``(fused_param, checkpoint_part,
    shard_id)``: a checkpoint tensor whose name contains ``checkpoint_part`` is loaded into the
    fused parameter's slice. Names containing any of ``skip`` are ignored. Returns loaded names."""
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for raw_name, tensor in weights:
        name = rename(raw_name)
        if name is None or any(s in name for s in skip):
            continue
        for fused, part, shard_id in stacked:
            if part in name:
                target = name.replace(part, fused)
                if target in params:
                    param = params[target]
                    param.weight_loader(param, tensor, shard_id)  # type: ignore[attr-defined]  # a loader rides on its parameter, as in vLLM
                    loaded.add(target)
                    break
        else:
            if name not in params:
                raise ValueError(f"checkpoint tensor {raw_name!r} has no matching model parameter")
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
    return loaded
