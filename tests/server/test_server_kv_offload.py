"""A server started with --kv-offloading-size keeps KV blocks in host memory below a device cache
too small for the working set: repeated prompts come back from the host tier with the same
completions, counted in vllm:prompt_tokens_by_source_total (source external_kv_transfer), and the
tier's moves go out as KV events with medium CPU. (The tier's behaviour is tested on the engine:
tests/engine/test_engine_kv_offload.py.)"""

from __future__ import annotations

import json
import random
import time

import httpx
from kv_replay import replayed_events
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families

DEADLINE_S = 60  # a ceiling for a loaded machine, never what is asserted
PROMPT_LEN = 100  # six full blocks of 16
_rng = random.Random(0)
PROMPTS = [[_rng.randrange(5, 500) for _ in range(PROMPT_LEN)] for _ in range(4)]


def samples(url: str, name: str, label: str) -> dict[str, float]:
    """The series of ``name`` by the value of its ``label``."""
    return {
        sample.labels.get(label, ""): sample.value
        for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
        for sample in family.samples
        if sample.name == name
    }


def prompt_tokens_by_source(url: str) -> dict[str, float]:
    return samples(url, "vllm:prompt_tokens_by_source_total", "source")


def test_a_server_with_a_host_tier_serves_a_repeated_working_set_from_it(
    tiny_llama_dir, server_process_factory
):
    replay_port = free_port()
    events_config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://*:{free_port()}",
        "replay_endpoint": f"tcp://*:{replay_port}",
    }
    server = server_process_factory(
        [
            str(tiny_llama_dir),
            "--dtype",
            "float32",  # a prefix computed in other chunks than before flips no token
            "--max-model-len",
            "256",
            "--num-gpu-blocks-override",
            "16",  # the four prompts need 28
            "--kv-offloading-size",
            "0.01",
            "--kv-offloading-backend",
            "native",
            "--kv-events-config",
            json.dumps(events_config),
        ],
        log_name="kv-offload-server.log",
    )
    try:
        server.wait_ready()

        def complete(prompt: list[int]) -> str:
            body = {"model": str(tiny_llama_dir), "prompt": prompt, "max_tokens": 4}
            body |= {"temperature": 0, "ignore_eos": True}
            response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=DEADLINE_S)
            assert response.status_code == 200, response.text
            return response.json()["choices"][0]["text"]

        first = [complete(prompt) for prompt in PROMPTS]
        assert prompt_tokens_by_source(server.url) == {
            "local_compute": 4 * PROMPT_LEN,
            "local_cache_hit": 0,
            "external_kv_transfer": 0,
        }
        assert [complete(prompt) for prompt in PROMPTS] == first
        loaded = 4 * 6 * 16
        assert prompt_tokens_by_source(server.url) == {
            "local_compute": 8 * PROMPT_LEN - loaded,
            "local_cache_hit": 0,
            "external_kv_transfer": loaded,
        }

        # each prompt's six full blocks went to the tier once and came back once
        copied = samples(server.url, "vllm:kv_offload_total_bytes_total", "transfer_type")
        assert copied["GPU_to_CPU"] == copied["CPU_to_GPU"] > 0
        assert samples(server.url, "vllm:kv_offload_load_bytes_total", "engine") == {
            "0": copied["CPU_to_GPU"]
        }
        assert samples(server.url, "vllm:kv_offload_store_size_count", "engine") == {"0": 4}

        deadline = time.monotonic() + DEADLINE_S
        while True:
            events = replayed_events(replay_port)
            host = [e for e in events if e[0] == "BlockStored" and e[-1] == "CPU"]
            if sum(len(e[1]) for e in host) >= 4 * 6:
                break
            assert time.monotonic() < deadline, f"events so far: {events}"
        # BlockStored's fields in vLLM's order: hashes, parent, tokens, block size, lora, medium
        assert [e[2:] for e in host] == [[None, [], 16, None, "CPU"]] * len(host)
        device = [e for e in events if e[0] == "BlockStored" and e[-1] == "GPU"]
        stored_on_device = {h for e in device for h in e[1]}
        assert {h for e in host for h in e[1]} <= stored_on_device  # the same hashes
    finally:
        server.stop()
