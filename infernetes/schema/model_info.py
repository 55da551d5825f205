"""Where a model's ``config.json`` is on local disk, and the dtype rule; no torch.

Everything else model-dependent (context length, quantization, scheduler limits) is settled by
the engine's ``resolve_config`` alone, which ``infernetes config`` runs too.
"""

from __future__ import annotations

import os
from pathlib import Path

from infernetes.schema.config import ServeConfig
from infernetes.schema.errors import ConfigError

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
