"""``infernetes serve`` on an NVIDIA GPU: completions over HTTP give the CPU's greedy text, and
a model with dummy weights (`--load-format dummy`) serves (``bench/gpu/run.sh smoke``).

Skipped without a GPU (CI).
"""

from __future__ import annotations

import httpx
import pytest
import torch
from infernetes.runtime.testing import SAMPLE_PROMPTS

from infernetes import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

ENGINE_ARGS = ["--max-model-len", "128", "--num-gpu-blocks-override", "64", "--seed", "0"]
MAX_TOKENS = 12


def _completion(server, prompt: str) -> dict:
    response = httpx.post(
        f"{server.url}/v1/completions",
        json={
            "model": server.model,
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
        },
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_gpu_server_completions_give_the_cpus_greedy_text(tiny_llama_dir, server_process_factory):
    cpu = LLM(str(tiny_llama_dir), device="cpu", dtype="float32", max_model_len=128)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    want = [out.outputs[0].text for out in cpu.generate(SAMPLE_PROMPTS, greedy)]
    args = [str(tiny_llama_dir), "--device", "cuda", "--dtype", "float32", *ENGINE_ARGS]
    with server_process_factory(args, log_name="gpu-server.log") as server:
        server.model = str(tiny_llama_dir)
        for prompt, text in zip(SAMPLE_PROMPTS, want, strict=True):
            assert _completion(server, prompt)["choices"][0]["text"] == text, prompt


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gpu_server_serves_dummy_weights(tiny_llama_dir, server_process_factory, dtype):
    args = [str(tiny_llama_dir), "--load-format", "dummy", "--dtype", dtype, *ENGINE_ARGS]
    with server_process_factory(args, log_name=f"gpu-dummy-{dtype}.log") as server:
        server.model = str(tiny_llama_dir)
        body = _completion(server, SAMPLE_PROMPTS[0])
    assert body["usage"]["completion_tokens"] == MAX_TOKENS
