"""--cpu-offload-gb: the first decoder layers' weights in host memory, copied to the device for
each forward. The mechanism is device-agnostic, so these tests run it with the CPU as the device
(the engine config itself leaves the flag without effect on a CPU engine and warns)."""

from __future__ import annotations

import gc
import logging

import pytest
import torch
from infernetes.runtime.engine import engine_config
from infernetes.runtime.model_executor.cpu_offload import decoder_layers
from infernetes.runtime.sampling_params import SamplingParams

from infernetes import LLM
from infernetes.schema.config import build_config
from infernetes.schema.support_check import refuse_unsupported

PROMPTS = ["the cache keeps", "a slow request"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
# float32: on a CPU bf16 linear weights are packed for oneDNN, a layout that is never offloaded
# (it exists only on a CPU); plain weights exercise what a GPU's layers go through
PLAIN = {"num_gpu_blocks_override": 32, "seed": 0, "dtype": "float32"}


def _runner(llm: LLM):
    return llm.llm_engine.engine_core.executor.driver_worker.model_runner


def _tokens(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY)]


def _layer_bytes(layer: torch.nn.Module) -> int:
    """What the offload moves: the layer's own weights (its rotary cache is shared)."""
    return sum(p.numel() * p.element_size() for p in layer.parameters())


def _offloading(monkeypatch, budget_bytes: int) -> None:
    """Force the offload path on the CPU: the budget as the engine config would hand it over on
    a GPU."""
    monkeypatch.setattr(engine_config, "_cpu_offload_bytes", lambda config, device: budget_bytes)


@pytest.fixture(scope="module")
def reference(tiny_llama):
    llm = LLM(tiny_llama, **PLAIN)
    # measured before any forward: a layer may add caches of its own on its first one
    sizes = [_layer_bytes(layer) for layer in decoder_layers(_runner(llm).model)]
    return _tokens(llm), sizes


def test_budget_takes_whole_layers_from_the_first_and_tokens_match(
    tiny_llama, reference, monkeypatch
):
    tokens, sizes = reference
    assert len(sizes) >= 2
    # room for the first layer and most of the second: only the first fits whole
    _offloading(monkeypatch, sizes[0] + sizes[1] - 1)
    llm = LLM(tiny_llama, **PLAIN)
    runner = _runner(llm)
    layers = decoder_layers(runner.model)
    assert len(runner.offloaded) == 1
    assert runner.offloaded[0].bytes == sizes[0]
    assert _tokens(llm) == tokens
    # between forwards the offloaded layer's tensors are empty; the host copies hold the weights
    assert all(p.numel() == 0 for p in layers[0].parameters())
    assert all(p.numel() > 0 for p in layers[1].parameters())
    hosts = runner.offloaded[0].saved
    assert hosts and all(host.device.type == "cpu" for _, host in hosts)
    if torch.cuda.is_available():
        assert all(host.is_pinned() for _, host in hosts)


def test_budget_past_the_model_offloads_every_layer_and_still_runs(
    tiny_llama, reference, monkeypatch
):
    tokens, sizes = reference
    _offloading(monkeypatch, 2**40)
    llm = LLM(tiny_llama, **PLAIN)
    runner = _runner(llm)
    assert len(runner.offloaded) == len(sizes)
    assert _tokens(llm) == tokens
    assert _tokens(llm) == tokens  # the hooks fetch the weights again for every forward


def test_no_effect_on_a_cpu_engine(tiny_llama, caplog):
    with caplog.at_level(logging.WARNING):
        llm = LLM(tiny_llama, **PLAIN, cpu_offload_gb=4)
    assert _runner(llm).offloaded == []
    assert "--cpu-offload-gb has no effect on a CPU engine" in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_device_memory_drops_by_the_budget_and_tokens_match(model_factory):
    path = model_factory(
        "LlamaForCausalLM",
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        vocab_size=32000,
    )

    def load(offload_gb: float) -> tuple[LLM, int]:
        gc.collect()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        llm = LLM(path, **PLAIN, cpu_offload_gb=offload_gb, enforce_eager=True)
        return llm, torch.cuda.memory_allocated() - before

    plain, plain_bytes = load(0)
    tokens = _tokens(plain)
    budget = 4 * _layer_bytes(decoder_layers(_runner(plain).model)[0])
    del plain
    offloaded, offloaded_bytes = load(budget / 2**30)
    runner = _runner(offloaded)
    assert len(runner.offloaded) == 4
    moved = sum(layer.bytes for layer in runner.offloaded)
    assert moved <= budget
    assert all(host.is_pinned() for layer in runner.offloaded for _, host in layer.saved)
    assert plain_bytes - offloaded_bytes == pytest.approx(moved, rel=0.05)
    assert _tokens(offloaded) == tokens


def test_budget_in_bytes_on_a_gpu_and_refused_with_lora():
    gpu = torch.device("cuda")
    assert engine_config._cpu_offload_bytes(build_config(model="m", cpu_offload_gb=1.5), gpu) == (
        3 * 2**29
    )
    assert engine_config._cpu_offload_bytes(build_config(model="m"), gpu) == 0
    with pytest.raises(ValueError, match="--cpu-offload-gb cannot be combined with --enable-lora"):
        engine_config._cpu_offload_bytes(
            build_config(model="m", cpu_offload_gb=1, enable_lora=True), gpu
        )


def test_the_uva_backend_takes_the_budget_and_prefetch_is_refused():
    uva = build_config(model="m", cpu_offload_gb=1, offload_backend="uva")
    assert refuse_unsupported(uva) == []
    assert engine_config._cpu_offload_bytes(uva, torch.device("cuda")) == 2**30
    for refused in (
        {"offload_backend": "prefetch"},
        {"offload_group_size": 4},
        {"cpu_offload_params": ["mlp"]},
    ):
        with pytest.raises(ValueError, match="not built"):
            refuse_unsupported(build_config(model="m", **refused))


def test_sleep_level_2_offloads_again_on_waking(tiny_llama, reference, monkeypatch):
    tokens, sizes = reference
    _offloading(monkeypatch, sizes[0])
    llm = LLM(tiny_llama, **PLAIN, enable_sleep_mode=True)
    llm.sleep(2)
    llm.wake_up()
    runner = _runner(llm)
    assert len(runner.offloaded) == 1
    assert all(p.numel() == 0 for p in decoder_layers(runner.model)[0].parameters())
    assert _tokens(llm) == tokens


def test_quantized_layers_are_offloaded_and_give_the_same_tokens(tiny_llama, monkeypatch):
    online_fp8 = {**PLAIN, "dtype": "bfloat16", "quantization": "fp8"}
    tokens = _tokens(LLM(tiny_llama, **online_fp8))
    _offloading(monkeypatch, 2**40)
    llm = LLM(tiny_llama, **online_fp8)
    offloaded = _runner(llm).offloaded
    assert offloaded
    held = [host.dtype for layer in offloaded for _, host in layer.saved]
    assert torch.float8_e4m3fn in held
    assert _tokens(llm) == tokens
