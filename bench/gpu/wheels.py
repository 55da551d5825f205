"""``make gpu-wheels``: the wheels the GPU machines lack, downloaded into ``.whl/`` and checked.

The GPU machines have no network; what their image lacks (``requirements.txt`` beside this file)
travels with the working tree as wheels that ``run.sh`` installs offline. This downloads each pin
as a CPython 3.12 manylinux x86_64 wheel, drops wheels no pin names (two versions of one package
stop the offline install), and checks that every wheel's own requirements, as they apply on that
machine, are met by another wheel here or by the image (``image-packages.txt``): a requirement
that is met by neither is reported, and the command fails. Prints the total size, which travels
with the tree (64 MiB a call in all).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
WHEELS = ROOT / ".whl"
# The device README's platforms; pip matches each manylinux_2_N tag exactly.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 38, 35, 34, 31, 28, 27, 24, 17, 5)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "any",
]
# The machine the wheels are for: Linux x86_64, CPython 3.12 (markers are evaluated for it).
TARGET = {
    **default_environment(),
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}
BUDGET_BYTES = 40 << 20


def _names(path: Path) -> list[str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def pins() -> dict[str, str]:
    """``{canonical name: version}`` of requirements.txt."""
    result = {}
    for line in _names(HERE / "requirements.txt"):
        requirement = Requirement(line)
        (spec,) = requirement.specifier
        result[canonicalize_name(requirement.name)] = spec.version
    return result


def download(wanted: dict[str, str]) -> None:
    WHEELS.mkdir(exist_ok=True)
    for wheel in WHEELS.glob("*.whl"):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        if wanted.get(name) != str(version):
            print(f"removing {wheel.name} (not pinned)")
            wheel.unlink()
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
            *("--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"),
            *platforms,
            *("-d", str(WHEELS), "-r", str(HERE / "requirements.txt")),
        ],
        check=True,
    )


def _requires(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        headers = HeaderParser().parsestr(archive.read(metadata).decode())
    return [Requirement(line) for line in headers.get_all("Requires-Dist") or []]


def unmet(wanted: dict[str, str]) -> list[str]:
    """``wheel: requirement`` for each requirement neither a wheel nor the image provides,
    following the extras one wheel asks of another (mistral-common needs
    ``pydantic-extra-types[pycountry]``, and without pycountry gguf fails to import)."""
    provided = set(wanted) | {canonicalize_name(n) for n in _names(HERE / "image-packages.txt")}
    requires = {
        parse_wheel_filename(wheel.name)[0]: (wheel.name, _requires(wheel))
        for wheel in WHEELS.glob("*.whl")
    }
    # (wheel, extra) pairs to check: each wheel as such, then the extras asked of it
    pending = [(name, "") for name in requires]
    checked: set[tuple[str, str]] = set()
    problems = []
    while pending:
        name, extra = pending.pop()
        if (name, extra) in checked or name not in requires:
            continue  # an extra asked of a package on the image: its metadata is not here
        checked.add((name, extra))
        wheel, requirements = requires[name]
        for requirement in requirements:
            marker = requirement.marker
            if marker is not None and not marker.evaluate({**TARGET, "extra": extra}):
                continue
            if extra and (marker is None or "extra" not in str(marker)):
                continue  # a base requirement, checked with the wheel itself
            target = canonicalize_name(requirement.name)
            if target not in provided:
                problems.append(f"{wheel}{f'[{extra}]' if extra else ''}: {requirement}")
            pending += [(target, wanted_extra) for wanted_extra in requirement.extras]
    return sorted(problems)


def main() -> int:
    wanted = pins()
    download(wanted)
    have = {parse_wheel_filename(w.name)[0] for w in WHEELS.glob("*.whl")}
    missing = sorted(set(wanted) - have)
    problems = [f"no wheel for {name}" for name in missing] + unmet(wanted)
    total = sum(w.stat().st_size for w in WHEELS.glob("*.whl"))
    for wheel in sorted(WHEELS.glob("*.whl"), key=lambda w: -w.stat().st_size):
        print(f"{wheel.stat().st_size / 2**20:6.2f} MiB  {wheel.name}")
    print(f"{total / 2**20:6.2f} MiB in {len(have)} wheels (budget {BUDGET_BYTES >> 20} MiB)")
    if total > BUDGET_BYTES:
        problems.append(f"the wheels exceed {BUDGET_BYTES >> 20} MiB")
    for problem in problems:
        print(f"gpu-wheels: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
