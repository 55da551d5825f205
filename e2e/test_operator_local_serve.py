"""The container command the operator renders for a CPU sample, run here as a process.

This proves the rendered command line and environment are right: the exact `command` + `args`
and `env` of the Deployment's container start `infernetes serve` against a tiny model, which then
answers /v1/models and /metrics. Only the two operator-owned listening values are swapped for the
process (`--host` to loopback, `--port` to a free port): a pod has a network of its own, this
shared machine does not. No cluster is needed.
"""

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.render import render

SAMPLE = Path(__file__).resolve().parents[1] / "tests/operator/samples/cpu.yaml"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("infernetes.runtime.server") is None
    or importlib.util.find_spec("infernetes.runtime.server.api_server") is None,
    reason="infernetes.runtime.server (the Server issue) is not available yet",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rendered_container(model_dir: Path) -> dict:
    spec = yaml.safe_load(SAMPLE.read_text())["spec"]
    spec["model"] = str(model_dir)
    deployment = render(spec, ClusterFacts(), name="tiny", namespace="demo")[0]
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_rendered_cpu_command_serves_models_and_metrics(tmp_path: Path) -> None:
    from infernetes.runtime.testing import make_tiny_llama

    model_dir = make_tiny_llama(tmp_path / "tiny-llama")
    container = rendered_container(model_dir)
    port = free_port()
    args = [
        "--host=127.0.0.1"
        if arg == "--host=0.0.0.0"
        else f"--port={port}"
        if arg == "--port=8000"
        else arg
        for arg in container["args"]
    ]
    assert args.count(f"--port={port}") == 1 and "--host=127.0.0.1" in args
    # `infernetes` is the console script in this environment, as in the image.
    command = [
        str(Path(sys.executable).with_name(container["command"][0])),
        *container["command"][1:],
        *args,
    ]
    env = {key: value for key, value in os.environ.items() if not key.startswith("VLLM_")}
    env.update({item["name"]: item["value"] for item in container.get("env", [])})
    env["HF_HUB_OFFLINE"] = "1"
    log = tmp_path / "server.log"
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, (
                f"server exited {process.returncode}:\n{log.read_text()[-4000:]}"
            )
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (
                f"server not healthy in time:\n{log.read_text()[-4000:]}"
            )
            time.sleep(0.5)
        models = httpx.get(f"{base}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]  # the served name the operator passed
        completion = httpx.post(
            f"{base}/v1/completions",
            json={"model": "tiny", "prompt": "Hello", "max_tokens": 3},
            timeout=60,
        )
        assert completion.status_code == 200, completion.text
        metrics = httpx.get(f"{base}/metrics", timeout=10)
        assert metrics.status_code == 200
        assert "vllm:num_requests_running{" in metrics.text and 'model_name="tiny"' in metrics.text
        assert "vllm:prompt_tokens_total" in metrics.text
    finally:
        # Graceful termination, as the kubelet does it: SIGTERM, then the grace period.
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=container.get("terminationGracePeriodSeconds", 60))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail("the server ignored SIGTERM for the whole grace period")
