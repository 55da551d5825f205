"""vLLM's entry points in the runtime image (images/vllm-alias/): `vllm serve`, `vllm --version`
and `python -m vllm.entrypoints.openai.api_server` delegate to infernetes.

Here the alias runs from the repository, with PYTHONPATH pointing at its `vllm` folder: that
proves the delegation without building the image (test_images_build.py runs the same forms inside
the built runtime image, opt-in). The Containerfile installs the alias in the runtime image only,
and the infernetes distribution carries no `vllm` package or command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from infernetes import __version__

sys.path.insert(0, str(Path(__file__).resolve().parent))
from containerfile import REPO_ROOT, stages
from serving import SMALL_SERVER_ARGS, assert_serves, free_port

ALIAS = REPO_ROOT / "images" / "vllm-alias"
VLLM_SCRIPT = ALIAS / "bin" / "vllm"
ALIAS_ENV = {**os.environ, "PYTHONPATH": str(ALIAS / "python")}


def run_alias(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], env=ALIAS_ENV, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory) -> Path:
    from infernetes.runtime.testing import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("demo-model"))


@pytest.mark.parametrize("flag", ["--version", "-v"])
def test_vllm_version_prints_our_version_alone(flag):
    result = run_alias(str(VLLM_SCRIPT), flag)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{__version__}\n"


def test_vllm_without_a_command_is_infernetes_help():
    result = run_alias(str(VLLM_SCRIPT))
    assert result.returncode == 0 and "serve" in result.stdout


@pytest.mark.parametrize(
    "form",
    [
        pytest.param(lambda model: [str(VLLM_SCRIPT), "serve", model], id="vllm-serve"),
        pytest.param(
            lambda model: ["-m", "vllm.entrypoints.openai.api_server", "--model", model],
            id="api-server-module",
        ),
    ],
)
def test_vllm_forms_serve_the_demo_model(form, demo_model):
    port = free_port()
    argv = [*form(str(demo_model)), "--host", "127.0.0.1", "--port", str(port), *SMALL_SERVER_ARGS]
    assert_serves([sys.executable, *argv], str(demo_model), port, env=ALIAS_ENV)


def test_bad_options_are_refused_as_serve_refuses_them():
    result = run_alias("-m", "vllm.entrypoints.openai.api_server", "--max-num-seqs", "many")
    assert result.returncode == 2 and "--max-num-seqs" in result.stderr


def environment(stage_env: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for line in stage_env for item in line.split())


def test_containerfile_installs_the_alias_in_the_runtime_image_only():
    all_stages = stages()
    venv = environment(all_stages["base"].all("ENV"))["VIRTUAL_ENV"]
    # The base installs python3.11: its virtualenv's site-packages is where `vllm` goes.
    assert "python3.11" in " ".join(all_stages["base"].all("RUN"))
    copies = all_stages["runtime"].all("COPY")
    assert f"images/vllm-alias/python/vllm {venv}/lib/python3.11/site-packages/vllm" in copies
    assert f"--chmod=755 images/vllm-alias/bin/vllm {venv}/bin/vllm" in copies
    assert VLLM_SCRIPT.read_text().splitlines()[0] == f"#!{venv}/bin/python"
    others = [stage for name, stage in all_stages.items() if name != "runtime"]
    assert not any("vllm" in value for stage in others for _, value in stage.instructions)


def source_tree(dest: Path) -> Path:
    """A copy of the files git tracks or would track, so a build writes nothing in the repo."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        source = REPO_ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def test_wheel_and_sdist_have_no_vllm_package_or_command(tmp_path):
    tree = source_tree(tmp_path / "src")
    out = tmp_path / "dist"
    out.mkdir()
    for hook in ("build_wheel", "build_sdist"):  # a process each: the hooks leave state behind
        build = f"import sys, setuptools.build_meta as b; b.{hook}(sys.argv[1])"
        subprocess.run(
            [sys.executable, "-c", build, str(out)], cwd=tree, capture_output=True, check=True
        )
    [wheel] = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [top_level] = [name for name in names if name.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["infernetes"]
        [entry_points] = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
        assert "vllm" not in archive.read(entry_points).decode()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"infernetes", f"infernetes-{__version__}.dist-info"}
    [sdist] = out.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        inside = [name.split("/", 1)[1] for name in archive.getnames() if "/" in name]
    assert not any(name.split("/")[0] == "vllm" or name == "vllm.py" for name in inside)
