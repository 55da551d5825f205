"""Which implementation the ops run: our Triton kernels or the torch reference.

`VLLM_ATTENTION_BACKEND` picks it, as in vLLM. We implement two backends:

- `TRITON_ATTN`: the Triton kernels; the default on CUDA. On a CPU it runs only under the Triton
  interpreter (`TRITON_INTERPRET=1`), which is how CI tests the real kernels end to end.
- `TORCH_SDPA`: the torch reference (vectorised, `scaled_dot_product_attention`); the default on CPU.

vLLM's other backend names the schema accepts (FLASH_ATTN, FLASHINFER, XFORMERS) are common in
existing deployments; they get the device's default with a warning, so such a manifest still runs.
The variable is read through the schema (`infernetes.schema.env.read_env`), which rejects names
it does not know.
"""

from __future__ import annotations

import logging
import os
from functools import cache

import torch

from infernetes.schema.choices import ATTENTION_BACKENDS
from infernetes.schema.env import read_env

logger = logging.getLogger(__name__)

ENV_NAME = "VLLM_ATTENTION_BACKEND"
TRITON_ATTN = "TRITON_ATTN"
TORCH_SDPA = "TORCH_SDPA"
BACKENDS = (TRITON_ATTN, TORCH_SDPA)

# Names the schema allows that we do not implement: the device default stands in for them.
_FOREIGN_BACKENDS = frozenset(ATTENTION_BACKENDS) - set(BACKENDS)


class BackendError(RuntimeError):
    """The requested attention backend cannot run on this device or setup."""


def interpreter_enabled() -> bool:
    """True when Triton runs kernels in its interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def resolve_backend(requested: str | None, device_type: str) -> str:
    """The backend for a device given the raw setting (None or "" for the default).

    Raises `BackendError`/`ValueError` with the allowed values when the setting cannot be honoured.
    """
    default = TRITON_ATTN if device_type == "cuda" else TORCH_SDPA
    if not requested:
        return default
    name = requested.strip().upper()
    if name in _FOREIGN_BACKENDS:
        _warn_foreign(name, default)
        return default
    if name not in BACKENDS:
        raise ValueError(
            f"{ENV_NAME}={requested!r} is not a known attention backend; "
            f"allowed values: {', '.join(BACKENDS)}"
        )
    if name == TRITON_ATTN and device_type != "cuda" and not interpreter_enabled():
        raise BackendError(
            f"{ENV_NAME}=TRITON_ATTN needs a CUDA device; on {device_type} it runs only under the "
            "Triton interpreter: set TRITON_INTERPRET=1 before starting the process, or use "
            f"{ENV_NAME}=TORCH_SDPA"
        )
    return name


@cache
def _warn_foreign(name: str, default: str) -> None:
    logger.warning(
        "%s=%s is a vLLM backend that infernetes does not implement; using %s instead",
        ENV_NAME,
        name,
        default,
    )


def attention_backend(device: torch.device | str) -> str:
    """The backend the ops use for tensors on `device`, from `VLLM_ATTENTION_BACKEND`."""
    device_type = device.type if isinstance(device, torch.device) else torch.device(device).type
    # Every op asks, so the answer is cached on the raw settings it depends on.
    return _resolve_cached(os.environ.get(ENV_NAME), device_type, os.environ.get("TRITON_INTERPRET"))


@cache
def _resolve_cached(raw: str | None, device_type: str, _raw_interpret: str | None) -> str:
    return resolve_backend(read_env(ENV_NAME, {} if raw is None else {ENV_NAME: raw}), device_type)


def use_triton(device: torch.device | str) -> bool:
    return attention_backend(device) == TRITON_ATTN
