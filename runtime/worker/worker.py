"""Worker: one rank's device, model runner and KV cache. The executor calls its methods by name
(``collective_rpc``), so a worker in another process answers the same calls."""

from __future__ import annotations

from infernetes.kernels.backend import select_backend
from infernetes.runtime.config import RuntimeConfig
from infernetes.runtime.engine.model_runner_output import ModelRunnerOutput
from infernetes.runtime.engine.scheduler_output import SchedulerOutput
from infernetes.runtime.model_executor.memory_profile import log_kv_cache_budget
from infernetes.runtime.worker.model_runner import ModelRunner


class Worker:
    def __init__(self, config: RuntimeConfig, rank: int = 0) -> None:
        self.config = config
        self.rank = rank
        self.device = config.device.device
        select_backend(config.device.attention_backend)  # the ops of this process follow the flag
        self.model_runner = ModelRunner(config)

    def determine_available_memory(self) -> int:
        """Bytes this rank can give the KV cache: ``--kv-cache-memory-bytes``, on a CPU
        ``VLLM_CPU_KVCACHE_SPACE``, else what profiling leaves of ``--gpu-memory-utilization``."""
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
        self.model_runner.capture_decode_graphs()

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output)

    def sleep(self, level: int) -> None:
        """Free the KV cache (level 1) and the weights too (level 2)."""
        if not self.config.model.is_pooling:
            self.model_runner.release_kv_cache()
        if level == 2:
            self.model_runner.release_weights()

    def wake_up(self, num_blocks: int) -> None:
        if self.model_runner.model is None:
            self.model_runner.load_model()
        self.initialize_cache(num_blocks)  # the old graphs went with the old cache
