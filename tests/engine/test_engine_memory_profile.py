"""KV-cache sizing from --gpu-memory-utilization: the arithmetic and the profiling sequence with a
fake memory probe (CPU), the real dummy step of the ModelRunner on a tiny model, and the real
thing on a GPU (marked gpu)."""

from __future__ import annotations

import gc
import logging

import pytest
import torch
from infernetes.runtime.model_executor.memory_profile import (
    GiB,
    MemoryProfile,
    kv_cache_budget,
    log_kv_cache_budget,
    log_kv_cache_capacity,
    memory_snapshot,
    profile_memory,
)


class FakeDevice:
    """A device whose torch allocator and driver readings the test drives."""

    def __init__(self, total: int, non_torch: int) -> None:
        self.total_bytes = total
        self.non_torch = non_torch
        self.live = 0
        self.peak = 0
        self.cached = 0  # reserved by torch but free (given back by settle)
        self.events: list[str] = []

    def alloc(self, n: int) -> None:
        self.live += n
        self.peak = max(self.peak, self.live)

    def free(self, n: int) -> None:
        self.live -= n
        self.cached += n

    # the MemoryProbe protocol
    def total(self) -> int:
        return self.total_bytes

    def used(self) -> int:
        return self.non_torch + self.reserved()

    def allocated(self) -> int:
        return self.live

    def peak_allocated(self) -> int:
        return self.peak

    def reserved(self) -> int:
        return self.live + self.cached

    def reset_peak(self) -> None:
        self.events.append("reset_peak")
        self.peak = self.live

    def settle(self) -> None:
        self.cached = 0


def test_budget_is_total_times_utilization_minus_the_rest():
    profile = MemoryProfile(
        total=80 * GiB, weights=15 * GiB, activation_peak=3 * GiB, non_torch=GiB
    )
    budget = kv_cache_budget(profile, 0.9)
    assert budget.requested == int(80 * GiB * 0.9)
    assert budget.kv_bytes == int(80 * GiB * 0.9) - 19 * GiB


def test_no_room_for_the_cache_names_the_flag_and_the_numbers():
    profile = MemoryProfile(
        total=80 * GiB, weights=15 * GiB, activation_peak=3 * GiB, non_torch=GiB
    )
    with pytest.raises(ValueError) as err:
        kv_cache_budget(profile, 0.2)
    message = str(err.value)
    assert "--gpu-memory-utilization 0.20" in message
    for figure in ("80.00 GiB", "16.00 GiB", "15.00 GiB", "3.00 GiB", "1.00 GiB", "19.00 GiB"):
        assert figure in message


@pytest.mark.parametrize("utilization", [0.0, -0.5, 1.5])
def test_utilization_out_of_range(utilization):
    profile = MemoryProfile(total=GiB, weights=0, activation_peak=0, non_torch=0)
    with pytest.raises(ValueError, match=r"--gpu-memory-utilization must be in \(0, 1\]"):
        kv_cache_budget(profile, utilization)


def test_profile_separates_weights_cache_activations_and_non_torch():
    device = FakeDevice(total=40 * GiB, non_torch=GiB // 2)
    device.alloc(10 * GiB)  # the weights, loaded before profiling

    def setup():
        device.events.append("setup")
        device.alloc(2 * GiB)  # the dummy step's KV cache: not an activation

    def step():
        device.events.append("step")
        device.alloc(3 * GiB)
        device.alloc(GiB)  # peak: 4 GiB above the cache
        device.free(4 * GiB)

    def teardown():
        device.events.append("teardown")
        device.free(2 * GiB)

    profile = profile_memory(device, setup, step, teardown)
    assert device.events == ["setup", "reset_peak", "step", "teardown"]
    assert (profile.total, profile.weights, profile.activation_peak) == (
        40 * GiB,
        10 * GiB,
        4 * GiB,
    )
    assert profile.non_torch == GiB // 2  # used minus reserved, after the cache was given back
    assert kv_cache_budget(profile, 0.5).kv_bytes == 20 * GiB - 10 * GiB - 4 * GiB - GiB // 2


def test_memory_other_processes_held_at_startup_is_not_this_engines():
    device = FakeDevice(total=80 * GiB, non_torch=30 * GiB)  # another process holds 30 GiB
    baseline = memory_snapshot(device)
    assert baseline.free == 50 * GiB
    device.non_torch += GiB  # this engine's CUDA workspaces
    device.alloc(10 * GiB)  # its weights
    profile = profile_memory(device, lambda: None, lambda: device.alloc(0), lambda: None, baseline)
    assert (profile.non_torch, profile.free_at_start) == (GiB, 50 * GiB)
    # utilization is per instance: 0.5 of the device fits beside the other process
    assert kv_cache_budget(profile, 0.5).kv_bytes == 40 * GiB - 10 * GiB - GiB
    with pytest.raises(ValueError) as err:
        kv_cache_budget(profile, 0.7)
    assert str(err.value) == (
        "Free memory on device (50.00 GiB/80.00 GiB) on startup is less than desired GPU memory "
        "utilization (0.7, 56.00 GiB). Decrease --gpu-memory-utilization or reduce GPU memory used by "
        "other processes."
    )


def test_teardown_runs_when_the_step_fails():
    device = FakeDevice(total=GiB, non_torch=0)
    torn_down = []

    def step():
        raise torch.cuda.OutOfMemoryError("dummy")

    with pytest.raises(torch.cuda.OutOfMemoryError):
        profile_memory(device, lambda: None, step, lambda: torn_down.append(True))
    assert torn_down == [True]


def test_log_lines(caplog):
    profile = MemoryProfile(
        total=80 * GiB, weights=15 * GiB, activation_peak=3 * GiB, non_torch=GiB, seconds=1.5
    )
    with caplog.at_level(logging.INFO, logger="infernetes.runtime.model_executor.memory_profile"):
        log_kv_cache_budget(kv_cache_budget(profile, 0.9))
        log_kv_cache_capacity("GPU", 1000, 16, 8192)
    text = caplog.text
    assert "Memory profiling takes 1.50 seconds" in text
    assert "total_gpu_memory (80.00 GiB) x gpu_memory_utilization (0.90) = 72.00 GiB" in text
    assert (
        "model weights take 15.00 GiB; non_torch_memory takes 1.00 GiB; PyTorch activation peak memory "
        "takes 3.00 GiB; the rest of the memory reserved for KV Cache is 53.00 GiB." in text
    )
    assert "Available KV cache memory: 53.00 GiB" in text
    assert "GPU KV cache size: 16,000 tokens" in text
    assert "Maximum concurrency for 8,192 tokens per request: 1.95x" in text


# -- the ModelRunner's dummy step, for real on the CPU, with a probe that counts tensors --------


class TensorBytesProbe:
    """Allocated = the bytes of the runner's weights and KV caches; the step's peak is injected."""

    def __init__(self, runner, total: int, step_peak: int) -> None:
        self.runner = runner
        self.total_bytes = total
        self.step_peak = step_peak
        self.cache_during_step = 0
        self._peak = 0

    def _live(self) -> int:
        params = sum(p.numel() * p.element_size() for p in self.runner.model.parameters())
        caches = sum(
            a.k_cache.numel() * a.k_cache.element_size() * 2 for a in self.runner.attention_layers
        )
        return params + caches

    def total(self) -> int:
        return self.total_bytes

    def used(self) -> int:
        return self._live() + 123

    def allocated(self) -> int:
        return self._live()

    def peak_allocated(self) -> int:
        return self._peak

    def reserved(self) -> int:
        return self._live()

    def reset_peak(self) -> None:
        self.cache_during_step = self._live()
        self._peak = self._live() + self.step_peak

    def settle(self) -> None:
        pass


@pytest.fixture(scope="module")
def runner(tiny_llama):
    from infernetes.runtime.engine.engine_config import resolve_config
    from infernetes.runtime.worker.model_runner import ModelRunner

    from infernetes.schema.config import build_config

    serve_config = build_config(
        tiny_llama, max_model_len=64, block_size=16, device="cpu", seed=0, use_tqdm_on_load=False
    )
    return ModelRunner(resolve_config(serve_config, environ={})[0])


def test_dummy_batch_splits_the_token_budget_by_max_model_len(runner):
    states, lengths = runner._dummy_prefill(150, max_num_seqs=8)
    assert lengths == [64, 64, 22]
    blocks = [runner.block_table.blocks(r.row) for r in states]
    assert [len(b) for b in blocks] == [4, 4, 2]
    assert sorted(b for row in blocks for b in row) == list(range(10))  # no block shared
    for r in states:
        runner.block_table.remove(r.row)
    assert runner._dummy_prefill(1000, max_num_seqs=2)[1] == [64, 64]


def test_runner_profiles_a_real_dummy_step(runner):
    weights = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    probe = TensorBytesProbe(runner, total=10 * GiB, step_peak=5 << 20)
    budget = runner.profile_kv_cache_budget(150, max_num_seqs=4, utilization=0.5, probe=probe)
    assert budget.profile.weights == weights
    assert budget.profile.activation_peak == 5 << 20
    assert budget.profile.non_torch == 123
    assert budget.kv_bytes == 5 * GiB - weights - (5 << 20) - 123
    # the step ran over a cache of 10 blocks (150 tokens), which was released afterwards
    assert probe.cache_during_step - weights == 10 * runner.bytes_per_block
    assert runner.num_blocks == 0 and all(a.k_cache.numel() == 0 for a in runner.attention_layers)


# -- on a GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_gpu_cache_fills_the_utilization_budget(tiny_llama, caplog):
    from infernetes import LLM, SamplingParams

    gc.collect()  # engines of earlier tests must not count as this one's weights
    torch.cuda.empty_cache()
    with caplog.at_level(logging.INFO):
        llm = LLM(tiny_llama, gpu_memory_utilization=0.3, enforce_eager=True, max_num_seqs=8)
    engine = llm.llm_engine.engine_core
    total = torch.cuda.mem_get_info()[1]
    cache_bytes = engine.num_blocks * engine.executor.driver_worker.model_runner.bytes_per_block
    assert "Available KV cache memory:" in caplog.text and "Maximum concurrency for" in caplog.text
    # everything this process holds on the device now stays under total * utilization
    assert cache_bytes > 0
    assert torch.cuda.memory_allocated() <= 0.3 * total
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_gpu_utilization_too_low_is_a_clear_error(tiny_llama):
    from infernetes import LLM

    with pytest.raises(ValueError, match="--gpu-memory-utilization"):
        LLM(
            tiny_llama, gpu_memory_utilization=1e-6, enforce_eager=True
        )  # ~100 KB: below the weights
