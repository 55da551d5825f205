"""``-O`` / ``--compilation-config``: which torch.compile the model forward gets.

vLLM's levels: 0 no compilation, 1 torch.compile as is, 2 traced once, 3 piecewise with its own
passes (the production setting). Here every level above 0 compiles the model forward with
torch.compile (dynamic batch dimension; inductor by default), on CUDA, split at the attention
layers, which run uncompiled between the compiled pieces. On the CPU inductor's
compile time outweighs its gain for this engine, so levels above 0 run eagerly there, with a log
line saying so, unless ``compilation_config.backend`` names a backend explicitly.
``cudagraph_capture_sizes``, ``max_capture_size`` (``max_cudagraph_capture_size`` in newer vLLM),
``use_cudagraph`` and ``cudagraph_mode`` steer the decode CUDA graphs (``cuda_graph.py``). Keys
vLLM knows that have no effect here are logged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from infernetes.runtime.model_executor.models.interfaces import ModelForward, ServableModel

from infernetes.schema.errors import check_json_keys

logger = logging.getLogger(__name__)

LEVELS = {
    0: "no compilation",
    1: "torch.compile",
    2: "torch.compile, traced once",
    3: "piecewise compile",
}
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
_HONOURED = {
    "level",
    "mode",
    "backend",
    "use_inductor",
    "use_cudagraph",
    "cudagraph_mode",
    "cudagraph_capture_sizes",
    "max_capture_size",
    "max_cudagraph_capture_size",  # vLLM's newer name of max_capture_size
}
# vLLM's other fields: accepted (a manifest written for vLLM still runs) but they change nothing here.
_IGNORED = {
    "debug_dump_path",
    "cache_dir",
    "custom_ops",
    "splitting_ops",
    "compile_sizes",
    "inductor_compile_config",
    "inductor_passes",
    "cudagraph_num_of_warmups",
    "cudagraph_copy_inputs",
    "full_cuda_graph",
    "local_cache_dir",
    "pass_config",
    "use_inductor_graph_partition",
    "cudagraph_specialize_lora",
    "compile_cache_save_format",
}


@dataclass(frozen=True)
class CompilationSettings:
    level: int = 0
    backend: str | None = None  # a torch.compile backend; None: inductor (CUDA only)
    use_cudagraph: bool = True
    capture_sizes: tuple[int, ...] | None = None
    max_capture_size: int | None = None


def _int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"compilation_config.{key} must be an integer; got {value!r}")
    return value


def parse_compilation_config(value: Mapping[str, Any] | None) -> CompilationSettings:
    """Validate ``--compilation-config`` (a JSON object; ``-O3`` arrives as ``{"level": 3}``)."""
    value = dict(value or {})
    check_json_keys("compilation_config", value, _HONOURED | _IGNORED)
    ignored = sorted(k for k in set(value) & _IGNORED if value[k] not in (None, "", [], {}, False))
    if ignored:
        logger.warning("compilation_config: %s have no effect in this engine", ", ".join(ignored))
    level = _int(value.get("level", value.get("mode", 0)) or 0, "level")
    if level not in LEVELS:
        raise ValueError(f"compilation_config.level (-O) must be one of 0, 1, 2, 3; got {level}")
    backend = value.get("backend") or None
    if backend is not None and not isinstance(backend, str):
        raise ValueError(
            f"compilation_config.backend must be a torch.compile backend name; got {backend!r}"
        )
    if backend is None and value.get("use_inductor") is False:
        backend = "eager"  # dynamo without inductor
    if backend is not None and backend not in torch._dynamo.list_backends(exclude_tags=()):
        raise ValueError(
            f"compilation_config.backend {backend!r} is not a torch.compile backend; allowed: "
            f"{', '.join(torch._dynamo.list_backends(exclude_tags=()))}"
        )
    mode = str(value.get("cudagraph_mode") or "FULL_DECODE_ONLY").upper()
    if mode not in CUDAGRAPH_MODES:
        raise ValueError(
            f"compilation_config.cudagraph_mode must be one of {', '.join(CUDAGRAPH_MODES)}; got {mode!r}"
        )
    if mode not in ("NONE", "FULL_DECODE_ONLY"):
        logger.info(
            "compilation_config.cudagraph_mode %s: this engine captures full graphs of decode steps only",
            mode,
        )
    sizes = value.get("cudagraph_capture_sizes")
    if sizes is not None:
        if not isinstance(sizes, list):
            raise ValueError(
                f"compilation_config.cudagraph_capture_sizes must be a list of integers; got {sizes!r}"
            )
        sizes = tuple(_int(s, "cudagraph_capture_sizes") for s in sizes)
    max_size = value.get("max_cudagraph_capture_size", value.get("max_capture_size"))
    return CompilationSettings(
        level=level,
        backend=backend,
        use_cudagraph=bool(value.get("use_cudagraph", True)) and mode != "NONE",
        capture_sizes=sizes,
        max_capture_size=None if max_size is None else _int(max_size, "max_capture_size"),
    )


def compile_forward(
    model: ServableModel, settings: CompilationSettings, device: torch.device
) -> ModelForward:
    """The callable that runs the model forward ``(input_ids, positions) -> hidden``."""
    if settings.level == 0:
        return model
    if getattr(model, "eager_only", False):
        logger.info("compilation level %d is not applied: this model runs eagerly", settings.level)
        return model
    if device.type != "cuda" and settings.backend is None:
        logger.info(
            "compilation level %d (%s) is not applied on %s: inductor's compile time outweighs its "
            "gain there; the model runs eagerly (set compilation_config.backend to compile anyway)",
            settings.level,
            LEVELS[settings.level],
            device.type,
        )
        return model
    backend = settings.backend or "inductor"
    # Attention stays out of the traced graphs (as in vLLM's piecewise split): it reads the step's
    # metadata, which changes every step, and its kernels launch by themselves.
    from infernetes.runtime.model_executor.layers.attention import Attention

    for module in model.modules():
        if isinstance(module, Attention):
            module.forward = torch.compiler.disable(module.forward, recursive=True)  # type: ignore[method-assign]  # runs eagerly between the compiled pieces
    logger.info(
        "compilation level %d: the model forward runs through torch.compile (backend %s, dynamic "
        "batch size)%s; each new shape compiles on its first step",
        settings.level,
        backend,
        " as one graph (vLLM's piecewise split is not used)" if settings.level == 3 else "",
    )
    return torch.compile(model, backend=backend, dynamic=True)


__all__ = ["LEVELS", "CompilationSettings", "compile_forward", "parse_compilation_config"]
