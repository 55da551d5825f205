"""``python bench/gpu/environment.py OUT.json [DRY_RUN]``: what the GPU machine has, as JSON.

The GPU, driver and CUDA (nvidia-smi, torch), torch's and triton's versions, and whether each
module infernetes' runtime needs imports (the image's packages with the wheels of .whl/ over
them). Exits 1 when one does not import, or when torch sees no GPU (unless DRY_RUN is 1): a step
that would fail for either reason stops here, with the reason in the file.
"""

from __future__ import annotations

import importlib
import json
import platform
import subprocess
import sys
import traceback
from pathlib import Path

# What the runtime and the GPU tests import: the runtime extra's modules, then infernetes' own
# entry points (the server app pulls in fastapi, uvicorn, pydantic, openai's types, ...).
MODULES = (
    "torch",
    "triton",
    "transformers",
    "safetensors",
    "tokenizers",
    "fastapi",
    "uvicorn",
    "pydantic",
    "openai",
    "llguidance",
    "xgrammar",
    "gguf",
    "zmq",
    "msgspec",
    "opentelemetry.sdk.trace",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "pytest_asyncio",
    "infernetes.runtime.llm",
    "infernetes.runtime.server.api_server",
    "infernetes.kernels.triton_backend",
)


def _nvidia_smi() -> str:
    query = "name,driver_version,memory.total,clocks.max.sm,compute_cap"
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unavailable: {error}"
    return (done.stdout or done.stderr).strip()


def _imports() -> dict[str, str]:
    result = {}
    for name in MODULES:
        try:
            module = importlib.import_module(name)
            result[name] = str(getattr(module, "__version__", "ok"))
        except Exception:
            result[name] = "FAILED: " + traceback.format_exc(limit=3).strip().splitlines()[-1]
    return result


def gather() -> dict:
    import torch

    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "nvidia_smi": _nvidia_smi(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": cuda,
        "device": torch.cuda.get_device_name() if cuda else None,
        "capability": list(torch.cuda.get_device_capability()) if cuda else None,
        "multiprocessors": torch.cuda.get_device_properties(0).multi_processor_count
        if cuda
        else None,
        "imports": _imports(),
    }


def main(out: str, dry_run: bool) -> int:
    env = gather()
    Path(out).write_text(json.dumps(env, indent=2) + "\n")
    failed = {name: why for name, why in env["imports"].items() if why.startswith("FAILED")}
    print(f"env: {env['device'] or 'no CUDA device'}; torch {env['torch']}; {env['nvidia_smi']}")
    for name, why in failed.items():
        print(f"env: import {name}: {why}", file=sys.stderr)
    if not env["cuda_available"] and not dry_run:
        print("env: torch sees no CUDA device (DRY_RUN=1 runs without one)", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "1"))
