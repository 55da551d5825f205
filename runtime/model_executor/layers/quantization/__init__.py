"""Pre-quantized checkpoints: which method a checkpoint declares (``detect``) and how its tensors
become the weights of the model's linear layers (one module per method, each a
``CheckpointFormat`` that ``checkpoint.dequantized_weights`` drives over the checkpoint's tensors).

Weight-only formats are unpacked at load to the model dtype; fp8 and int8 weights are dequantised
the same way, so every linear layer runs as it does for an unquantised checkpoint.
"""

from infernetes.runtime.model_executor.layers.quantization.checkpoint import (
    CheckpointFormat,
    dequantized_weights,
)
from infernetes.runtime.model_executor.layers.quantization.detect import (
    CHECKPOINT_METHODS,
    checkpoint_format,
    checkpoint_quant_config,
    resolve_quantization,
)

__all__ = [
    "CHECKPOINT_METHODS",
    "CheckpointFormat",
    "checkpoint_format",
    "checkpoint_quant_config",
    "dequantized_weights",
    "resolve_quantization",
]
