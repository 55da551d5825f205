"""What a plainly started server logs (address, model dtype and device, KV cache size, maximum
concurrency); /tokenizer_info (--enable-tokenizer-info-endpoint) describes the served tokenizer, and lm-eval's
``local-completions`` model with ``tokenizer_backend=remote`` (which tokenizes through
/tokenizer_info, /tokenize and /detokenize) runs a loglikelihood task against the server: a tiny
local multiple-choice task, its scores equal to the prompt logprobs the server returns itself.
lm-eval runs from an environment of its own (``lmeval/``: it cannot share the dev extra's)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest


@pytest.fixture(scope="module")
def info_server(server_process_factory, tiny_llama_dir):
    with server_process_factory(
        [str(tiny_llama_dir), "--served-model-name", "tiny", "--enable-tokenizer-info-endpoint"],
        log_name="tokenizer-info-server.log",
    ) as server:
        yield server


def test_startup_logs_the_resolved_settings(info_server):
    log = info_server.log_path.read_text(errors="replace")
    assert f"listening on http://127.0.0.1:{info_server.port}" in log
    assert re.search(
        r"Model LlamaForCausalLM \(native implementation\): dtype (bfloat16|float16|float32) "
        r"on (cpu|cuda), max_model_len \d+",
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
    folder = tmp_path / "task"
    folder.mkdir()
    data = folder / "colours.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    (folder / "colours.yaml").write_text(
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
    return folder


def lm_eval_python() -> Path:
    """lm-eval's own environment (`make lmeval`; `make unit` makes it and names it in
    INFERNETES_LMEVAL_PYTHON, so CI runs this test); a local run without one skips."""
    configured = os.environ.get("INFERNETES_LMEVAL_PYTHON")
    if configured:
        if not Path(configured).is_file():
            pytest.fail(f"INFERNETES_LMEVAL_PYTHON={configured} does not exist (make lmeval)")
        return Path(configured)
    local = Path(__file__).resolve().parents[2] / ".venv-lmeval" / "bin" / "python"
    if not local.is_file():
        pytest.skip("lm-eval's environment is missing: make lmeval")
    return local


def test_lm_eval_remote_tokenizer_loglikelihood(info_server, colour_task, tmp_path):
    python = lm_eval_python()
    output = tmp_path / "results.json"
    run = subprocess.run(
        [
            str(python),
            str(Path(__file__).parent / "lmeval" / "run_task.py"),
            info_server.url,
            "tiny",
            str(colour_task),
            "infernetes_colours",
            str(output),
        ],
        cwd=tmp_path,  # the repository's operator/ folder would shadow the standard library's
        env={
            **os.environ,
            "HF_DATASETS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(output.read_text())
    assert 0.0 <= results["acc"] <= 1.0
    assert len(results["samples"]) == len(DOCS)
    for sample in results["samples"]:
        for choice, scored in zip(CHOICES, sample["scores"], strict=True):
            expected = score(info_server, sample["question"], choice)
            assert scored == pytest.approx(expected, abs=1e-4)


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
