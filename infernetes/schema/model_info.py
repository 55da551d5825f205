"""Model-dependent defaults (context length, dtype) read from the model's local ``config.json``.

Only files already on disk are read: a local model folder or the Hugging Face cache. When none is
readable the values stay unresolved (``None`` / ``"auto"``) for the runtime to settle.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from infernetes.schema.config import ServeConfig
from infernetes.schema.env import read_env
from infernetes.schema.errors import ConfigError

# The config keys different model families use for their context length; vLLM takes the smallest.
_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
    "model_max_length",
)
# RoPE scaling types whose factor stretches the usable context.
_STRETCHING_ROPE = ("linear", "dynamic", "yarn")
_AUTO_DTYPE = {
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "float32": "float16",
    "float": "float16",
}


def find_config_json(config: ServeConfig, environ: dict[str, str] | None = None) -> Path | None:
    """The model's config.json when it is on local disk, else None."""
    environ = dict(os.environ) if environ is None else environ
    name = config.hf_config_path or config.model
    local = Path(name).expanduser()
    if local.is_dir():
        candidate = local / "config.json"
        return candidate if candidate.is_file() else None
    if local.is_file() and local.name.endswith(".json"):
        return local
    for cache in _cache_dirs(config, environ):
        repo = cache / ("models--" + name.replace("/", "--"))
        revision = config.revision or _read(repo / "refs" / "main")
        if revision:
            candidate = repo / "snapshots" / revision.strip() / "config.json"
            if candidate.is_file():
                return candidate
    return None


def _cache_dirs(config: ServeConfig, environ: dict[str, str]) -> list[Path]:
    dirs = []
    if config.download_dir:
        dirs.append(Path(config.download_dir).expanduser())
    if environ.get("HF_HUB_CACHE"):
        dirs.append(Path(environ["HF_HUB_CACHE"]).expanduser())
    home = environ.get("HF_HOME") or os.path.join(
        environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    dirs.append(Path(home).expanduser() / "hub")
    return dirs


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def derived_max_model_len(hf_config: dict[str, Any]) -> int | None:
    """The context length a HF config allows (nested text_config for multimodal models)."""
    nested = hf_config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else hf_config
    lengths = [text[key] for key in _LENGTH_KEYS if isinstance(text.get(key), int)]
    if not lengths:
        return None
    length = min(lengths)
    scaling = text.get("rope_scaling") or {}
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind in _STRETCHING_ROPE and isinstance(scaling.get("factor"), int | float):
        length = int(length * scaling["factor"])
    return length


def resolve_model_defaults(
    config: ServeConfig, environ: dict[str, str] | None = None
) -> ServeConfig:
    """Fills ``max_model_len`` and ``dtype`` from the local config.json when there is one.

    Raises ConfigError when ``--max-model-len`` exceeds what the model allows (unless
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is set), as vLLM does.
    """
    environ = dict(os.environ) if environ is None else environ
    path = find_config_json(config, environ)
    text = _read(path) if path else None
    if text is None:
        return config
    try:
        hf_config = {**json.loads(text), **config.hf_overrides}
    except (json.JSONDecodeError, TypeError):
        return config
    changes: dict[str, Any] = {}
    allowed = derived_max_model_len(hf_config)
    if config.max_model_len is None:
        if allowed is not None:
            changes["max_model_len"] = allowed
    elif (
        allowed is not None
        and config.max_model_len > allowed
        and not read_env("VLLM_ALLOW_LONG_MAX_MODEL_LEN", environ)
    ):
        raise ConfigError(
            f"argument --max-model-len: {config.max_model_len} is longer than the model allows ({allowed}, "
            "from its config.json); set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 to force it",
            "max_model_len",
        )
    if config.dtype == "auto":
        model_dtype = hf_config.get("torch_dtype") or hf_config.get("dtype")
        if model_dtype in _AUTO_DTYPE:
            changes["dtype"] = _AUTO_DTYPE[model_dtype]
    return config.replace(**changes) if changes else config
