"""The Containerfile really builds: `podman build --isolation=chroot` from a local Debian base made
by debootstrap (images/build-base.sh; no container registry is needed), then the image's own
entrypoint answers --help, run as uid 1001 inside the image's root filesystem, and the runtime
image serves a tiny model through its entrypoint and through vLLM's entry points
(images/vllm-alias/: `vllm serve`, `python -m vllm.entrypoints.openai.api_server`).

`podman run` is not used: in a sandbox without the right to set rlimits crun fails
(`setrlimit RLIMIT_NOFILE: Operation not permitted`), so the tests mount the image and chroot
into it, which runs the same files with the same user, PATH and entrypoint.

The operator image (about 2 minutes cold, seconds when podman's layer cache is warm) is always
built. The runtime image downloads several GB of PyTorch with CUDA, so it is built only with
INFERNETES_BUILD_RUNTIME_IMAGE=1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "images"))
from imagetools import ImageRoot, build, missing_prerequisite  # noqa: E402

sys.path.insert(0, str(REPO_ROOT / "tests" / "images"))
from serving import SMALL_SERVER_ARGS, assert_serves, free_port  # noqa: E402

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


RUNTIME_OPT_IN = pytest.mark.skipif(
    os.environ.get("INFERNETES_BUILD_RUNTIME_IMAGE") != "1",
    reason="the runtime image downloads several GB of PyTorch; set INFERNETES_BUILD_RUNTIME_IMAGE=1",
)


@pytest.fixture(scope="module")
def runtime_image() -> Iterator[ImageRoot]:
    root = ImageRoot(build("runtime"))
    yield root
    root.close()


@pytest.fixture(scope="module")
def image_tiny_model(runtime_image: ImageRoot) -> str:
    """The demo model (random weights, made here) inside the image's /tmp, readable by uid 1001;
    returns its path inside the image."""
    from infernetes.runtime.testing import make_tiny_llama

    make_tiny_llama(runtime_image.path / "tmp" / "tiny")
    for path in (runtime_image.path / "tmp" / "tiny").rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return "/tmp/tiny"


@pytest.mark.slow
@RUNTIME_OPT_IN
def test_runtime_image_entrypoint_answers_help(runtime_image: ImageRoot, image_tiny_model: str):
    root = runtime_image
    assert root.config["Entrypoint"] == ["infernetes", "serve"]
    assert root.config["User"] == "1001"
    assert "8000/tcp" in root.config["ExposedPorts"]
    out = root.entrypoint("--help").stdout
    assert "--tensor-parallel-size" in out and "--model" in out
    # vLLM's image command line: the arguments after the image name go to serve.
    parsed = root.exec(
        ["infernetes", "config", "--model", "org/model", "--max-num-seqs", "8"]
    ).stdout
    assert '"max_num_seqs": 8' in parsed and '"model": "org/model"' in parsed
    probe = "import torch, triton, os; print(torch.version.cuda is not None, bool(triton.__version__), os.environ['HF_HOME'])"
    assert root.exec(["python", "-c", probe]).stdout.split() == [
        "True",
        "True",
        "/var/cache/huggingface",
    ]
    cache = root.path / "var" / "cache" / "huggingface"
    assert cache.stat().st_uid == 1001
    # The image's entrypoint with vLLM-style arguments serves the model on the CPU.
    port = free_port()
    argv = [*root.config["Entrypoint"], "--model", image_tiny_model, "--port", str(port)]
    assert_serves(
        root.command([*argv, "--device", "cpu", *SMALL_SERVER_ARGS]), image_tiny_model, port
    )


@pytest.mark.slow
@RUNTIME_OPT_IN
def test_runtime_image_answers_to_vllm_entry_points(
    runtime_image: ImageRoot, image_tiny_model: str
):
    """What charts and operators written for vLLM run: `vllm serve MODEL`, `vllm --version` and
    `python -m vllm.entrypoints.openai.api_server --model MODEL` (images/vllm-alias/)."""
    from infernetes import __version__

    assert runtime_image.exec(["vllm", "--version"]).stdout == f"{__version__}\n"
    forms = (
        ["vllm", "serve", image_tiny_model],
        ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", image_tiny_model],
    )
    for form in forms:
        port = free_port()
        argv = [*form, "--port", str(port), "--device", "cpu", *SMALL_SERVER_ARGS]
        assert_serves(runtime_image.command(argv), image_tiny_model, port)
