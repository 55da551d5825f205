"""Linear layers split for tensor parallelism, as in nano-vllm.

Column-parallel layers split the output features, row-parallel ones the input features and sum the
partial results. Fused layers (QKV, gate+up) load several checkpoint tensors into one weight; each
parameter carries a ``weight_loader(param, loaded, shard_id=None)`` that knows where its slice goes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from infernetes.kernels import ops
from infernetes.kernels.cpu import packed_linear, skinny_linear
from infernetes.runtime.model_executor.layers.deferred_weights import weight_parameter, writable
from infernetes.runtime.model_executor.lazy_weight import as_tensor
from infernetes.runtime.model_executor.parallel import all_reduce, tp_rank, tp_size
from torch import nn


def _divide(numerator: int, denominator: int, what: str = "the layer size") -> int:
    if numerator % denominator:
        raise ValueError(
            f"{what} ({numerator}) is not divisible by the tensor-parallel size ({denominator})"
        )
    return numerator // denominator


class LinearBase(nn.Module):
    # A layer whose weight is read as a plain tensor (not only multiplied): a quantized
    # checkpoint's stored form is dequantised into it, never kept.
    reads_dense_weight: ClassVar[bool] = False

    def __init__(self, input_size: int, output_size: int, bias: bool, tp_dim: int | None) -> None:
        super().__init__()
        self.tp_dim = tp_dim
        self.tp_rank = tp_rank()
        self.tp_size = tp_size()
        self.input_size, self.output_size = input_size, output_size  # this rank's share
        self.weight = weight_parameter(
            output_size, input_size, deferrable=not self.reads_dense_weight
        )
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # a loader rides on its parameter, as in vLLM
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]  # a loader rides on its parameter, as in vLLM
        else:
            self.register_parameter("bias", None)
        self.packed_weight: torch.Tensor | None = None
        # A quantized weight's own matmul (layers/quantization/packed_int.py), set after loading.
        self.quant_method: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor] | None = None

    def _writable(self, param: nn.Parameter) -> nn.Parameter:
        return writable(self, "weight", param)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        param = self._writable(param)
        if self.tp_dim is not None and param.dim() > self.tp_dim and self.tp_size > 1:
            size = param.shape[self.tp_dim]
            loaded = loaded.narrow(self.tp_dim, self.tp_rank * size, size)
        param.data.copy_(as_tensor(loaded))

    def quantize_fp8(self) -> None:
        """Online fp8 quantisation (``--quantization fp8``): the weight is stored in fp8 with a
        per-tensor scale and the kernels' ``fp8_linear`` multiplies with it."""
        qweight, scale = ops.quantize_weight_fp8(self.weight.data)
        self.weight = nn.Parameter(qweight, requires_grad=False)
        self.weight_scale = nn.Parameter(scale.reshape(1).float(), requires_grad=False)

    def pack_for_cpu(self) -> None:
        """Pack a loaded CPU bf16/fp16 weight for oneDNN once (see kernels/cpu/packed_linear.py);
        the plain copy is dropped so the weights are not held twice. (oneDNN's packed bf16
        product of one row spreads over the threads and reads as fast as skinny_linear's, so a
        plain copy for decode would cost memory and gain nothing: bench/cpu_gemv.py.)"""
        packed = packed_linear.pack_weight(self.weight.data)
        if packed is not None:
            self.packed_weight = packed
            self.weight.data = self.weight.data.new_empty(0)

    def _matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.quant_method is not None:
            return self.quant_method(x, bias)
        if skinny_linear.handles(x, self.weight):
            return skinny_linear.linear(x, self.weight, bias)
        if self.packed_weight is not None:
            return packed_linear.linear(x, self.packed_weight, bias)
        if self.weight.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            return ops.fp8_linear(x, self.weight, self.weight_scale, bias)
        if packed_linear.reorders_float32(x, self.weight):
            return packed_linear.linear_float32(x, self.weight, bias)
        return F.linear(x, self.weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._matmul(x, self.bias)


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(input_size, output_size, bias, None)


class ColumnParallelLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(input_size, _divide(output_size, tp_size()), bias, 0)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one weight (gate and up projections)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int = 0) -> None:
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        target = self._writable(param).data.narrow(0, offset, size)
        target.copy_(as_tensor(loaded.narrow(0, self.tp_rank * size, size)))


class QKVParallelLinear(LinearBase):
    """Query, key and value projections in one weight; key/value heads may be fewer (GQA). Each
    rank holds its share of the query heads; with fewer KV heads than ranks, each KV head is
    replicated on ``tp / num_kv_heads`` ranks, as in vLLM."""

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False
    ) -> None:
        size = tp_size()
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, size, "the number of attention heads")
        if num_kv_heads >= size:
            self.num_kv_heads = _divide(num_kv_heads, size, "the number of key/value heads")
            self.kv_replicas = 1
        else:
            self.num_kv_heads = 1
            self.kv_replicas = _divide(
                size, num_kv_heads, "the tensor-parallel size over the KV heads"
            )
        output = (self.num_heads + 2 * self.num_kv_heads) * head_dim
        super().__init__(hidden_size, output, bias, 0)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str = "q") -> None:
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        offset, size = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}[
            shard_id
        ]
        shard = self.tp_rank if shard_id == "q" else self.tp_rank // self.kv_replicas
        self._writable(param).data.narrow(0, offset, size).copy_(
            as_tensor(loaded.narrow(0, shard * size, size))
        )


class RowParallelLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(_divide(input_size, tp_size()), output_size, bias, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The bias is added once, after the partial products are summed.
        y = self._matmul(x, self.bias if self.tp_rank == 0 else None)
        return all_reduce(y)
