"""``infernetes serve --async-scheduling`` answers the OpenAI client as the synchronous engine
does (greedy text equal to the offline engine's), under concurrent requests that preempt, a
stream that ends with a stop string, and a client that hangs up mid-stream; refused with
pipeline parallelism, naming both flags."""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
import sys

import httpx
import openai
import pytest

PROMPTS = [
    "The quick brown fox",
    "Once upon a time there was a small engine that",
    "In the beginning",
    "Kubernetes schedules pods onto nodes; each",
]


@pytest.fixture(scope="module")
def async_server(tiny_llama_dir, server_process_factory):
    with server_process_factory(
        [
            str(tiny_llama_dir),
            "--async-scheduling",
            "--served-model-name",
            "tiny",
            "--max-model-len",
            "64",
            "--block-size",
            "8",
            "--num-gpu-blocks-override",
            "10",  # four requests at once preempt
            "--dtype",
            "float32",
        ],
        log_name="async-scheduling.log",
    ) as server:
        yield server


@pytest.fixture(scope="module")
def offline_texts(tiny_llama_dir) -> list[str]:
    from infernetes import LLM, SamplingParams

    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=64, block_size=8)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    return [o.outputs[0].text for o in llm.generate(PROMPTS, params)]


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _complete(client: openai.OpenAI, prompt: str, **kw) -> openai.types.Completion:
    return client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=24,
        temperature=0.0,
        extra_body={"ignore_eos": True},
        **kw,
    )


def test_concurrent_completions_equal_the_offline_engine(async_server, offline_texts):
    client = _client(async_server)
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(lambda p: _complete(client, p), PROMPTS))
    assert [r.choices[0].text for r in results] == offline_texts
    assert all(r.choices[0].finish_reason == "length" for r in results)
    assert all(r.usage.completion_tokens == 24 for r in results)
    metrics = httpx.get(f"{async_server.url}/metrics", timeout=10).text
    preemptions = [
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("vllm:num_preemptions_total")
    ]
    assert preemptions and preemptions[0] > 0  # requests were preempted with steps in flight


def test_stream_ends_on_a_stop_string_and_n_samples(async_server, offline_texts):
    client = _client(async_server)
    stop = offline_texts[1][6:10]
    stream = _complete(client, PROMPTS[1], stop=[stop], stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks)
    assert text == offline_texts[1][: offline_texts[1].index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"
    many = _complete(client, PROMPTS[0], n=3)
    assert [c.text for c in many.choices] == [offline_texts[0]] * 3


def test_structured_outputs_end_with_a_step_in_flight(async_server):
    """The grammar's last token ends each request; the step already scheduled after it asks the
    finished matcher once more, and its token (or error) is dropped."""
    client = _client(async_server)
    cases = [
        ({"choice": ["red", "green", "blue"]}, lambda s: s in ("red", "green", "blue")),
        ({"regex": "[ab]{3}-[0-9]"}, lambda s: re.fullmatch("[ab]{3}-[0-9]", s)),
        ({"grammar": 'root ::= "yes" | "no" | "maybe"'}, lambda s: s in ("yes", "no", "maybe")),
    ] * 2

    def run(case):
        structured, _ = case
        return client.completions.create(
            model="tiny",
            prompt="Answer:",
            max_tokens=40,
            temperature=1.0,
            seed=3,
            extra_body={"structured_outputs": structured},
        ).choices[0]

    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        choices = list(pool.map(run, cases))
    for (_, check), choice in zip(cases, choices, strict=True):
        assert check(choice.text), choice.text
        assert choice.finish_reason == "stop"
    assert [c.text for c in choices[:3]] == [c.text for c in choices[3:]]  # seeded: the same


def test_a_client_hanging_up_mid_stream_leaves_the_server_serving(async_server, offline_texts):
    client = _client(async_server)
    with httpx.stream(
        "POST",
        f"{async_server.url}/v1/completions",
        json={"model": "tiny", "prompt": PROMPTS[2], "max_tokens": 100, "stream": True},
        timeout=30,
    ) as response:
        for _ in zip(range(3), response.iter_lines(), strict=False):
            pass  # a few tokens, then hang up while its steps are in flight
    assert _complete(client, PROMPTS[3]).choices[0].text == offline_texts[3]
    assert httpx.get(f"{async_server.url}/health", timeout=5).status_code == 200


def test_refused_with_pipeline_parallelism(tiny_llama_dir):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "infernetes.cli.main",
            "serve",
            str(tiny_llama_dir),
            "--async-scheduling",
            "--pipeline-parallel-size",
            "2",
        ],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "--async-scheduling" in result.stderr and "--pipeline-parallel-size" in result.stderr
