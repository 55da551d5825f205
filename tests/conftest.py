"""Kernel tests run the real Triton kernels: compiled on a GPU, in Triton's interpreter on a CPU.

Triton picks interpreter or compiler when `triton.language` is first imported, and test modules
anywhere under tests/ may import it at collection (transformers' Qwen2-VL modeling module does),
so the switch is set here, before any test module is collected.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
