"""Multi-node serving on the CPU: two ``infernetes serve`` processes stand in for two pods of a
LeaderWorkerSet (node 0 serves the API, node 1 runs ``--headless``; gloo between them). Tensor
parallel 2 and pipeline parallel 2, one rank per node, give transformers' greedy tokens; the
headless node exits 1 when node 0 is killed; node 0 fails and exits when the headless node is
killed; bad flag combinations exit 2 naming the flags."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from infernetes.runtime.testing import hf_greedy_tokens
from ports import free_port_pair
from waits import gone, wait_until

ARGS = [
    "--dtype",
    "float32",
    "--max-model-len",
    "128",
    "--num-gpu-blocks-override",
    "16",
    "--served-model-name",
    "tiny",
    "--nnodes",
    "2",
    "--master-addr",
    "127.0.0.1",
]
PROMPT = [1, 5, 9, 200, 17, 3, 44, 8, 91, 12]


def _greedy_tokens(server) -> list[int]:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    completion = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        logprobs=1,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
    )
    return [int(t.removeprefix("token_id:")) for t in completion.choices[0].logprobs.tokens]


class Group:
    """Node 1 (headless, started first: it waits for node 0) and node 0 (the API server)."""

    def __init__(self, model: Path, parallel: list[str], factory, logs: Path, name: str) -> None:
        port = ["--master-port", str(free_port_pair())]
        self.follower_log = logs / f"{name}-node1.log"
        with open(self.follower_log, "wb") as log:
            self.follower = subprocess.Popen(
                [sys.executable, "-m", "infernetes.cli.main", "serve", str(model), *ARGS,
                 *parallel, *port, "--node-rank", "1", "--headless"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.leader = factory([str(model), *ARGS, *parallel, *port], log_name=f"{name}-node0.log")

    def follower_tail(self) -> str:
        return self.follower_log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        self.leader.stop()
        if self.follower.poll() is None:
            self.follower.kill()
        self.follower.wait()


@pytest.fixture
def start_group(tiny_llama_dir, server_process_factory, tmp_path):
    groups: list[Group] = []

    def start(parallel: list[str], name: str) -> Group:
        group = Group(tiny_llama_dir, parallel, server_process_factory, tmp_path, name)
        groups.append(group)
        group.leader.wait_ready()
        return group

    yield start
    for group in groups:
        group.stop()


@pytest.mark.slow
def test_tensor_parallel_over_two_nodes_and_node_1_exits_when_node_0_is_killed(
    start_group, tiny_llama_dir
):
    group = start_group(["--tensor-parallel-size", "2"], "tp")
    assert _greedy_tokens(group.leader) == hf_greedy_tokens(tiny_llama_dir, PROMPT, 8)
    node_0 = psutil.Process(group.leader.process.pid)
    everyone = [node_0, *node_0.children(recursive=True)]
    node_0.kill()
    assert wait_until(lambda: group.follower.poll() is not None), group.follower_tail()
    assert group.follower.returncode == 1
    assert "node 0 went away" in group.follower_tail()
    assert wait_until(lambda: all(gone(p) for p in everyone)), [p.cmdline() for p in everyone]


@pytest.mark.slow
def test_pipeline_parallel_over_two_nodes_and_node_0_fails_when_node_1_is_killed(
    start_group, tiny_llama_dir
):
    group = start_group(["--pipeline-parallel-size", "2"], "pp")
    assert _greedy_tokens(group.leader) == hf_greedy_tokens(tiny_llama_dir, PROMPT, 8)
    node_1 = psutil.Process(group.follower.pid)
    its_workers = node_1.children(recursive=True)
    assert len(its_workers) == 1
    node_1.kill()
    leader = group.leader
    assert wait_until(lambda: leader.process.poll() is not None), leader.tail()
    assert leader.process.returncode == 1
    assert "worker rank 1 on node 1" in leader.tail()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{leader.url}/health", timeout=2)
    assert wait_until(lambda: all(gone(p) for p in its_workers))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--nnodes", "2", "-tp", "2", "--headless"],
            "--headless is for the nodes after the first",
        ),
        (["--nnodes", "2", "-tp", "2", "--node-rank", "1"], "--node-rank 1 needs --headless"),
        (["--nnodes", "2", "-tp", "3"], "must be divisible by --nnodes (2)"),
    ],
)
def test_bad_node_flags_exit_2_naming_them(flags, message):
    done = subprocess.run(
        [sys.executable, "-m", "infernetes.cli.main", "serve", "some/model", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert message in done.stderr
