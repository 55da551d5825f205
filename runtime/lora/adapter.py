"""PEFT adapters on disk: ``adapter_config.json`` plus ``adapter_model.safetensors`` (or ``.bin``).

What is served: LoRA (``peft_type`` LORA) on linear projections, ``lora_alpha / r`` scaling or
``lora_alpha / sqrt(r)`` with ``use_rslora``, rank up to ``--max-lora-rank``. What PEFT can
also write but is not served here is refused naming the field: DoRA, trained biases, extra
trained modules (``modules_to_save``), per-module ranks (``rank_pattern`` / ``alpha_pattern``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from infernetes.runtime.model_executor.loader import ModelLoadError, resolve_model_path

ADAPTER_FILES = ["adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"]
# base_model.model.<module>.lora_A.weight (an older PEFT keeps the adapter name: lora_A.default)
_TENSOR_NAME = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")


class LoRAAdapterError(ValueError):
    """An adapter that cannot be served; the message names the adapter and the reason."""


@dataclass(frozen=True)
class AdapterConfig:
    rank: int
    alpha: float
    use_rslora: bool

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


# (the config field, the value that means "not used", what PEFT feature it is)
_UNSUPPORTED: tuple[tuple[str, Any, str], ...] = (
    ("use_dora", False, "DoRA adapters"),
    ("bias", "none", "trained biases (bias != 'none')"),
    ("modules_to_save", None, "extra trained modules (modules_to_save)"),
    ("rank_pattern", {}, "per-module ranks (rank_pattern)"),
    ("alpha_pattern", {}, "per-module alphas (alpha_pattern)"),
    ("fan_in_fan_out", False, "transposed (fan_in_fan_out) weights"),
    ("lora_bias", False, "trained lora_B biases (lora_bias)"),
    ("target_parameters", None, "LoRA on parameters (target_parameters)"),
    ("layer_replication", None, "replicated layers (layer_replication)"),
)


def adapter_folder(path: str) -> Path:
    """The adapter's local folder: ``path`` itself, or a hub snapshot of its adapter files."""
    try:
        folder = resolve_model_path(path, allow_patterns=ADAPTER_FILES)
    except ModelLoadError as error:
        raise LoRAAdapterError(f"LoRA adapter path {path!r} cannot be read: {error}") from error
    if not (folder / "adapter_config.json").is_file():
        raise LoRAAdapterError(
            f"LoRA adapter path {path!r} has no adapter_config.json (a PEFT adapter folder is "
            "expected)"
        )
    return folder


def read_adapter_config(folder: Path, max_rank: int) -> AdapterConfig:
    try:
        raw = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise LoRAAdapterError(f"{folder}/adapter_config.json cannot be read: {error}") from error
    peft_type = raw.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise LoRAAdapterError(f"{folder}: peft_type {peft_type!r} is not served; only 'LORA'")
    for key, unused, what in _UNSUPPORTED:
        value = raw.get(key)
        if value not in (None, unused, []):  # peft writes target_parameters=[] for MoE models
            raise LoRAAdapterError(f"{folder}: {what} are not supported ({key}={raw[key]!r})")
    rank = raw.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise LoRAAdapterError(f"{folder}: adapter_config.json needs a positive integer 'r'")
    if rank > max_rank:
        raise LoRAAdapterError(
            f"LoRA rank {rank} of {folder} is greater than --max-lora-rank {max_rank}; start "
            "the server with a larger --max-lora-rank"
        )
    alpha = raw.get("lora_alpha", 8)
    return AdapterConfig(rank, float(alpha), bool(raw.get("use_rslora", False)))


def read_adapter_weights(folder: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{module path: (A [r, in], B [out, r])}``, module paths as the model names them
    (``model.layers.0.self_attn.q_proj``)."""
    safetensors_file = folder / "adapter_model.safetensors"
    if safetensors_file.is_file():
        from safetensors.torch import load_file

        tensors = load_file(str(safetensors_file))
    elif (folder / "adapter_model.bin").is_file():
        tensors = torch.load(folder / "adapter_model.bin", map_location="cpu", weights_only=True)
    else:
        raise LoRAAdapterError(f"{folder} has no adapter_model.safetensors or adapter_model.bin")
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        match = _TENSOR_NAME.match(name)
        if match is None:
            raise LoRAAdapterError(
                f"{folder}: tensor {name!r} is not a LoRA A/B weight of a linear layer (LoRA "
                "on embeddings and extra trained modules are not supported)"
            )
        halves.setdefault(match[1], {})[match[2]] = tensor
    weights = {}
    for module, pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise LoRAAdapterError(f"{folder}: module {module!r} lacks its lora_A or lora_B")
        weights[module] = (pair["A"], pair["B"])
    if not weights:
        raise LoRAAdapterError(f"{folder}: the adapter holds no LoRA weights")
    return weights
