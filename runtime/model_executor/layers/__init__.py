"""Model building blocks, tensor-parallel ready (world size 1 today)."""
