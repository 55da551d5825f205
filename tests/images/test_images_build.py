"""The Containerfile really builds: `podman build --isolation=chroot` from a local Debian base made
by debootstrap (images/build-base.sh; no container registry is needed), then the image's own
entrypoint answers --help, run as uid 1001 inside the image's root filesystem.

`podman run` is not used: in a sandbox without the right to set rlimits crun fails
(`setrlimit RLIMIT_NOFILE: Operation not permitted`), so the tests mount the image and chroot
into it, which runs the same files with the same user, PATH and entrypoint.

The operator image (about 2 minutes cold, seconds when podman's layer cache is warm) is always
built. The runtime image downloads several GB of PyTorch with CUDA, so it is built only with
INFERNETES_BUILD_RUNTIME_IMAGE=1.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "images"))
from imagetools import ImageRoot, build, missing_prerequisite  # noqa: E402

pytestmark = pytest.mark.skipif(
    missing_prerequisite() is not None, reason=str(missing_prerequisite())
)


@pytest.fixture(scope="module")
def operator_image() -> Iterator[ImageRoot]:
    root = ImageRoot(build("operator"))
    yield root
    root.close()


def test_operator_image_entrypoint_answers_help(operator_image: ImageRoot):
    assert operator_image.config["Entrypoint"] == ["infernetes", "operator", "run"]
    assert operator_image.config["User"] == "1001"
    out = operator_image.entrypoint("--help").stdout
    assert out.startswith("usage: infernetes operator run")
    assert "--peering" in out and "--namespace" in out


def test_operator_image_prints_the_checked_in_crd(operator_image: ImageRoot):
    # The installed package, not the source tree: the image's CRD is the one in crds/.
    crd = operator_image.exec(["infernetes", "operator", "crd"]).stdout
    assert crd == (REPO_ROOT / "crds" / "inferenceservices.infernetes.io.yaml").read_text()


def test_operator_image_has_no_torch_and_runs_as_non_root(operator_image: ImageRoot):
    probe = "import importlib.util as u, os; print(u.find_spec('torch') is None, u.find_spec('kopf') is not None, os.getuid())"
    assert operator_image.exec(["python", "-c", probe]).stdout.split() == ["True", "True", "1001"]
    bad = operator_image.entrypoint("--metrics-port", "eighty", check=False)
    assert bad.returncode == 2 and "--metrics-port: invalid int value" in bad.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("INFERNETES_BUILD_RUNTIME_IMAGE") != "1",
    reason="the runtime image downloads several GB of PyTorch; set INFERNETES_BUILD_RUNTIME_IMAGE=1",
)
def test_runtime_image_entrypoint_answers_help():
    root = ImageRoot(build("runtime"))
    try:
        assert root.config["Entrypoint"] == ["infernetes", "serve"]
        assert root.config["User"] == "1001"
        assert "8000/tcp" in root.config["ExposedPorts"]
        out = root.entrypoint("--help").stdout
        assert "--tensor-parallel-size" in out and "--model" in out
        # vLLM's image command line: the arguments after the image name go to serve.
        parsed = root.exec(
            ["infernetes", "config", "--model", "org/model", "--tensor-parallel-size", "2"]
        ).stdout
        assert '"tensor_parallel_size": 2' in parsed and '"model": "org/model"' in parsed
        probe = "import torch, triton, os; print(torch.version.cuda is not None, bool(triton.__version__), os.environ['HF_HOME'])"
        assert root.exec(["python", "-c", probe]).stdout.split() == [
            "True",
            "True",
            "/var/cache/huggingface",
        ]
        cache = root.path / "var" / "cache" / "huggingface"
        assert cache.stat().st_uid == 1001
        serve_tiny_model(root)
    finally:
        root.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_tiny_model(root: ImageRoot) -> None:
    """The image's entrypoint with vLLM-style arguments serves a tiny model (random weights, made
    here) on the CPU: a completion and the vllm:* metrics."""
    import httpx
    from infernetes.runtime.testing import make_tiny_llama

    make_tiny_llama(root.path / "tmp" / "tiny")
    for path in (root.path / "tmp" / "tiny").rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    port = free_port()
    argv = [
        *root.config["Entrypoint"],
        "--model",
        "/tmp/tiny",
        "--device",
        "cpu",
        "--port",
        str(port),
    ]
    server = subprocess.Popen(
        root.command([*argv, "--max-model-len", "256"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, f"the server exited:\n{server.stdout.read()}"
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not become healthy in 240 s"
            time.sleep(1)
        body = {"model": "/tmp/tiny", "prompt": "hello", "max_tokens": 5, "temperature": 0}
        completion = httpx.post(f"{base}/v1/completions", json=body, timeout=60).json()
        assert completion["usage"]["completion_tokens"] == 5
        assert "vllm:generation_tokens_total" in httpx.get(f"{base}/metrics", timeout=10).text
    finally:
        server.terminate()
        server.wait(timeout=60)
