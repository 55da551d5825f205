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


def test_ray_backend_where_ray_is_not_installed_exits_2(tiny_llama_dir, tmp_path):
    # This interpreter cannot find `ray`: a finder placed first refuses it.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class HideRay:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ray' or name.startswith('ray.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, HideRay())\n"
    )
    result = _serve(
        [str(tiny_llama_dir), "--distributed-executor-backend", "ray", "-tp", "2"],
        {"PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert (
        "infernetes serve: error: --distributed-executor-backend ray needs Ray, which is not "
        "installed here: pip install 'infernetes[ray]'" in result.stderr
    )
    assert "Loading weights" not in result.stderr
