"""The sampling defaults a request starts from: the model's ``generation_config.json`` (per
``--generation-config``) under ``--override-generation-config``. vLLM takes only these fields from
it; an override naming another field is refused (it would silently do nothing)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Generation-config fields that become sampling defaults, and their SamplingParams names.
GENERATION_FIELDS = {
    "repetition_penalty": "repetition_penalty",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "max_new_tokens": "max_tokens",
}


def read_generation_config(choice: str | None, model_path: Path) -> dict[str, Any]:
    """generation_config.json per ``--generation-config``: ``auto`` (the model's folder),
    ``vllm`` (none) or a folder."""
    if choice == "vllm":
        return {}
    folder = model_path if choice in (None, "auto") else Path(choice)
    try:
        loaded = json.loads((folder / "generation_config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def check_generation_overrides(overrides: Mapping[str, Any] | None) -> None:
    """Raises ValueError naming an ``--override-generation-config`` key that is not taken."""
    for key in overrides or {}:
        if key not in GENERATION_FIELDS and key not in GENERATION_FIELDS.values():
            raise ValueError(
                f"override_generation_config key {key!r} is not supported; allowed: "
                f"{', '.join(sorted(GENERATION_FIELDS))}"
            )


def sampling_defaults(
    generation: Mapping[str, Any], overrides: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The SamplingParams fields a request gets unless it sets them."""
    check_generation_overrides(overrides)
    defaults = {
        name: generation[key]
        for key, name in GENERATION_FIELDS.items()
        if generation.get(key) is not None
    }
    for key, value in (overrides or {}).items():
        defaults[GENERATION_FIELDS.get(key, key)] = value
    if defaults:
        logger.info("Default sampling parameters from the generation config: %s", defaults)
    return defaults
