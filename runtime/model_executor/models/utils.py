"""Shared by the models: weight loading (checkpoint names onto possibly fused parameters) and
the pieces of a pipeline stage (which layers this rank holds, what it passes on)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from infernetes.runtime.model_executor import parallel
from infernetes.runtime.model_executor.layers.embedding import ParallelLMHead
from infernetes.runtime.model_executor.lazy_weight import as_tensor
from infernetes.runtime.model_executor.sliding_window import sliding_window
from torch import nn
from transformers import PretrainedConfig

# What one pipeline stage hands the next: the hidden states (and the residual, for models that
# carry it between layers), by name.
IntermediateTensors = dict[str, torch.Tensor]


class PPMissingLayer(nn.Identity):
    """A module another pipeline stage holds; its checkpoint tensors are skipped here."""


def stage_layers(
    num_layers: int, build: Callable[[int], nn.Module]
) -> tuple[int, int, nn.ModuleList]:
    """``(start, end, layers)``: this stage's layers built, the others ``PPMissingLayer``s, so
    the checkpoint's layer numbers still name the right module."""
    start, end = parallel.pp_layer_range(num_layers)
    layers = nn.ModuleList(
        build(i) if start <= i < end else PPMissingLayer() for i in range(num_layers)
    )
    return start, end, layers


def on_first_stage(build: Callable[[], nn.Module]) -> nn.Module:
    """The module built on the first pipeline stage, a ``PPMissingLayer`` elsewhere."""
    return build() if parallel.state().is_first_stage else PPMissingLayer()


def on_last_stage(build: Callable[[], nn.Module]) -> nn.Module:
    return build() if parallel.state().is_last_stage else PPMissingLayer()


def tie_on_this_stage(lm_head: nn.Module, embedding: nn.Module) -> bool:
    """Tie the LM head to the token embedding when this stage holds both; whether it did (a
    stage holding only the head loads the embedding's checkpoint tensor into it instead)."""
    if isinstance(lm_head, PPMissingLayer) or isinstance(embedding, PPMissingLayer):
        return False
    assert isinstance(lm_head, ParallelLMHead)
    lm_head.tie(embedding)
    return True


def layer_sliding_window(config: PretrainedConfig, layer: int) -> int | None:
    """The attention window of decoder layer ``layer``: the config's ``sliding_window`` for the
    layers its ``layer_types`` mark ``sliding_attention`` (every layer when it has no
    ``layer_types``), else None (full attention)."""
    window = sliding_window(config)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and layer_types[layer] != "sliding_attention"):
        return None
    return window


def missing_prefixes(model: nn.Module) -> tuple[str, ...]:
    return tuple(
        name + "." for name, module in model.named_modules() if isinstance(module, PPMissingLayer)
    )


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
    elsewhere = missing_prefixes(model)  # held by other pipeline stages
    loaded: set[str] = set()
    for raw_name, tensor in weights:
        name = rename(raw_name)
        if name is None or any(s in name for s in skip) or name.startswith(elsewhere):
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
