"""llama.cpp for the ``cpu_llamacpp`` bench: its build (``build.sh``), the GGUF files both engines
load (``models``) and the llama.cpp processes the bench drives (``engines``)."""
