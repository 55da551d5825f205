"""Worker: one rank's device, model runner and KV cache. The executor calls its methods by name
(``collective_rpc``), so a worker in another process answers the same calls."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Any

import torch
from infernetes.kernels.backend import select_backend
from infernetes.kernels.cpu import native
from infernetes.runtime.config import RuntimeConfig
from infernetes.runtime.engine.model_runner_output import ModelRunnerOutput
from infernetes.runtime.engine.scheduler_output import SchedulerOutput
from infernetes.runtime.host_memory import release_free_memory
from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.model_executor.layers.fused_moe import FusedMoE
from infernetes.runtime.model_executor.memory_profile import GiB, log_kv_cache_budget
from infernetes.runtime.worker.cpu_binding import bind_threads, rank_cpus, usable_cpus
from infernetes.runtime.worker.model_runner import ModelRunner

# What sleep frees and wake_up brings back, by vLLM's tag names.
SLEEP_TAGS = ("weights", "kv_cache")

logger = logging.getLogger(__name__)


class Worker:
    def __init__(
        self, config: RuntimeConfig, rank: int = 0, device: torch.device | None = None
    ) -> None:
        """``device``: the one the launcher gave this rank (Ray's actor sees only its own GPU),
        else the rank's device on this host."""
        self.rank = rank
        self.config = config = (
            _given_device(config, device) if device else _rank_device(config, rank)
        )
        _share_cpu_cores(config, rank)
        self.device = config.device.device
        if self.device.type == "cpu":
            native.prebuild()  # the C kernels, before the first step needs them
        # The first rank of the last pipeline stage returns the sampled tokens; the others
        # sample the same ones (same logits, same seed) and keep them for their own inputs.
        self.returns_output = rank == config.parallel.output_rank
        select_backend(config.device.attention_backend)  # the ops of this process follow the flag
        self.model_runner = ModelRunner(config)

    def report(self) -> dict[str, object]:
        """What this rank holds, for the startup log (and the tests)."""
        runner = self.model_runner
        layer = runner.attention_layers[0] if runner.attention_layers else None
        modules = list(runner.model.modules()) if runner.model is not None else []
        moe_layers = [m for m in modules if isinstance(m, FusedMoE)]
        experts = moe_layers[0] if moe_layers else None
        return {
            "rank": self.rank,
            "device": str(self.device),
            "attention_heads": layer.num_heads if layer else 0,
            "kv_heads": layer.num_kv_heads if layer else 0,
            "attention_layers": len(runner.attention_layers),
            "checkpoint_bytes_read": getattr(runner.model, "checkpoint_bytes_read", 0),
            # the first MoE layer's experts on this rank: [first, end)
            "local_experts": (
                (experts.first_expert, experts.first_expert + experts.num_local_experts)
                if experts is not None
                else None
            ),
            # MoE layers running on packed int or fp8 experts (not the model dtype)
            "quantized_moe_layers": sum(
                m.packed is not None or m.w13_weight.dtype != runner.info.dtype for m in moe_layers
            ),
        }

    def determine_available_memory(self) -> int:
        """Bytes this rank can give the KV cache: ``--kv-cache-memory-bytes``, on a CPU
        ``VLLM_CPU_KVCACHE_SPACE``, else what profiling leaves of ``--gpu-memory-utilization``;
        less what an encoder-decoder model keeps for ``--max-num-seqs`` running requests
        outside the paged cache (their cross-attention keys and values)."""
        available = self._kv_memory()
        max_num_seqs = self.config.scheduler.max_num_seqs
        reserved = max_num_seqs * self.model_runner.cross_attention_bytes_per_request()
        if reserved and reserved >= available:
            raise ValueError(
                f"the cross-attention keys and values of max_num_seqs={max_num_seqs} running "
                f"requests take {reserved / GiB:.2f} GiB, more than the {available / GiB:.2f} "
                "GiB the KV cache may have: lower --max-num-seqs"
            )
        if reserved:
            logger.info(
                "%.2f GiB of the KV cache's memory kept for the cross-attention of %d requests",
                reserved / GiB,
                max_num_seqs,
            )
        return available - reserved

    def _kv_memory(self) -> int:
        cache = self.config.cache
        if cache.kv_cache_memory_bytes:
            return cache.kv_cache_memory_bytes
        if self.device.type == "cpu":
            return cache.cpu_kv_cache_bytes
        limits = self.config.scheduler
        budget = self.model_runner.profile_kv_cache_budget(
            limits.max_num_batched_tokens, limits.max_num_seqs, cache.gpu_memory_utilization
        )
        log_kv_cache_budget(budget)
        return budget.kv_bytes

    def kv_cache_block_bytes(self) -> int:
        return self.model_runner.bytes_per_block

    def initialize_cache(self, num_blocks: int) -> None:
        """Allocate the KV cache, then capture the decode graphs over it (a pooling model keeps
        no cache: its blocks only count tokens for the scheduler)."""
        if self.config.model.is_pooling:
            return
        self.model_runner.allocate_kv_cache(num_blocks)
        self.model_runner.register_kv_caches()
        self.model_runner.capture_decode_graphs()

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        output = self.model_runner.execute_model(scheduler_output)
        return output if self.returns_output else None

    def add_lora(self, lora_request: LoRARequest) -> str | None:
        """Read and check an adapter; what is wrong with it, or None. Returned, not raised: every
        rank answers, so no reply is left unread when one rank's check fails."""
        if self.model_runner.lora is None:
            return "LoRA adapters need --enable-lora"
        try:
            self.model_runner.lora.add_lora(lora_request)
        except ValueError as error:
            return str(error)
        return None

    def remove_lora(self, lora_int_id: int) -> bool:
        if self.model_runner.lora is not None:
            self.model_runner.lora.remove_lora(lora_int_id)
        return True

    def sleep(self, level: int) -> None:
        """vLLM's sleep levels: the KV cache is dropped; the weights move to host memory
        (level 1) or are dropped (level 2, read from the checkpoint when waking)."""
        if not self.config.model.is_pooling:
            self.model_runner.release_kv_cache()
        if level == 1:
            self.model_runner.offload_weights()
        else:
            self.model_runner.release_weights()
        if self.model_runner.device.type == "cpu":
            release_free_memory()

    def wake_up(self, num_blocks: int, tags: Sequence[str] = SLEEP_TAGS) -> None:
        """Bring back what ``tags`` name: ``weights`` (first: the graphs captured over the cache
        run the model) and ``kv_cache``."""
        if "weights" in tags:
            self.model_runner.restore_weights()
        if "kv_cache" in tags:
            self.initialize_cache(num_blocks)  # the old graphs went with the old cache

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Any public method by name, with keywords (``EngineCore.collective_rpc``)."""
        return getattr(self, method)(*args, **kwargs)

    def reload_weights(self) -> None:
        """Read the weights from the checkpoint again (what an RL trainer asks for after writing
        new weights where --model points); the KV cache is allocated afresh for the new model."""
        runner = self.model_runner
        num_blocks = runner.num_blocks
        runner.release_kv_cache()
        runner.release_weights()
        runner.load_model()
        if num_blocks:
            self.initialize_cache(num_blocks)


def _share_cpu_cores(config: RuntimeConfig, rank: int) -> None:
    """VLLM_CPU_OMP_THREADS_BIND places this rank's threads where it says; otherwise ranks and
    data-parallel engines share the CPUs the process can use, its CPU quota included (a pod
    limited to 2 CPUs on a 64-core node runs 2 threads, not 64), unless OMP_NUM_THREADS says
    otherwise: OpenMP threads beyond the CPUs the process gets wait for each other at every
    barrier (measured here, 2 threads on 2 cores kept busy by other work: a 896x4864 bf16 GEMV
    took 15 ms, against 0.3 ms on one thread)."""
    parallel = config.parallel
    ranks = parallel.local_world_size * parallel.data_parallel_size
    if config.device.device.type != "cpu":
        return
    index = parallel.data_parallel_rank * parallel.local_world_size
    cpus = rank_cpus(
        config.device.cpu_threads_bind, index + rank % parallel.local_world_size, ranks
    )
    if cpus is not None:
        bind_threads(cpus)
    elif "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, usable_cpus() // ranks)
        if ranks > 1 or threads < torch.get_num_threads():
            torch.set_num_threads(threads)


def start_rank(
    config: RuntimeConfig, rank: int, init_method: str, device: torch.device | None = None
) -> Worker:
    """Join the process groups as ``rank`` (NCCL on CUDA, gloo on a CPU), then load its shard."""
    from infernetes.runtime.model_executor import parallel

    parallel.init_distributed(
        rank,
        config.parallel.tensor_parallel_size,
        config.parallel.pipeline_parallel_size,
        init_method,
        "nccl" if config.device.device.type == "cuda" else "gloo",
        config.parallel.layer_partition,
        config.parallel.expert_parallel,
    )
    return Worker(config, rank, device)


def _given_device(config: RuntimeConfig, device: torch.device) -> RuntimeConfig:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return dataclasses.replace(config, device=dataclasses.replace(config.device, device=device))


def _rank_device(config: RuntimeConfig, rank: int) -> RuntimeConfig:
    """On CUDA each rank of this host takes the visible device of its index on the host (with
    ``--nnodes``, node R's ranks take devices 0..local-1 as node 0's do), data-parallel engines
    one block of ``world_size`` devices each (``CUDA_VISIBLE_DEVICES`` decides which those are);
    a CPU is shared by all."""
    device, parallel = config.device.device, config.parallel
    per_host = parallel.local_world_size * parallel.data_parallel_size
    if device.type != "cuda" or per_host == 1:
        return config
    local_rank = rank - parallel.local_ranks.start
    index = parallel.data_parallel_rank * parallel.local_world_size + local_rank
    visible = torch.cuda.device_count()
    if index >= visible:
        raise ValueError(
            f"data_parallel_size x tensor_parallel_size x pipeline_parallel_size / nnodes is "
            f"{per_host}, but {visible} CUDA device(s) are visible (CUDA_VISIBLE_DEVICES)"
        )
    local = torch.device("cuda", index)
    torch.cuda.set_device(local)
    return dataclasses.replace(config, device=dataclasses.replace(config.device, device=local))
