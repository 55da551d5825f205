"""Which quantization method a checkpoint declares, and whether ``--quantization`` agrees."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infernetes.runtime.model_executor.layers.quantization.checkpoint import CheckpointFormat

from infernetes.schema.errors import ConfigError

# vLLM's names for kernels of the same on-disk format map onto the format.
ALIASES = {"gptq_marlin": "gptq", "awq_marlin": "awq", "compressed_tensors": "compressed-tensors"}
CHECKPOINT_METHODS = ("awq", "compressed-tensors", "fp8", "gptq")


def checkpoint_quant_config(path: Path, hf_config: Any) -> dict[str, Any] | None:
    """``quantization_config`` of config.json, else an older GPTQ checkpoint's
    ``quantize_config.json`` (which names no method: GPTQ is the one that wrote it)."""
    config = getattr(hf_config, "quantization_config", None)
    if config is not None:
        return dict(config if isinstance(config, dict) else config.to_dict())
    legacy = path / "quantize_config.json"
    if path.is_dir() and legacy.is_file():
        try:
            data = json.loads(legacy.read_text())
        except json.JSONDecodeError as error:
            raise ConfigError(f"{legacy} is not valid JSON: {error}") from error
        return {"quant_method": "gptq", **data}
    return None


def _method(config: dict[str, Any]) -> str:
    name = str(config.get("quant_method", "")).lower()
    return ALIASES.get(name, name)


def resolve_quantization(requested: str | None, path: Path, hf_config: Any) -> str | None:
    """The method to load with: the checkpoint's, which ``requested`` may name (or an alias of);
    ``fp8`` alone quantises an unquantised checkpoint online. Raises ConfigError naming
    ``--quantization`` when the two disagree or the method is not supported."""
    config = checkpoint_quant_config(path, hf_config)
    wanted = ALIASES.get(requested, requested) if requested else None
    if config is None:
        if wanted in (None, "fp8"):
            return wanted
        raise ConfigError(
            f"--quantization {requested} needs a checkpoint quantized with {wanted}, but {path} "
            "has no quantization_config in its config.json (only fp8 quantises an unquantised "
            "checkpoint online)"
        )
    method = _method(config)
    if method not in CHECKPOINT_METHODS:
        raise ConfigError(
            f"the checkpoint in {path} is quantized with {method or 'an unnamed method'!r} "
            f"(quantization_config.quant_method), which is not supported; supported: "
            f"{', '.join(CHECKPOINT_METHODS)}"
        )
    if wanted is not None and wanted != method:
        raise ConfigError(
            f"--quantization {requested} contradicts the checkpoint in {path}, quantized with "
            f"{method} (quantization_config.quant_method); pass --quantization {method} or leave "
            "it unset"
        )
    checkpoint_format(config)  # a declared variant we cannot load is refused now, not at load
    return method


def checkpoint_format(config: dict[str, Any]) -> CheckpointFormat:
    """The loader of the checkpoint's declared method and settings."""
    from infernetes.runtime.model_executor.layers.quantization import (
        awq,
        compressed_tensors,
        fp8,
        gptq,
    )

    builders: dict[str, Callable[[dict[str, Any]], CheckpointFormat]] = {
        "awq": awq.AWQFormat,
        "compressed-tensors": compressed_tensors.CompressedTensorsFormat,
        "fp8": fp8.Fp8Format,
        "gptq": gptq.GPTQFormat,
    }
    try:
        return builders[_method(config)](config)
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigError(
            f"quantization_config {json.dumps(config, default=str)[:300]} cannot be loaded: {error}"
        ) from error
