"""The runtime's one resolved configuration: what the engine runs with, typed and frozen.

``ServeConfig`` (the schema's) is the user's word, validated once by the parser; the runtime
never reads it past ``engine_config.resolve_config``, which settles what it leaves open (context
length, dtype, block size, scheduler limits, sampling defaults) against the model and returns a
``RuntimeConfig``. Each part of the engine takes the piece it needs, as vLLM's ``VllmConfig``
hands out ``model_config``, ``cache_config`` and the rest. No component re-validates a schema
choice: the schema's choices and ranges already did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from infernetes.runtime.model_executor.compilation import CompilationSettings
from infernetes.runtime.model_executor.cuda_graph import DecodeGraphSettings
from infernetes.runtime.model_executor.loader import ModelInfo


@dataclass(frozen=True)
class ModelConfig:
    info: ModelInfo  # path, HF config, architecture, dtype, max_model_len, pooling
    max_logprobs: int
    seed: int | None
    quantization: str | None
    default_sampling_params: Mapping[str, Any] = field(default_factory=dict)
    eos_token_id: int | None = None
    extra_eos_token_ids: frozenset[int] = frozenset()
    enable_prompt_embeds: bool = False  # requests may give their prompt as embeddings
    # a vision-language model's: most items per prompt by modality (--limit-mm-per-prompt; a
    # modality left out has no limit) and the processor's settings (--mm-processor-kwargs)
    limit_mm_per_prompt: Mapping[str, int] = field(default_factory=dict)
    mm_processor_kwargs: Mapping[str, Any] = field(default_factory=dict)
    mm_processor_cache_gb: float = 0.0  # the processor cache's bound (--mm-processor-cache-gb)
    # --logits-processors: qualified class names, built in each worker (logits_processor.py)
    logits_processors: tuple[str, ...] = ()

    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.info.hf_config.get_text_config().vocab_size

    @property
    def is_pooling(self) -> bool:
        return self.info.is_pooling


@dataclass(frozen=True)
class CacheConfig:
    block_size: int
    enable_prefix_caching: bool
    prefix_caching_hash_algo: str
    kv_cache_dtype: str  # "auto" or an fp8 name
    calculate_kv_scales: bool
    gpu_memory_utilization: float
    num_gpu_blocks_override: int | None
    kv_cache_memory_bytes: int | None
    cpu_kv_cache_bytes: int  # VLLM_CPU_KVCACHE_SPACE


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    max_num_partial_prefills: int = 1
    max_long_partial_prefills: int = 1
    long_prefill_token_threshold: int = 0  # 0: no cap on a prefill chunk
    policy: str = "fcfs"  # or "priority"
    max_loras: int = 0  # distinct adapters among the running requests (0: LoRA off)
    # --async-scheduling: the next step is scheduled while the workers run this one
    async_scheduling: bool = False
    # multimodal items' encoder tokens one step may encode, and the encoder outputs the workers
    # may hold between steps (vLLM's; neither is a flag there): 0, max_num_batched_tokens
    max_num_encoder_input_tokens: int = 0
    encoder_cache_size: int = 0


@dataclass(frozen=True)
class ParallelConfig:
    """How many ranks the model runs on, and what starts them: ``uni`` runs the one rank in the
    engine core's process, ``mp`` one worker process per rank (the default above one rank),
    ``ray`` one Ray actor per rank."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str = "uni"
    layer_partition: tuple[int, ...] | None = None  # VLLM_PP_LAYER_PARTITION: layers per stage
    data_parallel_size: int = 1  # engine cores, each with world_size devices of its own
    data_parallel_rank: int = 0  # this engine core's index among them
    # --enable-expert-parallel: whole experts per tensor-parallel rank instead of slices of all
    expert_parallel: bool = False
    # --nnodes: the ranks are split evenly over nodes; node 0 runs the engine core and listens on
    # --master-addr:--master-port for the other nodes' ranks (runtime/executor/node_link.py)
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def local_world_size(self) -> int:
        """The ranks each node runs."""
        return self.world_size // self.nnodes

    @property
    def local_ranks(self) -> range:
        """The global ranks this node runs."""
        first = self.node_rank * self.local_world_size
        return range(first, first + self.local_world_size)

    @property
    def output_rank(self) -> int:
        """The rank whose sampled tokens are the step's: the first of the last pipeline stage."""
        return self.world_size - self.tensor_parallel_size


@dataclass(frozen=True)
class DeviceConfig:
    device: torch.device
    attention_backend: (
        str | None
    )  # --attention-backend; None: VLLM_ATTENTION_BACKEND or the default
    cpu_threads_bind: str | None = None  # VLLM_CPU_OMP_THREADS_BIND (worker/cpu_binding.py)


@dataclass(frozen=True)
class LoadConfig:
    load_format: str
    ignore_patterns: tuple[str, ...]
    use_tqdm_on_load: bool
    cpu_offload_bytes: int = 0  # --cpu-offload-gb: decoder layers kept in host memory


@dataclass(frozen=True)
class LoRAConfig:
    max_loras: int  # device slots: most adapters in one step
    max_lora_rank: int
    max_cpu_loras: int  # adapters kept read on the CPU


@dataclass(frozen=True)
class KVTransferConfig:
    """--kv-transfer-config: the connector by name (``kv_transfer/registry.py``), this engine's
    part in the transfer, and the connector's own settings."""

    kv_connector: str
    kv_role: str  # kv_producer, kv_consumer or kv_both
    kv_connector_extra_config: Mapping[str, Any] = field(default_factory=dict)
    engine_id: str = ""  # this engine's name to the others (a disaggregated prefill's producer)


@dataclass(frozen=True)
class SpeculativeConfig:
    """--speculative-config: up to ``num_speculative_tokens`` drafts a step, from n-gram prompt
    lookup (``spec_decode/ngram.py``: the longest match of ``prompt_lookup_max`` down to
    ``prompt_lookup_min`` last tokens) or from a smaller draft model sharing the target's
    vocabulary or an EAGLE-1 or EAGLE-3 head (``spec_decode/draft_model.py``)."""

    method: str  # "ngram", "draft_model", "eagle", "eagle3" or "mtp"
    num_speculative_tokens: int
    prompt_lookup_min: int = 0  # ngram only
    prompt_lookup_max: int = 0  # ngram only
    draft_model: str | None = None  # draft_model: the checkpoint as given (a path or hub id)
    draft_max_model_len: int | None = None  # as given; None: the target's (or the draft's less)
    # the draft checkpoint resolved against the target (engine_config); None until then
    draft: ModelInfo | None = None
    # no drafts are verified in a step that runs at least this many requests (None: always)
    disable_by_batch_size: int | None = None


@dataclass(frozen=True)
class KVEventsConfig:
    """--kv-events-config, vLLM's ``KVEventsConfig`` with its defaults filled in: events are
    published when ``enable_kv_cache_events`` is on and ``publisher`` is ``zmq``
    (``kv_events/publisher.py``); ``endpoint`` and ``replay_endpoint`` as given, before the data
    parallel rank's port offset."""

    enable_kv_cache_events: bool = False
    publisher: str = "null"  # "zmq" or "null"; unset: zmq when events are enabled
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # the PUB socket's high-water mark
    max_queue_size: int = 100_000  # batches waiting for the publisher thread (0: no bound)
    topic: str = ""

    @property
    def publishes(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"


@dataclass(frozen=True)
class RuntimeConfig:
    model: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    parallel: ParallelConfig
    device: DeviceConfig
    load: LoadConfig
    compilation: CompilationSettings
    decode_graphs: DecodeGraphSettings | None  # None: CUDA graphs off
    lora: LoRAConfig | None = None  # None: without --enable-lora
    kv_transfer: KVTransferConfig | None = None  # None: without --kv-transfer-config
    speculative: SpeculativeConfig | None = None  # None: without --speculative-config
    kv_events: KVEventsConfig | None = None  # None: without --kv-events-config
