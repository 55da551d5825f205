"""Which quantization method a checkpoint declares and whether ``--quantization`` agrees: plain
data over its ``quantization_config`` (no torch), shared by ``infernetes config`` and the engine
(`infernetes.runtime.model_executor.layers.quantization`, which also reads the tensors)."""

from __future__ import annotations

from typing import Any

from infernetes.schema.errors import ConfigError

# vLLM's names for kernels of the same on-disk format map onto the format.
ALIASES = {"gptq_marlin": "gptq", "awq_marlin": "awq", "compressed_tensors": "compressed-tensors"}
CHECKPOINT_METHODS = ("awq", "compressed-tensors", "fp8", "gguf", "gptq", "mxfp4")
# What a GGUF file declares: its blocks carry their own types, so it has no quantization_config.
GGUF_QUANTIZATION = {"quant_method": "gguf"}


def canonical(name: str) -> str:
    name = name.lower()
    return ALIASES.get(name, name)


def settle_quantization(
    requested: str | None, checkpoint_config: dict[str, Any] | None, where: str
) -> str | None:
    """The method to load the checkpoint at ``where`` with: its own, which ``requested`` may name
    (or an alias of); ``fp8`` alone quantises an unquantised checkpoint online. Raises
    ConfigError naming ``--quantization`` when the two disagree or the method is not supported."""
    wanted = canonical(requested) if requested else None
    if checkpoint_config is None:
        if wanted in (None, "fp8"):
            return wanted
        if wanted == "gguf":
            raise ConfigError(
                f"--quantization gguf needs a GGUF file as the model (a .gguf file, or a folder "
                f"holding one with --load-format gguf); {where} is not one",
                "quantization",
            )
        raise ConfigError(
            f"--quantization {requested} needs a checkpoint quantized with {wanted}, but {where} "
            "has no quantization_config in its config.json (only fp8 quantises an unquantised "
            "checkpoint online)",
            "quantization",
        )
    method = canonical(str(checkpoint_config.get("quant_method", "")))
    if method not in CHECKPOINT_METHODS:
        raise ConfigError(
            f"the checkpoint in {where} is quantized with {method or 'an unnamed method'!r} "
            f"(quantization_config.quant_method), which is not supported; supported: "
            f"{', '.join(CHECKPOINT_METHODS)}",
            "quantization",
        )
    if wanted is not None and wanted != method:
        raise ConfigError(
            f"--quantization {requested} contradicts the checkpoint in {where}, quantized with "
            f"{method} (quantization_config.quant_method); pass --quantization {method} or leave "
            "it unset",
            "quantization",
        )
    return method
