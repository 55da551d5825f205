"""The GPU machines' wheels (bench/gpu/requirements.txt, `make gpu-wheels`) keep up with the
runtime extra: every package the runtime needs is pinned there or comes with the GPU image
(bench/gpu/image-packages.txt), so a GPU session does not find a runtime module that fails to
import. The pins are the versions the CPU checkout had when the list was last prepared; a fresh
install may resolve newer ones, so they are not compared here."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "bench" / "gpu"
# Left out on purpose: PyAV's wheel (FFmpeg inside) alone would take most of what a device
# call carries; the GPU run does not decode video.
NOT_CARRIED = {"av"}


def _lines(path: Path) -> list[str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def _runtime_needs() -> set[str]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    needs = set()
    for line in extras["runtime"]:
        requirement = Requirement(line)
        env = {"python_version": "3.12", "sys_platform": "linux", "platform_system": "Linux"}
        if requirement.marker is None or requirement.marker.evaluate(env):
            needs.add(canonicalize_name(requirement.name))
    return needs


def _pins() -> dict[str, str]:
    pins = {}
    for line in _lines(GPU / "requirements.txt"):
        requirement = Requirement(line)
        (spec,) = requirement.specifier
        pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def test_every_runtime_package_travels_or_is_on_the_image():
    image = {canonicalize_name(name) for name in _lines(GPU / "image-packages.txt")}
    missing = sorted(_runtime_needs() - image - set(_pins()) - NOT_CARRIED)
    assert not missing, f"add to bench/gpu/requirements.txt (then make gpu-wheels): {missing}"
