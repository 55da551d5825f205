"""LoRARequest: which adapter a request runs with (vLLM's type and field names)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """An adapter by name and its folder (or hub id). ``lora_int_id`` is unique per loaded
    adapter (> 0): the workers' caches and the prefix-cache hashes key on it, so an adapter
    unloaded and loaded again under the same name gets a new id and never meets stale state."""

    lora_name: str
    lora_int_id: int
    lora_path: str
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be at least 1, got {self.lora_int_id}")
