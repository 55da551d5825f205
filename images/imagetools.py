"""Helpers for the tests that build the images and run what is inside them.

`podman run` cannot be used everywhere (in a sandbox without the right to set rlimits crun fails
with `setrlimit RLIMIT_NOFILE: Operation not permitted`), so an image's root filesystem is
mounted and its commands run with chroot, as the image's user, with the image's environment and
entrypoint: the same files and the same process, without a container runtime.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TEST_REPO = "localhost/infernetes-test"


def missing_prerequisite() -> str | None:
    """Why images cannot be built and entered here, or None when they can."""
    for tool in ("podman", "debootstrap", "chroot"):
        if shutil.which(tool) is None:
            return (
                f"{tool} is not installed (images/install-tools.sh installs podman and debootstrap)"
            )
    if os.geteuid() != 0:
        return "needs root: debootstrap, podman's storage and chroot"
    return None


def run(*argv: str, timeout: float = 1800, **kwargs) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return result


def build(target: str) -> str:
    """Builds a Containerfile target from the debootstrap base (podman's layer cache makes a
    rebuild of unchanged sources take seconds); returns the image name."""
    env = {**os.environ, "BASE_IMAGE": "debootstrap", "IMAGE_REPO": TEST_REPO, "IMAGE_TAG": "test"}
    run(str(REPO_ROOT / "images" / "build-images.sh"), target, env=env, timeout=3600)
    return f"{TEST_REPO}:test" if target == "runtime" else f"{TEST_REPO}-operator:test"


class ImageRoot:
    """A writable container filesystem of an image (podman create + mount), to run its commands
    with chroot. `close()` removes the container."""

    def __init__(self, image: str) -> None:
        self.image = image
        self.config = json.loads(
            run("podman", "image", "inspect", image, "--format", "{{json .Config}}").stdout
        )
        self.container = run("podman", "create", image).stdout.strip()
        self.path = Path(run("podman", "mount", self.container).stdout.strip())

    def command(self, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        """The chroot command line that runs argv as the image's user with its environment."""
        user = self.config.get("User") or "0"
        environment = dict(item.split("=", 1) for item in self.config.get("Env", []))
        environment.setdefault("HOME", self.config.get("WorkingDir") or "/")
        environment.update(env or {})
        command = ["chroot", f"--userspec={user}:0", str(self.path), "/usr/bin/env", "-i"]
        return command + [f"{key}={value}" for key, value in environment.items()] + argv

    def exec(self, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(self.command(argv), capture_output=True, text=True, timeout=300)
        if check and result.returncode != 0:
            raise AssertionError(
                f"{argv} exited {result.returncode} in {self.image}:\n{result.stdout}\n{result.stderr}"
            )
        return result

    def entrypoint(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.exec([*self.config["Entrypoint"], *args], check=check)

    def close(self) -> None:
        subprocess.run(["podman", "rm", "--force", self.container], capture_output=True)
