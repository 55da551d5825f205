"""A server started with --kv-events-config publishes from its engine-core process: a completion's
prompt blocks, then AllBlocksCleared on /reset_prefix_cache, read back from the replay socket;
/metrics carries vllm:kv_events_dropped_total. (The wire format, ordering, eviction, data
parallelism and drops are tested on the engine: tests/engine/test_kv_events.py.)"""

from __future__ import annotations

import json
import time

import httpx
from kv_replay import replayed_events
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families

DEADLINE_S = 60  # a ceiling for a loaded machine, never what is asserted


def wait_for_events(port: int, done) -> list[list]:
    deadline = time.monotonic() + DEADLINE_S
    while not done(events := replayed_events(port)):
        assert time.monotonic() < deadline, f"events so far: {events}"
    return events


def test_a_server_publishes_its_prefix_cache(tiny_llama_dir, server_process_factory):
    port, replay_port = free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://*:{port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
    }
    with server_process_factory(
        [str(tiny_llama_dir), "--block-size", "8", "--kv-events-config", json.dumps(config)],
        env={"VLLM_SERVER_DEV_MODE": "1"},
        log_name="kv-events-server.log",
    ) as server:
        prompt = list(range(10, 30))  # two full blocks of 8
        body = {"model": str(tiny_llama_dir), "prompt": prompt, "max_tokens": 1}
        assert httpx.post(f"{server.url}/v1/completions", json=body).status_code == 200
        events = wait_for_events(port=replay_port, done=lambda e: len(e) >= 1)
        (stored,) = events
        name, block_hashes, parent, token_ids, block_size, lora_id, medium = stored
        assert (name, token_ids, block_size, lora_id, medium) == (
            "BlockStored",
            prompt[:16],
            8,
            None,
            "GPU",
        )
        assert len(block_hashes) == 2 and parent is None

        assert httpx.post(f"{server.url}/reset_prefix_cache").status_code == 200
        events = wait_for_events(replay_port, lambda e: e[-1][0] == "AllBlocksCleared")
        assert events[-1] == ["AllBlocksCleared"]

        samples = [
            sample
            for family in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)
            for sample in family.samples
            if sample.name == "vllm:kv_events_dropped_total"
        ]
        assert [(s.labels["engine"], s.value) for s in samples] == [("0", 0.0)]
