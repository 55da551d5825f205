"""LoRA adapters through the OpenAI API of a real server: ``--lora-modules`` in both forms listed
in /v1/models with their parent, the request's ``model`` selecting an adapter (peft's greedy
tokens), adapters loaded and unloaded at run time (VLLM_ALLOW_RUNTIME_LORA_UPDATING), clear
errors for a bad path, a rank over the limit, an unknown or duplicate name, and the
``vllm:lora_requests_info`` gauge naming the running adapter."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

PROMPT = [1, 5, 9, 200, 17, 3, 44]
MAX_TOKENS = 6
# Loading an adapter reads and checks its files: seconds on a busy machine, past httpx's 5 s.
HTTP_TIMEOUT = 60


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir, tmp_path_factory):
    from infernetes.runtime.testing import make_tiny_lora

    root = tmp_path_factory.mktemp("server-loras")
    return {
        "attn": make_tiny_lora(tiny_llama_dir, root / "attn", rank=8, seed=1),
        "mlp": make_tiny_lora(
            tiny_llama_dir,
            root / "mlp",
            rank=4,
            target_modules=["gate_proj", "up_proj", "down_proj"],
            seed=2,
        ),
        "late": make_tiny_lora(tiny_llama_dir, root / "late", rank=16, use_rslora=True, seed=3),
        "wide": make_tiny_lora(tiny_llama_dir, root / "wide", rank=32, seed=4),
    }


@pytest.fixture(scope="module")
def lora_server(tiny_llama_dir, adapters, server_process_factory):
    with server_process_factory(
        [
            str(tiny_llama_dir),
            "--served-model-name",
            "tiny",
            "--max-model-len",
            "128",
            "--num-gpu-blocks-override",
            "32",
            "--enable-lora",
            "--max-loras",
            "2",
            "--max-lora-rank",
            "16",
            "--lora-modules",
            f"attn={adapters['attn']}",
            json.dumps({"name": "mlp", "path": str(adapters["mlp"]), "base_model_name": "tiny"}),
        ],
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
        log_name="lora-server.log",
    ) as server:
        yield server


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


def _greedy_tokens(client: openai.OpenAI, model: str) -> list[int]:
    completion = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        logprobs=0,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
    )
    return [int(t.removeprefix("token_id:")) for t in completion.choices[0].logprobs.tokens]


def _peft_tokens(base, adapter) -> list[int]:
    from infernetes.runtime.testing import hf_greedy_tokens, hf_peft_greedy_tokens

    if adapter is None:
        return hf_greedy_tokens(base, PROMPT, MAX_TOKENS)
    return hf_peft_greedy_tokens(base, adapter, PROMPT, MAX_TOKENS)


def test_models_lists_adapters_with_their_parent(lora_server, adapters):
    cards = {m.id: m for m in _client(lora_server).models.list().data}
    assert set(cards) == {"tiny", "attn", "mlp"}
    assert cards["attn"].parent == cards["mlp"].parent == "tiny"
    assert cards["attn"].root == str(adapters["attn"])


def test_model_selects_the_adapter(lora_server, adapters, tiny_llama_dir):
    client = _client(lora_server)
    for name in ("attn", "mlp", None):
        expected = _peft_tokens(tiny_llama_dir, None if name is None else adapters[name])
        assert _greedy_tokens(client, name or "tiny") == expected, name
    chat = client.chat.completions.create(
        model="attn", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.model == "attn"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        _greedy_tokens(client, "no-such-adapter")


def test_adapters_load_and_unload_at_run_time(lora_server, adapters, tiny_llama_dir, tmp_path):
    client = _client(lora_server)
    url = lora_server.url
    loaded = httpx.post(
        f"{url}/v1/load_lora_adapter",
        json={"lora_name": "late", "lora_path": str(adapters["late"])},
        timeout=HTTP_TIMEOUT,
    )
    assert loaded.status_code == 200, loaded.text
    assert "late" in {m.id for m in client.models.list().data}
    assert _greedy_tokens(client, "late") == _peft_tokens(tiny_llama_dir, adapters["late"])

    def error(path: str, body: dict) -> tuple[int, str]:
        response = httpx.post(f"{url}{path}", json=body, timeout=HTTP_TIMEOUT)
        return response.status_code, response.json()["error"]["message"]

    status, message = error(
        "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": str(adapters["late"])}
    )
    assert status == 400 and "already been loaded" in message
    status, message = error(
        "/v1/load_lora_adapter", {"lora_name": "wide", "lora_path": str(adapters["wide"])}
    )
    assert status == 400 and "greater than --max-lora-rank 16" in message
    status, message = error(
        "/v1/load_lora_adapter", {"lora_name": "gone", "lora_path": str(tmp_path / "nothing")}
    )
    assert status == 400 and "cannot be read" in message
    status, _ = error("/v1/load_lora_adapter", {"lora_name": "x"})
    assert status == 400  # lora_path missing

    unloaded = httpx.post(
        f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"}, timeout=HTTP_TIMEOUT
    )
    assert unloaded.status_code == 200, unloaded.text
    assert "late" not in {m.id for m in client.models.list().data}
    with pytest.raises(openai.NotFoundError):
        _greedy_tokens(client, "late")
    status, message = error("/v1/unload_lora_adapter", {"lora_name": "late"})
    assert status == 404 and "cannot be found" in message
    # the server is still serving
    assert _greedy_tokens(client, "attn")


def test_lora_requests_info_names_the_running_adapter(lora_server):
    body = {
        "model": "mlp",
        "prompt": PROMPT,
        "max_tokens": 100,
        "stream": True,
        "ignore_eos": True,
    }
    labels: list[dict[str, str]] = []
    stop = threading.Event()

    def watch() -> None:
        from prometheus_client.parser import text_string_to_metric_families

        while not stop.is_set():
            text = httpx.get(f"{lora_server.url}/metrics", timeout=HTTP_TIMEOUT).text
            for family in text_string_to_metric_families(text):
                if family.name == "vllm:lora_requests_info":
                    labels.extend(sample.labels for sample in family.samples)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with httpx.stream("POST", f"{lora_server.url}/v1/completions", json=body) as response:
            assert response.status_code == 200
            for _ in response.iter_lines():
                pass
    finally:
        stop.set()
        watcher.join()
    assert any(
        label.get("running_lora_adapters") == "mlp" and label.get("max_lora") == "2"
        for label in labels
    ), labels


def test_runtime_updates_need_the_variable_and_lora(main_server, auth_headers, adapters):
    """The main server has neither --enable-lora nor VLLM_ALLOW_RUNTIME_LORA_UPDATING."""
    response = httpx.post(
        f"{main_server.url}/v1/load_lora_adapter",
        json={"lora_name": "attn", "lora_path": str(adapters["attn"])},
        headers=auth_headers,
        timeout=HTTP_TIMEOUT,
    )
    assert response.status_code == 404
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in response.json()["error"]["message"]


def test_a_bad_lora_module_stops_the_server(tiny_llama_dir, adapters, server_process_factory):
    server = server_process_factory(
        [
            str(tiny_llama_dir),
            "--max-model-len",
            "128",
            "--num-gpu-blocks-override",
            "16",
            "--enable-lora",
            "--lora-modules",
            f"wide={adapters['wide']}",
        ],
        log_name="bad-lora-server.log",
    )
    assert server.process.wait(timeout=180) == 1
    server.stop()
    assert "--lora-modules wide" in server.tail()
    assert "greater than --max-lora-rank 16" in server.tail()


def test_lora_requests_info_keeps_one_series_of_the_current_adapters():
    from infernetes.runtime.engine.stats import SchedulerStats
    from infernetes.runtime.server.metrics import PrometheusStatLogger
    from prometheus_client.parser import text_string_to_metric_families

    logger = PrometheusStatLogger("tiny", 512, max_loras=2)

    def series() -> list[dict[str, str]]:
        text = logger.exposition().decode()
        return [
            sample.labels
            for family in text_string_to_metric_families(text)
            if family.name == "vllm:lora_requests_info"
            for sample in family.samples
        ]

    logger.record(
        SchedulerStats(running_lora_adapters={"b": 2, "a": 1}, waiting_lora_adapters={"c": 1}),
        None,
    )
    assert series() == [
        {"running_lora_adapters": "a,b", "waiting_lora_adapters": "c", "max_lora": "2"}
    ]
    logger.record(SchedulerStats(), None)
    assert series() == [{"running_lora_adapters": "", "waiting_lora_adapters": "", "max_lora": "2"}]
