"""What a plainly started server logs (address, model dtype and device, KV cache size, maximum
concurrency); /tokenizer_info (--enable-tokenizer-info-endpoint) describes the served tokenizer, and lm-eval's
``local-completions`` model with ``tokenizer_backend=remote`` (which tokenizes through
/tokenizer_info, /tokenize and /detokenize) runs a loglikelihood task against the server: a tiny
local multiple-choice task, its scores equal to the prompt logprobs the server returns itself."""

from __future__ import annotations

import json
import math
import re

import httpx
import pytest


@pytest.fixture(scope="module")
def info_server(server_process_factory, tiny_llama_dir):
    server = server_process_factory(
        [str(tiny_llama_dir), "--served-model-name", "tiny", "--enable-tokenizer-info-endpoint"],
        log_name="tokenizer-info-server.log",
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_startup_logs_the_resolved_settings(info_server):
    log = info_server.log_path.read_text(errors="replace")
    assert f"listening on http://127.0.0.1:{info_server.port}" in log
    assert re.search(
        r"Model LlamaForCausalLM: dtype (bfloat16|float16|float32) on (cpu|cuda), max_model_len \d+",
        log,
    )
    assert re.search(r"(CPU|GPU) KV cache size: [\d,]+ tokens", log)
    assert re.search(r"Maximum concurrency for [\d,]+ tokens per request: [\d.]+x", log)
    assert "Received request" not in log  # request logging is off by default


def test_tokenizer_info_describes_the_tokenizer(info_server, tiny_llama_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    info = httpx.get(f"{info_server.url}/tokenizer_info", timeout=30).json()
    assert info["tokenizer_class"] == type(tokenizer).__name__
    assert (info["eos_token"], info["bos_token"]) == (tokenizer.eos_token, tokenizer.bos_token)
    assert info.get("chat_template") == tokenizer.chat_template
    assert "name_or_path" not in info  # a path on the server's disk
    json.dumps(info)  # every value is plain JSON


CHOICES = ["red", "green", "blue"]
DOCS = [
    {"question": "The sky at noon is", "answer": 2},
    {"question": "Grass in spring is", "answer": 1},
    {"question": "A ripe tomato is", "answer": 0},
]


@pytest.fixture
def colour_task(tmp_path):
    data = tmp_path / "colours.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    (tmp_path / "colours.yaml").write_text(
        "\n".join(
            [
                "task: infernetes_colours",
                "dataset_path: json",
                "dataset_kwargs:",
                f"  data_files: {{test: {data}}}",
                "test_split: test",
                "output_type: multiple_choice",
                'doc_to_text: "{{question}}"',
                f"doc_to_choice: {json.dumps(CHOICES)}",
                "doc_to_target: answer",
                'target_delimiter: " "',
                "metric_list:",
                "  - metric: acc",
            ]
        )
    )
    return tmp_path


def test_lm_eval_remote_tokenizer_loglikelihood(info_server, colour_task, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=(
            f"base_url={info_server.url}/v1/completions,model=tiny,tokenizer_backend=remote,"
            "num_concurrent=1,max_retries=1,tokenized_requests=True"
        ),
        tasks=["infernetes_colours"],
        task_manager=TaskManager(include_path=str(colour_task)),
        log_samples=True,
    )
    acc = results["results"]["infernetes_colours"]["acc,none"]
    assert 0.0 <= acc <= 1.0
    samples = results["samples"]["infernetes_colours"]
    assert len(samples) == len(DOCS)
    for sample in samples:
        question = sample["doc"]["question"]
        for choice, response in zip(CHOICES, sample["filtered_resps"], strict=True):
            assert response[0] == pytest.approx(score(info_server, question, choice), abs=1e-4)


def score(server, context: str, continuation: str) -> float:
    """The continuation's log-probability given the context, by the server's own prompt logprobs
    (max_tokens 0 with echo), on the token split lm-eval makes."""

    def tokens(text: str) -> list[int]:
        body = {"prompt": text, "add_special_tokens": False}
        return httpx.post(f"{server.url}/tokenize", json=body, timeout=30).json()["tokens"]

    whole = tokens(context + " " + continuation)
    context_ids = tokens(context)
    scored = httpx.post(
        f"{server.url}/v1/completions",
        json={"prompt": whole, "max_tokens": 0, "echo": True, "logprobs": 0},
        timeout=60,
    ).json()["choices"][0]["logprobs"]["token_logprobs"]
    return math.fsum(scored[len(context_ids) :])
