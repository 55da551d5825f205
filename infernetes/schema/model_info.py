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
from infernetes.schema.quantization import settle_quantization

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
# --dtype spellings and the dtype each names.
DTYPE_NAMES = {
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
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
    if text.get("model_type") in ("roberta", "xlm-roberta"):
        length -= int(text.get("pad_token_id") or 0) + 1  # positions start after the padding index
    scaling = text.get("rope_scaling") or {}
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind in _STRETCHING_ROPE and isinstance(scaling.get("factor"), int | float):
        length = int(length * scaling["factor"])
    return length


def _quantization_config(hf_config: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """config.json's ``quantization_config``, else an older GPTQ's ``quantize_config.json``."""
    declared = hf_config.get("quantization_config")
    if isinstance(declared, dict):
        return declared
    legacy = _read(path.parent / "quantize_config.json")
    try:
        return {"quant_method": "gptq", **json.loads(legacy)} if legacy else None
    except (json.JSONDecodeError, TypeError):
        return None


def resolve_model_defaults(
    config: ServeConfig,
    environ: dict[str, str] | None = None,
    host: tuple[str, bool] | None = None,
) -> ServeConfig:
    """Fills ``max_model_len`` from the local config.json when there is one, and ``dtype`` too
    when ``host`` (the device type the engine would use and whether its CPU computes bf16
    natively) is given: the dtype the engine resolves, by ``resolve_dtype_name``.

    Raises ConfigError when ``--max-model-len`` exceeds what the model allows (unless
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is set), as vLLM does, or when ``--quantization``
    contradicts the checkpoint's ``quantization_config`` (which fills it when unset).
    """
    environ = dict(os.environ) if environ is None else environ
    path = find_config_json(config, environ)
    text = _read(path) if path else None
    if path is None or text is None:
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
    quantization = settle_quantization(
        config.quantization, _quantization_config(hf_config, path), str(path.parent)
    )
    if quantization != config.quantization:
        changes["quantization"] = quantization
    if host is not None:
        model_dtype = hf_config.get("torch_dtype") or hf_config.get("dtype")
        device_type, cpu_fast_bf16 = host
        changes["dtype"] = resolve_dtype_name(config.dtype, model_dtype, device_type, cpu_fast_bf16)
    return config.replace(**changes) if changes else config


def resolve_dtype_name(
    requested: str, model_dtype: str | None, device_type: str, cpu_fast_bf16: bool
) -> str:
    """The dtype the engine runs in (``float16``, ``bfloat16`` or ``float32``): the one rule that
    ``serve`` (the model loader) and ``config`` both apply. vLLM's rules for ``auto``: on a GPU,
    bf16/fp16 models keep their dtype and fp32 models run in fp16; on a CPU everything runs in
    bf16 (vLLM's CPU default) when the CPU computes bf16 natively, else in fp32 (there are no
    fast fp16 CPU kernels). Raises ConfigError for a name that is not a dtype."""
    if requested != "auto":
        if requested not in DTYPE_NAMES:
            raise ConfigError(
                f"argument --dtype must be one of auto, {', '.join(DTYPE_NAMES)}; "
                f"got {requested!r}",
                "dtype",
            )
        return DTYPE_NAMES[requested]
    if device_type == "cpu":
        return "bfloat16" if cpu_fast_bf16 else "float32"
    model = DTYPE_NAMES.get(str(model_dtype).removeprefix("torch."), "float32")
    return "float16" if model == "float32" else model
