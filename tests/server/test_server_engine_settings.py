"""Engine settings the server checks before the engine-core process loads the model."""

from __future__ import annotations

import os
import subprocess
import sys


def _serve(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infernetes.cli.main", "serve", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_unavailable_attention_backend_exits_2_naming_the_flag(tiny_llama_dir):
    result = _serve(
        [str(tiny_llama_dir), "--device", "cpu", "--attention-backend", "TRITON_ATTN"],
        {"TRITON_INTERPRET": "0"},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert (
        "infernetes serve: error: --attention-backend TRITON_ATTN needs a CUDA device"
        in result.stderr
    )
    assert "Loading weights" not in result.stderr
