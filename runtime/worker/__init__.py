"""A worker: one rank's device, model and KV cache, driven by the executor step by step."""
