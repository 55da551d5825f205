"""How the runtime treats each serve argument and each environment variable: the one table.

Every current ``Arg`` (by dest) and every ``EnvVar`` (by name) has an entry here, and nowhere else
is it written down (tests check both). An entry is one of:

- ``HONOURED``: does what vLLM's does; ``honoured(note)`` with a limit the reference shows.
- ``partial(values, reason)``: honoured for ``values``; any other value is refused, or with
  ``others="no_effect"`` accepted with a warning (the runtime falls back to a default).
- ``no_effect(reason)``: accepted; a value other than the default logs one warning saying why.
- ``refused(reason)``: only the default works; any other value stops ``serve`` with exit 2.

``infernetes.schema.support_check`` applies the table to a configuration and an environment; the
operator's CRD narrows its fields by it. Moving an argument from refused to honoured is a change of
its entry here, together with the code and the test that make it true.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["honoured", "partial", "no_effect", "refused"]


@dataclass(frozen=True)
class Support:
    kind: Kind
    reason: str = ""
    values: tuple[Any, ...] = ()
    others: Literal["refused", "no_effect"] = "refused"  # for "partial": the values not listed


HONOURED = Support("honoured")


def honoured(note: str) -> Support:
    """Honoured, with a limit worth reading (a combination refused by a rule, a caveat)."""
    return Support("honoured", note)


def partial(
    values: tuple[Any, ...], reason: str, others: Literal["refused", "no_effect"] = "refused"
) -> Support:
    return Support("partial", reason, tuple(values), others)


def no_effect(reason: str) -> Support:
    return Support("no_effect", reason)


def refused(reason: str) -> Support:
    return Support("refused", reason)


# Reasons shared by several entries.
DP_PLANNED = (
    "multi-node data parallelism is planned, not built yet: --data-parallel-size runs its engine "
    "cores on this node"
)
PROMPT_ADAPTERS = "prompt adapters are not supported (vLLM has removed them too)"
TEXT_ONLY = "the models served here take text only: there are no images, audio or video to process"
V0_ONLY = "a vLLM V0 scheduler setting; V1, which this engine follows, ignores it too"
RAY_PLAIN = "the Ray executor calls each rank's actor directly (no compiled graph, no SPMD workers)"
WORKER_PROCESSES = (
    "worker processes start from the engine core with a rendezvous on 127.0.0.1 and a free port, "
    "or across nodes on --master-addr and --master-port"
)
NO_KERNEL = "it selects a kernel this engine does not have (its own Triton kernels run instead)"
OTHER_HARDWARE = (
    "it only matters on hardware this engine does not target (TPU, HPU, Neuron, OpenVINO, ROCm)"
)
BUILD_TIME = "a build-time variable of vLLM's own compilation; nothing here is built from it"
VLLM_TESTS = "a switch of vLLM's own test suite"
NO_USAGE_STATS = "this server collects and sends no usage statistics"

ARG_SUPPORT: dict[str, Support] = {
    # ---------------------------------------------------------------- frontend
    "host": HONOURED,
    "port": HONOURED,
    "uvicorn_log_level": HONOURED,
    "disable_uvicorn_access_log": HONOURED,
    "allow_credentials": HONOURED,
    "allowed_origins": HONOURED,
    "allowed_methods": HONOURED,
    "allowed_headers": HONOURED,
    "api_key": HONOURED,
    "lora_modules": HONOURED,
    "prompt_adapters": refused(PROMPT_ADAPTERS),
    "chat_template": HONOURED,
    "trust_request_chat_template": HONOURED,
    "chat_template_content_format": HONOURED,
    "response_role": HONOURED,
    "ssl_keyfile": HONOURED,
    "ssl_certfile": HONOURED,
    "ssl_ca_certs": HONOURED,
    "enable_ssl_refresh": HONOURED,
    "ssl_cert_reqs": HONOURED,
    "root_path": HONOURED,
    "middleware": HONOURED,
    "return_tokens_as_token_ids": HONOURED,
    "disable_frontend_multiprocessing": no_effect(
        "the HTTP server always runs in the main process; the engine core's own process is "
        "VLLM_ENABLE_V1_MULTIPROCESSING"
    ),
    "enable_request_id_headers": HONOURED,
    "enable_auto_tool_choice": HONOURED,
    "tool_call_parser": partial(
        ("hermes", "llama3_json", "llama4_json", "mistral", "pythonic", "qwen", "qwen3_coder"),
        "the other parsers are not built yet",
    ),
    "tool_parser_plugin": refused(
        "tool-parser plugins are not loaded; use a built-in --tool-call-parser"
    ),
    "log_config_file": HONOURED,
    "max_log_len": HONOURED,
    "disable_fastapi_docs": HONOURED,
    "enable_prompt_tokens_details": HONOURED,
    "enable_server_load_tracking": HONOURED,
    "enable_tokenizer_info_endpoint": HONOURED,
    "enable_log_requests": HONOURED,
    "max_concurrency": HONOURED,
    "shutdown_timeout": HONOURED,
    "reasoning_effort": HONOURED,
    "api_server_count": partial((1,), "one API server process serves every engine core"),
    "headless": HONOURED,  # with --nnodes > 1 and --node-rank > 0 (schema/rules.py)
    "data_parallel_start_rank": refused(DP_PLANNED),
    # ---------------------------------------------------------------- ModelConfig
    "model": HONOURED,
    "task": partial(
        ("auto", "generate", "embedding", "embed", "classify", "score"),
        "generation, embeddings and cross-encoders (classify, score) are served; reward, "
        "transcription and draft models are not yet",
    ),
    "tokenizer": HONOURED,
    "hf_config_path": HONOURED,
    "tokenizer_mode": partial(
        ("auto", "slow"), "the mistral and custom tokenizer modes are not built yet"
    ),
    "skip_tokenizer_init": HONOURED,
    "revision": HONOURED,
    "code_revision": refused(
        "remote code is loaded at --revision; a separate code revision is not supported"
    ),
    "tokenizer_revision": HONOURED,
    "trust_remote_code": HONOURED,
    "allowed_local_media_path": no_effect(TEXT_ONLY),
    "config_format": partial(("auto", "hf"), "only Hugging Face config.json is read"),
    "dtype": HONOURED,
    "max_model_len": HONOURED,
    "seed": HONOURED,
    "max_logprobs": HONOURED,
    "disable_sliding_window": HONOURED,
    "disable_cascade_attn": no_effect(
        "cascade attention is a FlashAttention path this engine does not have"
    ),
    "disable_log_stats": HONOURED,
    "quantization": partial(
        ("awq", "awq_marlin", "compressed-tensors", "fp8", "gptq", "gptq_marlin"),
        "pre-quantized checkpoints of these methods load (the method is read from the "
        "checkpoint's quantization_config; a different --quantization is refused); on the GPU "
        "(Triton) path packed int4/int8 and fp8 weights, MoE experts included, stay as stored and "
        "run quantized GEMMs, on the CPU they are dequantised to the model dtype at load (gpt-oss's "
        "mxfp4 checkpoints everywhere; see docs/quantization.md); fp8 of an unquantised "
        "checkpoint quantises it online",
    ),
    "rope_scaling": HONOURED,
    "rope_theta": HONOURED,
    "hf_token": HONOURED,
    "hf_overrides": HONOURED,
    "enforce_eager": HONOURED,
    "max_seq_len_to_capture": HONOURED,
    "served_model_name": HONOURED,
    "logits_processor_pattern": refused("logits processors named by requests are not loaded"),
    "generation_config": HONOURED,
    "override_generation_config": HONOURED,
    "override_neuron_config": no_effect(OTHER_HARDWARE),
    "override_pooler_config": refused("pooler overrides are not supported yet"),
    "enable_sleep_mode": honoured(
        "sleep level 1 moves the weights to host memory (on a CPU they stay where they are) and "
        "level 2 drops them (read from the checkpoint on waking); the /sleep, /wake_up?tags=, "
        "/is_sleeping and /collective_rpc routes need VLLM_SERVER_DEV_MODE=1"
    ),
    "model_impl": HONOURED,
    "enable_prompt_embeds": honoured(
        "the offline LLM takes {'prompt_embeds': tensor} on the Llama and Gemma families, "
        "Mistral, Qwen2/3, Phi-3, the Qwen and Mixtral MoEs and DeepSeek (other models refuse "
        "such a request); the completions API takes prompt_embeds as vLLM does (base64 of a "
        "torch.save'd tensor, read with weights_only=True; not with echo)"
    ),
    "disable_async_output_proc": no_effect(
        "V1 has no async output processor to disable; vLLM V1 ignores it too"
    ),
    "attention_backend": partial(
        ("auto", "TRITON_ATTN", "TORCH_SDPA"),
        "FLASH_ATTN, FLASHINFER and XFORMERS are not built here: the device's "
        "default backend runs instead",
        others="no_effect",
    ),
    # ---------------------------------------------------------------- LoadConfig
    "load_format": partial(
        ("auto", "pt", "safetensors", "dummy"), "the other weight formats are not supported yet"
    ),
    "download_dir": HONOURED,
    "model_loader_extra_config": refused("no model loader here takes extra settings"),
    "ignore_patterns": HONOURED,
    "use_tqdm_on_load": HONOURED,
    "pt_load_map_location": partial(("cpu",), "weights load to the CPU, then move to the device"),
    # ---------------------------------------------------------------- DecodingConfig
    "guided_decoding_backend": partial(
        ("auto", "guidance"), "structured output runs on llguidance (guidance)"
    ),
    "guided_decoding_disable_fallback": no_effect(
        "there is one backend (guidance), so nothing to fall back from"
    ),
    "guided_decoding_disable_any_whitespace": HONOURED,
    "guided_decoding_disable_additional_properties": refused(
        "not supported by the guidance backend here yet"
    ),
    "structured_outputs_config": HONOURED,  # key by key: KEY_SUPPORT
    "reasoning_parser": partial(
        ("deepseek_r1", "qwen3"), "the other reasoning parsers are not built yet"
    ),
    # ---------------------------------------------------------------- ParallelConfig
    "distributed_executor_backend": partial(
        ("mp", "uni", "ray"),
        "mp starts one worker process per rank, uni runs one rank in the engine's process, ray "
        "one Ray actor per rank (where Ray is installed); ranks are never started by an external "
        "launcher (torchrun)",
    ),
    "pipeline_parallel_size": HONOURED,
    "tensor_parallel_size": HONOURED,
    "data_parallel_size": HONOURED,
    "data_parallel_size_local": refused(DP_PLANNED),
    "data_parallel_address": refused(DP_PLANNED),
    "data_parallel_rpc_port": refused(DP_PLANNED),
    "data_parallel_backend": partial(
        ("mp",), "data-parallel engine cores are processes of this node; Ray does not start them"
    ),
    "nnodes": HONOURED,
    "node_rank": HONOURED,
    "master_addr": HONOURED,
    "master_port": HONOURED,
    "enable_expert_parallel": HONOURED,
    "enable_eplb": refused("expert parallelism and its load balancer are planned, not built yet"),
    "enable_multimodal_encoder_data_parallel": no_effect(TEXT_ONLY),
    "max_parallel_loading_workers": no_effect(
        "each rank reads only its own shard, all ranks at once"
    ),
    "ray_workers_use_nsight": refused("Ray's workers are not run under Nsight here"),
    "disable_custom_all_reduce": no_effect(
        "there is no custom all-reduce here: torch.distributed's (NCCL, gloo) always runs"
    ),
    "worker_cls": refused("custom worker classes are not loaded"),
    "worker_extension_cls": refused("worker extensions are not loaded"),
    # ---------------------------------------------------------------- CacheConfig
    "block_size": HONOURED,
    "gpu_memory_utilization": HONOURED,
    "kv_cache_memory_bytes": HONOURED,
    "swap_space": no_effect(
        "preempted requests are recomputed, never swapped to the CPU; vLLM V1 ignores it too"
    ),
    "kv_cache_dtype": HONOURED,
    "num_gpu_blocks_override": HONOURED,
    "enable_prefix_caching": HONOURED,
    "prefix_caching_hash_algo": HONOURED,
    "cpu_offload_gb": refused("weight offloading to the CPU is not supported yet"),
    "calculate_kv_scales": HONOURED,
    "kv_sharing_fast_prefill": refused("KV sharing across layers is not supported yet"),
    # ---------------------------------------------------------------- MultiModalConfig
    "limit_mm_per_prompt": no_effect(TEXT_ONLY),
    "mm_processor_kwargs": no_effect(TEXT_ONLY),
    "disable_mm_preprocessor_cache": no_effect(TEXT_ONLY),
    # ---------------------------------------------------------------- LoRAConfig
    "enable_lora": HONOURED,
    "enable_lora_bias": refused(
        "adapters with trained biases are not served (one with bias other than 'none' is refused "
        "when it loads)"
    ),
    "max_loras": HONOURED,
    "max_lora_rank": HONOURED,
    "lora_extra_vocab_size": no_effect(
        "adapters that add vocabulary are not served (one with embedding weights is refused when "
        "it loads)"
    ),
    "lora_dtype": no_effect("adapter weights are kept in the model's dtype"),
    "long_lora_scaling_factors": refused(
        "long-context LoRA adapters (rope scaling per adapter) are not served"
    ),
    "max_cpu_loras": HONOURED,
    "fully_sharded_loras": refused(
        "the fully sharded LoRA path is not built; under tensor parallelism adapters shard as "
        "vLLM's default does (A whole on column-parallel layers, B whole on row-parallel ones)"
    ),
    # ---------------------------------------------------------------- PromptAdapterConfig
    "enable_prompt_adapter": refused(PROMPT_ADAPTERS),
    "max_prompt_adapters": no_effect(PROMPT_ADAPTERS),
    "max_prompt_adapter_token": no_effect(PROMPT_ADAPTERS),
    # ---------------------------------------------------------------- DeviceConfig
    "device": partial(("auto", "cpu", "cuda"), "NVIDIA GPUs and CPUs are the targets"),
    # ---------------------------------------------------------------- SpeculativeConfig
    "speculative_config": honoured(
        "n-gram prompt lookup (method ngram, with num_speculative_tokens, prompt_lookup_min and "
        "prompt_lookup_max) is built; draft models, EAGLE, MTP and the other methods are "
        "refused (speculative_config.method), as is --async-scheduling with it"
    ),
    # ---------------------------------------------------------------- ObservabilityConfig
    "show_hidden_metrics_for_version": HONOURED,
    "otlp_traces_endpoint": honoured(
        "one span per request of the HTTP server (llm_request, vLLM's gen_ai.* attributes), "
        "continuing the request's traceparent; OTLP over gRPC, or HTTP with "
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf; the offline LLM class exports none"
    ),
    "collect_detailed_traces": honoured(
        "model: gen_ai.latency.time_in_model_forward (waits for the device after each forward); "
        "worker: gen_ai.latency.time_in_model_execute; all: both"
    ),
    # ---------------------------------------------------------------- SchedulerConfig
    "max_num_batched_tokens": HONOURED,
    "max_num_seqs": HONOURED,
    "max_num_partial_prefills": HONOURED,
    "max_long_partial_prefills": HONOURED,
    "long_prefill_token_threshold": HONOURED,
    "num_lookahead_slots": no_effect("only speculative decoding uses lookahead slots"),
    "scheduler_delay_factor": no_effect(V0_ONLY),
    "enable_chunked_prefill": HONOURED,
    "preemption_mode": partial(
        ("recompute",), "preempted requests are recomputed; swapping is not supported"
    ),
    "num_scheduler_steps": no_effect(V0_ONLY),
    "multi_step_stream_outputs": no_effect(V0_ONLY),
    "scheduling_policy": HONOURED,
    "scheduler_cls": refused("custom scheduler classes are not loaded"),
    "disable_chunked_mm_input": no_effect(TEXT_ONLY),
    "disable_hybrid_kv_cache_manager": no_effect(
        "every layer shares one KV cache layout: there is no hybrid manager"
    ),
    "cuda_graph_sizes": HONOURED,
    "async_scheduling": honoured(
        "not with --pipeline-parallel-size above 1 (refused, naming both flags); a finished "
        "request may run one more step whose token is discarded"
    ),
    # ---------------------------------------------------------------- VllmConfig
    "kv_transfer_config": honoured(
        "kv_connector names a connector built here (RecordingConnector only: a debug connector "
        "that records the calls and moves no KV, so disaggregated prefill and KV offloading are "
        "not supported yet); kv_role is kv_producer, kv_consumer or kv_both; "
        "kv_connector_extra_config goes to the connector; the other keys are refused at startup; "
        "CUDA graphs are off with a connector"
    ),
    "kv_events_config": honoured(
        "vLLM's keys and defaults; events (BlockStored, BlockRemoved, AllBlocksCleared) go out on "
        "a ZMQ PUB socket with a ROUTER replay socket, block hashes as unsigned 64-bit integers "
        "(vLLM's default); a batch that finds the publisher's queue full is dropped and counted "
        "(vllm:kv_events_dropped) rather than holding up the step"
    ),
    "compilation_config": HONOURED,
    "additional_config": no_effect("platform plugins read it; there are none here"),
}

# Keys of JSON arguments, as "dest.key": judged like arguments when the key is given.
KEY_SUPPORT: dict[str, Support] = {
    # The same names as runtime/kv_transfer/registry.py's CONNECTORS (a test keeps them equal).
    "kv_transfer_config.kv_connector": partial(
        ("RecordingConnector",),
        "the connectors that move KV (NixlConnector, LMCacheConnectorV1, OffloadingConnector, "
        "...) are not built yet",
    ),
    # The same names as runtime/kv_events/publisher.py's PUBLISHERS (a test keeps them equal).
    "kv_events_config.publisher": partial(
        ("null", "zmq"), "publisher plugins (vLLM's register_publisher) are not loaded"
    ),
    "speculative_config.method": partial(
        ("ngram", "[ngram]"),
        "n-gram prompt lookup is the one method built; draft_model, eagle, eagle3, mtp, "
        "medusa, mlp_speculator and suffix are planned",
    ),
    # vLLM reads model "ngram" / "[ngram]" (the deprecated --speculative-model) as the method
    "speculative_config.model": partial(
        ("ngram", "[ngram]"), "draft models are planned: n-gram prompt lookup needs none"
    ),
    "structured_outputs_config.backend": partial(
        ("auto", "guidance"), "structured output runs on llguidance (guidance)"
    ),
    "structured_outputs_config.disable_fallback": no_effect(
        "there is one backend (guidance), so nothing to fall back from"
    ),
    "structured_outputs_config.disable_any_whitespace": HONOURED,
    "structured_outputs_config.disable_additional_properties": refused(
        "not supported by the guidance backend here yet"
    ),
    "structured_outputs_config.reasoning_parser": partial(
        ("", "deepseek_r1", "qwen3"), "the other reasoning parsers are not built yet"
    ),
    "structured_outputs_config.enable_in_reasoning": refused(
        "constraining the reasoning section is not built yet: the grammar applies from the "
        "first generated token"
    ),
}

ENV_SUPPORT: dict[str, Support] = {
    # Build-time variables of vLLM's own build.
    **{
        name: no_effect(BUILD_TIME)
        for name in (
            "VLLM_TARGET_DEVICE",
            "MAX_JOBS",
            "NVCC_THREADS",
            "VLLM_USE_PRECOMPILED",
            "VLLM_TEST_USE_PRECOMPILED_NIGHTLY_WHEEL",
            "CMAKE_BUILD_TYPE",
            "VERBOSE",
            "CUDA_HOME",
        )
    },
    # Read by the libraries underneath (CUDA, huggingface_hub, torch, the dynamic loader).
    "HF_TOKEN": HONOURED,
    "CUDA_VISIBLE_DEVICES": HONOURED,
    "OMP_NUM_THREADS": HONOURED,
    "LD_LIBRARY_PATH": HONOURED,
    "LOCAL_RANK": no_effect("each worker's rank is given to it by the engine core"),
    # Paths.
    "VLLM_CONFIG_ROOT": no_effect("nothing here reads configuration from it"),
    "VLLM_CACHE_ROOT": HONOURED,
    "VLLM_ASSETS_CACHE": no_effect(TEXT_ONLY),
    "VLLM_XLA_CACHE_PATH": no_effect(OTHER_HARDWARE),
    "VLLM_RPC_BASE_PATH": no_effect(
        "the engine core talks over a multiprocessing pipe, not IPC sockets"
    ),
    "VLLM_TORCH_PROFILER_DIR": no_effect("there are no profiler routes yet"),
    "VLLM_USE_MODELSCOPE": refused("models load from local folders or the Hugging Face hub only"),
    "S3_ACCESS_KEY_ID": no_effect("there is no S3 model loader (runai_streamer) here"),
    "S3_SECRET_ACCESS_KEY": no_effect("there is no S3 model loader (runai_streamer) here"),
    "S3_ENDPOINT_URL": no_effect("there is no S3 model loader (runai_streamer) here"),
    "VLLM_CI_USE_S3": no_effect(VLLM_TESTS),
    # Distributed execution.
    "VLLM_HOST_IP": no_effect(WORKER_PROCESSES),
    "VLLM_PORT": no_effect(WORKER_PROCESSES),
    "VLLM_NCCL_SO_PATH": no_effect("torch.distributed loads the NCCL that PyTorch ships"),
    "VLLM_CUDART_SO_PATH": no_effect(
        "there is no custom all-reduce that loads the CUDA runtime itself"
    ),
    "VLLM_WORKER_MULTIPROC_METHOD": no_effect(
        "workers are always fresh interpreters (as with spawn), never forks"
    ),
    "VLLM_PP_LAYER_PARTITION": HONOURED,
    "VLLM_SKIP_P2P_CHECK": no_effect("there is no custom all-reduce whose P2P check to skip"),
    "VLLM_DISABLE_CUSTOM_ALL_REDUCE": no_effect(
        "there is no custom all-reduce here: torch.distributed's (NCCL, gloo) always runs"
    ),
    "VLLM_DP_RANK": refused(DP_PLANNED),
    "VLLM_DP_SIZE": refused(DP_PLANNED),
    "VLLM_DP_MASTER_IP": refused(DP_PLANNED),
    "VLLM_DP_MASTER_PORT": refused(DP_PLANNED),
    "VLLM_RAY_PER_WORKER_GPUS": HONOURED,
    "VLLM_RAY_BUNDLE_INDICES": no_effect(
        "the Ray executor reserves a placement group of its own, one bundle per rank in rank order"
    ),
    **{
        name: no_effect(RAY_PLAIN)
        for name in (
            "VLLM_USE_RAY_SPMD_WORKER",
            "VLLM_USE_RAY_COMPILED_DAG",
            "VLLM_USE_RAY_COMPILED_DAG_NCCL_CHANNEL",
            "VLLM_USE_RAY_COMPILED_DAG_OVERLAP_COMM",
        )
    },
    "VLLM_RPC_TIMEOUT": HONOURED,
    "VLLM_INSTANCE_ID": no_effect("nothing here is keyed by an instance id"),
    # The server.
    "VLLM_API_KEY": HONOURED,
    "VLLM_ENGINE_ITERATION_TIMEOUT_S": HONOURED,
    "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": HONOURED,
    "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": HONOURED,
    "VLLM_SERVER_DEV_MODE": HONOURED,
    "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": partial(
        (True,),
        "KV-cache event block hashes go out as unsigned 64-bit integers (runtime/kv_events/); "
        "raw digests are not sent",
    ),
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": HONOURED,
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": HONOURED,
    "VLLM_IMAGE_FETCH_TIMEOUT": no_effect(TEXT_ONLY),
    "VLLM_VIDEO_FETCH_TIMEOUT": no_effect(TEXT_ONLY),
    "VLLM_AUDIO_FETCH_TIMEOUT": no_effect(TEXT_ONLY),
    "VLLM_MM_INPUT_CACHE_GIB": no_effect(TEXT_ONLY),
    "VLLM_XGRAMMAR_CACHE_MB": no_effect("structured output runs on llguidance, not xgrammar"),
    "VLLM_V0_USE_OUTLINES_CACHE": no_effect("structured output runs on llguidance, not outlines"),
    "VLLM_LOGITS_PROCESSOR_THREADS": no_effect(
        "logits processors run in the engine step's own thread"
    ),
    "VLLM_V1_OUTPUT_PROC_CHUNK_SIZE": no_effect(
        "outputs cross to the API process as one message per step"
    ),
    "VLLM_RINGBUFFER_WARNING_INTERVAL": no_effect("there is no shared-memory ring buffer"),
    "VLLM_PLUGINS": no_effect("there is no plugin system"),
    "VLLM_USAGE_STATS_SERVER": no_effect(NO_USAGE_STATS),
    "VLLM_NO_USAGE_STATS": no_effect(NO_USAGE_STATS),
    "VLLM_DO_NOT_TRACK": no_effect(NO_USAGE_STATS),
    "VLLM_USAGE_SOURCE": no_effect(NO_USAGE_STATS),
    # Logging.
    "VLLM_CONFIGURE_LOGGING": HONOURED,
    "VLLM_LOGGING_CONFIG_PATH": HONOURED,
    "VLLM_LOGGING_LEVEL": HONOURED,
    "VLLM_LOGGING_PREFIX": HONOURED,
    "VLLM_TRACE_FUNCTION": no_effect("function tracing is not built"),
    "VLLM_LOG_BATCHSIZE_INTERVAL": no_effect("batch sizes are reported by the periodic stats line"),
    "VLLM_NO_DEPRECATION_WARNING": no_effect("deprecated flags always print their notice"),
    # Engine and kernels.
    "VLLM_USE_V1": partial((True,), "the engine is V1-shaped; there is no V0 engine"),
    "VLLM_ATTENTION_BACKEND": partial(
        ("TRITON_ATTN", "TORCH_SDPA"),
        "FLASH_ATTN, FLASHINFER and XFORMERS are not built here: the device's "
        "default backend runs instead",
        others="no_effect",
    ),
    "VLLM_ENABLE_V1_MULTIPROCESSING": HONOURED,
    "VLLM_CPU_KVCACHE_SPACE": HONOURED,
    **{
        name: no_effect(NO_KERNEL)
        for name in (
            "VLLM_USE_TRITON_FLASH_ATTN",
            "VLLM_FLASH_ATTN_VERSION",
            "VLLM_USE_FLASHINFER_SAMPLER",
            "VLLM_FLASHINFER_FORCE_TENSOR_CORES",
            "VLLM_USE_FLASHINFER_MOE_FP8",
            "VLLM_USE_FLASHINFER_MOE_FP16",
            "VLLM_FLASHINFER_MOE_BACKEND",
            "VLLM_USE_DEEP_GEMM",
            "VLLM_MLA_DISABLE",
            "VLLM_FUSED_MOE_CHUNK_SIZE",
            "VLLM_ENABLE_MOE_ALIGN_BLOCK_SIZE_TRITON",
            "VLLM_USE_TRITON_AWQ",
            "VLLM_MARLIN_USE_ATOMIC_ADD",
            "VLLM_DISABLED_KERNELS",
            "VLLM_CPU_MOE_PREPACK",
        )
    },
    "Q_SCALE_CONSTANT": no_effect(
        "KV scales are measured from the first batch (--calculate-kv-scales)"
    ),
    "K_SCALE_CONSTANT": no_effect(
        "KV scales are measured from the first batch (--calculate-kv-scales)"
    ),
    "V_SCALE_CONSTANT": no_effect(
        "KV scales are measured from the first batch (--calculate-kv-scales)"
    ),
    **{
        name: no_effect(VLLM_TESTS)
        for name in (
            "VLLM_TEST_DYNAMO_FULLGRAPH_CAPTURE",
            "VLLM_TEST_FORCE_FP8_MARLIN",
            "VLLM_TEST_FORCE_LOAD_FORMAT",
            "VLLM_TEST_FORCE_MIXED_CHUNKED_PREFILL",
        )
    },
    "VLLM_USE_DUMMY_WEIGHTS": no_effect("use --load-format dummy"),
    "VLLM_CPU_OMP_THREADS_BIND": honoured(
        "auto, all, nobind or CPU lists per rank (0-3|4-7): the rank's threads are bound there and "
        "run one intra-op thread per CPU; unset leaves torch's own placement"
    ),
    **{
        name: no_effect(OTHER_HARDWARE)
        for name in (
            "VLLM_SKIP_WARMUP",
            "VLLM_ROCM_FP8_PADDING",
            "VLLM_OPENVINO_DEVICE",
            "VLLM_OPENVINO_KVCACHE_SPACE",
            "VLLM_OPENVINO_CPU_KV_CACHE_PRECISION",
            "VLLM_OPENVINO_ENABLE_QUANTIZED_WEIGHTS",
            "VLLM_XLA_CHECK_RECOMPILATION",
            "VLLM_TPU_DISABLE_TOPK_TOPP_OPTIMIZATION",
            "VLLM_USE_HPU_CONTIGUOUS_CACHE_FETCH",
        )
    },
}
