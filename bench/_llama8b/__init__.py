"""The benchmarks of ``python -m bench gpu_llama8b``, one module each; ``model`` holds the model
they share and ``bench/_gpu.py`` the device helpers and report lines."""
