"""Which implementation the ops run: our Triton kernels or the torch reference.

`--attention-backend` picks it, else `VLLM_ATTENTION_BACKEND`, as in vLLM. We implement two backends:

- `TRITON_ATTN`: the Triton kernels; the default on CUDA. On a CPU it runs only under the Triton
  interpreter (`TRITON_INTERPRET=1`), which is how CI tests the real kernels end to end.
- `TORCH_SDPA`: the torch reference (vectorised, `scaled_dot_product_attention`); the default on CPU.

vLLM's other backend names the schema accepts (FLASH_ATTN, FLASHINFER, XFORMERS) are common in
existing deployments; they get the device's default with a warning, so such a manifest still runs.
The variable is read through the schema (`infernetes.schema.env.read_env`), which rejects names
it does not know. The engine checks the setting at startup (`startup_backend`) and hands the flag
to the ops of its process (`select_backend`), so a backend that cannot run fails before the model
loads, not on the first request.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING

from infernetes.schema.choices import ATTENTION_BACKENDS
from infernetes.schema.env import read_env

if TYPE_CHECKING:  # the API process checks the setting without importing torch
    import torch

logger = logging.getLogger(__name__)

ENV_NAME = "VLLM_ATTENTION_BACKEND"
FLAG = "--attention-backend"
TRITON_ATTN = "TRITON_ATTN"
TORCH_SDPA = "TORCH_SDPA"
BACKENDS = (TRITON_ATTN, TORCH_SDPA)

# Names the schema allows that we do not implement: the device default stands in for them.
_FOREIGN_BACKENDS = frozenset(ATTENTION_BACKENDS) - set(BACKENDS)

# --attention-backend of the engine in this process (None: the variable decides).
_selected: str | None = None


class BackendError(RuntimeError):
    """The requested attention backend cannot run on this device or setup."""


def interpreter_enabled() -> bool:
    """True when Triton runs kernels in its interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def _setting(source: str, value: str) -> str:
    """How the user wrote it: ``VLLM_ATTENTION_BACKEND='X'`` or ``--attention-backend X``."""
    return f"{FLAG} {value}" if source == FLAG else f"{ENV_NAME}={value!r}"


def resolve_backend(requested: str | None, device_type: str, source: str = ENV_NAME) -> str:
    """The backend for a device given the raw setting (None or "" for the default); ``source``
    (``ENV_NAME`` or ``FLAG``) is what the messages name.

    Raises `BackendError`/`ValueError` with the allowed values when the setting cannot be honoured.
    """
    default = TRITON_ATTN if device_type == "cuda" else TORCH_SDPA
    if not requested or requested == "auto":
        return default
    name = requested.strip().upper()
    if name in _FOREIGN_BACKENDS:
        _warn_foreign(_setting(source, name), default)
        return default
    if name not in BACKENDS:
        raise ValueError(
            f"{_setting(source, requested)} is not a known attention backend; "
            f"allowed values: {', '.join(BACKENDS)}"
        )
    if name == TRITON_ATTN and device_type != "cuda" and not interpreter_enabled():
        raise BackendError(
            f"{_setting(source, TRITON_ATTN)} needs a CUDA device; on {device_type} it runs only under the "
            "Triton interpreter: set TRITON_INTERPRET=1 before starting the process, or use "
            f"{_setting(source, TORCH_SDPA)}"
        )
    return name


@cache
def _warn_foreign(setting: str, default: str) -> None:
    logger.warning(
        "%s is a vLLM backend that infernetes does not implement; using %s instead",
        setting,
        default,
    )


def startup_backend(
    flag: str | None, device_type: str, environ: Mapping[str, str] | None = None
) -> str:
    """The backend the ops will use on ``device_type``, checked once at startup: ``flag``
    (``--attention-backend``; None or ``auto`` defers) wins over ``VLLM_ATTENTION_BACKEND``.
    Raises `BackendError`/`ValueError` naming the setting."""
    from_env = read_env(ENV_NAME, environ)
    if flag in (None, "auto"):
        return resolve_backend(from_env, device_type)
    if from_env and from_env != flag:
        logger.warning("%s overrides %s=%s", _setting(FLAG, flag), ENV_NAME, from_env)
    return resolve_backend(flag, device_type, FLAG)


def requested_backend(flag: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The backend asked for (``flag``, else ``VLLM_ATTENTION_BACKEND``), upper-cased; None
    for the device's default."""
    requested = read_env(ENV_NAME, environ) if flag in (None, "auto") else flag
    return None if requested in (None, "", "auto") else requested.strip().upper()


def select_backend(flag: str | None) -> None:
    """Make ``--attention-backend`` (None or ``auto``: leave it to the variable) the choice of
    this process's ops; the engine calls it at startup, after `startup_backend`."""
    global _selected
    _selected = None if flag in (None, "auto") else flag


def attention_backend(device: torch.device | str) -> str:
    """The backend the ops use for tensors on `device`: the selected `--attention-backend`, else
    `VLLM_ATTENTION_BACKEND`, else the device's default."""
    device_type = device.partition(":")[0] if isinstance(device, str) else device.type
    # Every op asks, so the answer is cached on the raw settings it depends on.
    return _resolve_cached(
        _selected, os.environ.get(ENV_NAME), device_type, os.environ.get("TRITON_INTERPRET")
    )


@cache
def _resolve_cached(
    flag: str | None, raw: str | None, device_type: str, _raw_interpret: str | None
) -> str:
    if flag is not None:
        return resolve_backend(flag, device_type, FLAG)
    return resolve_backend(read_env(ENV_NAME, {} if raw is None else {ENV_NAME: raw}), device_type)


def use_triton(device: torch.device | str) -> bool:
    return attention_backend(device) == TRITON_ATTN
