"""Dense weights allocated only when a loader first writes to them.

Inside ``dense_weights_on_first_write()`` the layers that support it (linear layers, the MoE
experts) build their weights as ``meta`` tensors; a weight loader asks ``writable`` for the
parameter it writes, which allocates it then on the device and in the dtype the model was built
with. A quantized checkpoint's layers that keep their stored form (layers/quantization/kept.py)
are never written dense, so a model that fits on the device only quantized still loads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

_ON_FIRST_WRITE: ContextVar[bool] = ContextVar("dense_on_first_write", default=False)


@contextmanager
def dense_weights_on_first_write() -> Iterator[None]:
    token = _ON_FIRST_WRITE.set(True)
    try:
        yield
    finally:
        _ON_FIRST_WRITE.reset(token)


def weight_parameter(*shape: int, deferrable: bool = True) -> nn.Parameter:
    """An uninitialised weight, unallocated (``meta``) inside ``dense_weights_on_first_write``
    when ``deferrable``; it remembers the device and dtype it will take."""
    deferred = deferrable and _ON_FIRST_WRITE.get()
    param = nn.Parameter(
        torch.empty(*shape, device="meta" if deferred else None), requires_grad=False
    )
    param.dense_on = (torch.get_default_device(), torch.get_default_dtype())  # type: ignore[attr-defined]  # read by writable()
    return param


def writable(module: nn.Module, name: str, param: nn.Parameter) -> nn.Parameter:
    """``param``, or, when it is ``module.<name>`` left unallocated, that weight allocated now
    (a caller may still hold the unallocated object: the module holds the allocated one)."""
    if not param.is_meta:
        return param
    current = getattr(module, name)
    if current.is_meta:
        device, dtype = current.dense_on
        allocated = nn.Parameter(
            torch.empty(current.shape, device=device, dtype=dtype), requires_grad=False
        )
        allocated.weight_loader = current.weight_loader  # type: ignore[attr-defined]  # a loader rides on its parameter, as in vLLM
        setattr(module, name, allocated)
        current = allocated
    return current
