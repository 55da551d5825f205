"""Helpers for the benchmarks that start ``infernetes serve`` as a subprocess."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli(*args: str) -> list[str]:
    """The command line of ``infernetes <args>`` run by this interpreter."""
    return [sys.executable, "-m", "infernetes.cli.main", *args]


def wait_healthy(url: str, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not become healthy")


def random_dataset(num_prompts: int, input_len: int, output_len: int) -> list[str]:
    """``infernetes bench``'s options for ``num_prompts`` random prompts of these lengths (seed 0:
    every run and both sides of a comparison get the same prompts)."""
    return [
        "--dataset-name",
        "random",
        "--num-prompts",
        str(num_prompts),
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--seed",
        "0",
    ]
