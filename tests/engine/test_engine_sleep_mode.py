"""Sleep mode as vLLM's: only with --enable-sleep-mode; level 1 frees the KV cache and keeps the
weights in host memory, level 2 drops them too and reads them again on waking; ``tags`` wake the
weights and the cache apart (weights first); greedy tokens are the same after every round trip;
``reload_weights`` and ``collective_rpc`` are what an RL trainer drives."""

from __future__ import annotations

import gc

import psutil
import pytest
import torch
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.runtime.worker.weight_offload import HostCopy, model_tensors

from infernetes import LLM

PROMPTS = ["the cache keeps", "a slow request"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
# Large enough that freeing it shows in the process's resident memory.
WEIGHTY = {
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
}


@pytest.fixture(scope="module")
def weighty_llama(model_factory):
    return model_factory("LlamaForCausalLM", **WEIGHTY)


def _tokens(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY)]


def _runner(llm: LLM):
    return llm.llm_engine.engine_core.executor.driver_worker.model_runner


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def _weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_sleep_needs_sleep_mode(tiny_llama):
    llm = LLM(tiny_llama, num_gpu_blocks_override=32, seed=0)
    with pytest.raises(ValueError, match="--enable-sleep-mode"):
        llm.sleep(1)
    assert not llm.llm_engine.is_sleeping


def test_levels_free_memory_and_give_the_same_tokens(weighty_llama):
    llm = LLM(
        weighty_llama,
        dtype="float32",
        num_gpu_blocks_override=4096,
        seed=0,
        enable_sleep_mode=True,
    )
    runner = _runner(llm)
    expected = _tokens(llm)
    cache_bytes = runner.bytes_per_block * runner.num_blocks
    weights = _weight_bytes(runner.model)

    def fill_cache() -> None:  # a CPU cache's pages are resident once written (a busy server's)
        for layer in runner.attention_layers:
            layer.k_cache.fill_(0)
            layer.v_cache.fill_(0)

    fill_cache()
    before = _rss()
    llm.sleep(1)
    assert all(layer.k_cache.numel() == 0 for layer in runner.attention_layers)
    assert runner.model is not None  # on a CPU the weights are in host memory already
    assert before - _rss() > cache_bytes // 2
    llm.wake_up()
    assert _tokens(llm) == expected

    fill_cache()
    before = _rss()
    llm.sleep(2)
    assert runner.model is None
    assert before - _rss() > (cache_bytes + weights) // 2
    llm.wake_up()
    assert _tokens(llm) == expected


def test_tags_wake_the_weights_then_the_cache(tiny_llama):
    llm = LLM(tiny_llama, num_gpu_blocks_override=64, seed=0, enable_sleep_mode=True)
    expected = _tokens(llm)
    llm.sleep(2)
    with pytest.raises(ValueError, match="weights before the KV cache"):
        llm.wake_up(["kv_cache"])
    with pytest.raises(ValueError, match="tags must be among"):
        llm.wake_up(["optimizer"])
    assert llm.llm_engine.wake_up(["weights"])  # something still sleeps: the cache
    assert _runner(llm).model is not None and llm.llm_engine.is_sleeping
    assert not llm.llm_engine.wake_up(["kv_cache"])
    assert _tokens(llm) == expected


def test_host_copy_restores_every_tensor_bit_for_bit(tiny_llama):
    # (the GPU's level 1, run on a CPU; float32 keeps every weight a plain tensor)
    llm = LLM(tiny_llama, dtype="float32", num_gpu_blocks_override=64, seed=0)
    expected = _tokens(llm)
    model = _runner(llm).model
    originals = [t.detach().clone() for t in model_tensors(model)]
    copy = HostCopy(model, torch.device("cpu"))
    assert copy.bytes == sum(t.numel() * t.element_size() for t in originals if t.numel())
    assert all(t.numel() == 0 for t in model_tensors(model))
    copy.restore()
    for tensor, original in zip(model_tensors(model), originals, strict=True):
        assert torch.equal(tensor, original)
    _runner(llm).capture_decode_graphs()  # as waking up does: the old ones hold freed addresses
    assert _tokens(llm) == expected


def test_reload_weights_reads_the_checkpoint_again(model_factory, tmp_path):
    from infernetes.runtime.testing import make_tiny_model

    path = make_tiny_model(tmp_path / "model", "LlamaForCausalLM", seed=0)
    llm = LLM(str(path), num_gpu_blocks_override=64, seed=0, enable_sleep_mode=True)
    first = _tokens(llm)
    make_tiny_model(tmp_path / "model", "LlamaForCausalLM", seed=1)  # a trainer's new weights
    llm.reload_weights()
    reloaded = _tokens(llm)
    assert reloaded == _tokens(LLM(str(path), num_gpu_blocks_override=64, seed=0))
    assert reloaded != first


def test_collective_rpc_calls_each_rank(tiny_llama):
    llm = LLM(tiny_llama, num_gpu_blocks_override=64, seed=0)
    (block_bytes,) = llm.collective_rpc("kv_cache_block_bytes")
    assert block_bytes == _runner(llm).bytes_per_block
    with pytest.raises(ValueError, match="no method '_runner'"):
        llm.collective_rpc("_runner")
    with pytest.raises(ValueError, match="no method 'nonexistent'"):
        llm.collective_rpc("nonexistent")
