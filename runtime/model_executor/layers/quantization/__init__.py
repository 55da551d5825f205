"""Pre-quantized checkpoints: which method a checkpoint declares (``detect``) and how its tensors
become the weights of the model's linear layers (one module per method, each a
``CheckpointFormat`` that ``checkpoint.dequantized_weights`` drives over the checkpoint's tensors).

On the CPU every quantized layer is dequantised at load to the model dtype, so the layers' own
loaders shard it as any weight; where the Triton kernels run, packed int4/int8 and per-tensor or
per-channel fp8 layers keep their stored form instead, never holding a dense copy (kept.py). docs/quantization.md has
the table of what each method supports.
"""

from infernetes.runtime.model_executor.layers.quantization.checkpoint import (
    CheckpointFormat,
    dequantized_weights,
)
from infernetes.runtime.model_executor.layers.quantization.detect import (
    checkpoint_format,
    checkpoint_quant_config,
    resolve_quantization,
)

__all__ = [
    "CheckpointFormat",
    "checkpoint_format",
    "checkpoint_quant_config",
    "dequantized_weights",
    "resolve_quantization",
]
