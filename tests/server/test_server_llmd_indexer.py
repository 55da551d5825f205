"""llm-d's KV-cache indexer, fed by a real server, names the pod that holds a prompt's prefix.

The indexer is llm-d's own code (github.com/llm-d/llm-d-kv-cache-manager: its kvevents pool and
ZMQ subscriber decode the events, its kvblock index keeps them, its token processor computes a
prompt's block keys), built from the Go module proxy by cluster/kvindexer.sh into
cluster/kvindexer, which binds the SUB socket the server publishes to and answers lookups on
stdin. The prompt's keys are computed by llm-d from its token ids alone, so the pod is found only
if the server's block hashes are vLLM's ``sha256_cbor`` from the same seed (PYTHONHASHSEED) and
every event kind decodes in llm-d's pool. Skipped when the build's toolchain (Go, a C compiler,
libzmq's headers) is missing; a failed build fails. Checked to fail with ``sha256`` block hashes
and with events sent as maps."""

from __future__ import annotations

import json
import select
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from kv_replay import replayed_events
from ports import free_port

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 60  # a ceiling for a loaded machine, never what is asserted
BLOCK = 8
SEED = "1234"
POD = "10.0.0.7:8000"  # the pod's address as the topic names it; opaque to the indexer


@pytest.fixture(scope="module")
def kvindexer_bin() -> str:
    built = subprocess.run(
        [str(REPO / "cluster" / "kvindexer.sh")], capture_output=True, text=True, check=False
    )
    if built.returncode == 3:
        pytest.skip(built.stderr.strip())
    assert built.returncode == 0, built.stderr
    return built.stdout.strip().splitlines()[-1]


class Indexer:
    """The Go indexer as a subprocess: one JSON line in, one out."""

    def __init__(self, binary: str, endpoint: str, log: Path) -> None:
        self.log = open(log, "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [binary, "-endpoint", endpoint, "-block-size", str(BLOCK), "-hash-seed", SEED],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        assert self._read().get("ready")

    def _read(self) -> dict:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], DEADLINE_S)
        assert ready, "the indexer did not answer"
        return json.loads(self.process.stdout.readline())

    def ask(self, **query) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(query).encode() + b"\n")
        self.process.stdin.flush()
        return self._read()

    def lookup(self, model: str, tokens: list[int]) -> dict:
        return self.ask(op="lookup", model=model, tokens=tokens)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.log.close()


def until(condition, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return value


@pytest.mark.slow  # a cold build of the indexer takes about 10 minutes on 2 busy cores
def test_llm_d_s_indexer_names_the_pod_holding_a_prompt_s_prefix(
    tiny_llama_dir, server_process_factory, kvindexer_bin, tmp_path
):
    port, replay_port = free_port(), free_port()
    model = str(tiny_llama_dir)
    indexer = Indexer(kvindexer_bin, f"tcp://127.0.0.1:{port}", tmp_path / "kvindexer.log")
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://127.0.0.1:{port}",  # connects: llm-d's SUB socket binds
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": f"kv@{POD}@{model}",
    }
    server = server_process_factory(
        [
            model,
            "--enable-prefix-caching",
            "--block-size",
            str(BLOCK),
            "--max-model-len",
            "64",
            "--num-gpu-blocks-override",
            "8",
            "--prefix-caching-hash-algo",
            "sha256_cbor",
            "--kv-events-config",
            json.dumps(config),
        ],
        env={"VLLM_SERVER_DEV_MODE": "1", "PYTHONHASHSEED": SEED},
        log_name="llmd-indexer-server.log",
    )

    def complete(prompt: list[int]) -> None:
        body = {"model": model, "prompt": prompt, "max_tokens": 1}
        assert httpx.post(f"{server.url}/v1/completions", json=body).status_code == 200

    def decoded_all() -> dict | None:
        """The indexer's counts once its pool has decoded every event the server sent."""
        sent = replayed_events(replay_port)
        stats = indexer.ask(op="stats")
        return stats if stats["events"] == len(sent) and sent else None

    try:
        server.wait_ready()
        prompt = list(range(10, 35))  # three full blocks of 8, and one token more
        complete(prompt)
        found = until(
            lambda: (answer := indexer.lookup(model, prompt))["prefix_blocks"] == 3 and answer,
            "the indexer never held the prompt's three blocks",
        )
        assert found["pods"] == [POD] and found["blocks"] == 3
        # A prompt sharing the first two blocks; one sharing none.
        shared = indexer.lookup(model, prompt[:16] + list(range(200, 210)))
        assert (shared["prefix_blocks"], shared["pods"]) == (2, [POD])
        unseen = indexer.lookup(model, list(range(100, 125)))
        assert (unseen["prefix_blocks"], unseen["pods"]) == (0, [])

        # Eight blocks in all: a 49-token prompt needs seven, so the first prompt's cached blocks
        # are evicted (BlockRemoved) and the indexer forgets them.
        other = list(range(300, 349))
        complete(other)
        until(
            lambda: indexer.lookup(model, prompt)["prefix_blocks"] < 3,
            "the indexer kept the evicted blocks",
        )
        assert indexer.lookup(model, other)["pods"] == [POD]

        assert httpx.post(f"{server.url}/reset_prefix_cache").status_code == 200
        stats = until(decoded_all, "llm-d's pool did not decode every event sent")
        sent = replayed_events(replay_port)
        kinds = {event[0] for event in sent}
        assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}, sent
        assert stats["errors"] == []
        assert stats["stored_keys"] == sum(len(e[1]) for e in sent if e[0] == "BlockStored")
        assert stats["evicted_keys"] == sum(len(e[1]) for e in sent if e[0] == "BlockRemoved")
        # llm-d's pool (v0.4.0) decodes AllBlocksCleared but does not act on it: the index still
        # names the pod for blocks the server no longer holds, until they are evicted.
        assert indexer.lookup(model, other)["pods"] == [POD]
    finally:
        server.stop()
        indexer.stop()
