"""``infernetes collect-env``: an environment report to paste into bug reports.

OS, Python, torch and its CUDA/ROCm build, the GPUs torch sees, versions of the packages the
server uses, and the environment variables that change its behaviour, with secrets masked.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from infernetes.schema.env import ENV_BY_NAME

PACKAGES = (
    "infernetes",
    "torch",
    "triton",
    "transformers",
    "tokenizers",
    "safetensors",
    "huggingface-hub",
    "numpy",
    "fastapi",
    "uvicorn",
    "pydantic",
    "prometheus-client",
    "openai",
    "kopf",
    "kubernetes",
    "pyyaml",
)
# Variables outside the VLLM_ prefix that still change what the server does.
_OTHER_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "TRITON_INTERPRET",
    "OMP_NUM_THREADS",
    "NCCL_DEBUG",
    "PYTORCH_CUDA_ALLOC_CONF",
    "LOCAL_RANK",
)
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
MASK = "***"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "collect-env", help="Print an environment report for bug reports."
    )
    parser.add_argument("--json", action="store_true", help="Print the report as JSON.")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report = collect()
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def collect() -> dict[str, Any]:
    return {
        "system": _system(),
        "python": {
            "version": sys.version.split()[0],
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "torch": _torch(),
        "nvidia_smi": _nvidia_smi(),
        "packages": {name: _version(name) for name in PACKAGES},
        "environment": relevant_env(os.environ),
    }


def relevant_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Every VLLM_* and other known variable that is set, secrets masked."""
    names = sorted(
        n for n in environ if n.startswith("VLLM_") or n in ENV_BY_NAME or n in _OTHER_VARS
    )
    return {name: mask(name, environ[name]) for name in names}


def mask(name: str, value: str) -> str:
    var = ENV_BY_NAME.get(name)
    secret = (var is not None and var.secret) or bool(_SECRET_NAME.search(name))
    return MASK if secret and value else value


def _system() -> dict[str, Any]:
    pretty = None
    try:
        with open("/etc/os-release", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("PRETTY_NAME="):
                    pretty = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return {
        "os": pretty or platform.system(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _proc_field("/proc/cpuinfo", "model name") or platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "memory": _proc_field("/proc/meminfo", "MemTotal"),
        "libc": " ".join(platform.libc_ver()).strip() or None,
    }


def _proc_field(path: str, key: str) -> str | None:
    """The value of the first ``key: value`` line of a /proc file (None off Linux)."""
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return None


def _torch() -> dict[str, Any]:
    try:
        import torch  # heavy; only this command pays for it
    except ImportError as exc:
        return {"installed": False, "error": str(exc)}
    info: dict[str, Any] = {
        "installed": True,
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,
        "rocm_build": getattr(torch.version, "hip", None),
        "debug_build": torch.version.debug,
        "cuda_available": torch.cuda.is_available(),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "gpus": [],
    }
    if info["cuda_available"]:
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            info["gpus"].append(
                {
                    "index": index,
                    "name": props.name,
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "capability": f"{props.major}.{props.minor}",
                }
            )
    return info


def _nvidia_smi() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=index,name,driver_version,memory.total",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"failed: {exc}"
    return out.stdout.strip() or out.stderr.strip() or None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def format_report(report: dict[str, Any]) -> str:
    lines: list[str] = []
    for section, content in report.items():
        lines.append(f"== {section} ==")
        if isinstance(content, dict):
            for key, value in content.items():
                lines.append(f"{key}: {_plain(value)}")
        else:
            lines.append(_plain(content))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _plain(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, list):
        return "; ".join(_plain(v) for v in value) if value else "(none)"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)
