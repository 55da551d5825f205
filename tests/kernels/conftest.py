"""Kernel tests run the real Triton kernels: compiled on a GPU, in Triton's interpreter on a CPU.

Triton picks interpreter or compiler when a kernel module is imported, so the switch is set here,
before any test module imports them.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
