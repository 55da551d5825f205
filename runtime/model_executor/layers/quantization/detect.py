"""Which quantization method a checkpoint declares, and whether ``--quantization`` agrees."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infernetes.runtime.model_executor.layers.quantization.checkpoint import CheckpointFormat

from infernetes.schema.errors import ConfigError
from infernetes.schema.quantization import GGUF_QUANTIZATION, canonical, settle_quantization


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


# Methods whose tensors the model's own loading reads, by the architectures that do: gpt-oss's
# MXFP4 experts, dequantised by the transformers fallback (models/transformers_fallback.py).
READ_BY_MODEL = {"mxfp4": ("GptOssForCausalLM",)}


def read_by_model(config: dict[str, Any] | None) -> bool:
    return config is not None and canonical(str(config.get("quant_method", ""))) in READ_BY_MODEL


def resolve_quantization(requested: str | None, path: Path, hf_config: Any) -> str | None:
    """The method to load with (`infernetes.schema.quantization.settle_quantization`), once the
    declared variant is known to load. A GGUF file is quantized with ``gguf``, whatever its
    tensors' types, as vLLM reports it."""
    from infernetes.runtime.model_executor.gguf_checkpoint import is_gguf

    if is_gguf(path):
        return settle_quantization(requested, GGUF_QUANTIZATION, str(path))
    config = checkpoint_quant_config(path, hf_config)
    method = settle_quantization(requested, config, str(path))
    if config is None:
        return method
    architectures = getattr(hf_config, "architectures", None) or []
    if method in READ_BY_MODEL:
        if not set(architectures) & set(READ_BY_MODEL[method]):
            raise ConfigError(
                f"{method} checkpoints are read for {', '.join(READ_BY_MODEL[method])} only; "
                f"{path} is {', '.join(architectures) or 'of no architecture'}"
            )
        return method
    if "GPT2LMHeadModel" in (getattr(hf_config, "architectures", None) or []):
        # Its Conv1D weights are stored transposed; the quantized layouts are read as Linear's.
        raise ConfigError(f"pre-quantized GPT-2 checkpoints ({method}) are not supported")
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
        return builders[canonical(str(config.get("quant_method", "")))](config)
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigError(
            f"quantization_config {json.dumps(config, default=str)[:300]} cannot be loaded: {error}"
        ) from error
