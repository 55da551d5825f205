"""Torch reference implementations of every op: the CPU path and the oracle for the kernels."""
