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

from infernetes.schema.rules import STRUCTURED_OUTPUT_BACKENDS

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
STRUCTURED_OUTPUT_BACKEND_NOTE = (
    "auto (xgrammar, falling back to guidance for a constraint xgrammar cannot take, as in "
    "vLLM), xgrammar or guidance (llguidance)"
)
REASONING_NOT_BUILT = (
    "the other reasoning parsers are not built yet; openai_gptoss (gpt-oss's harmony format, "
    "read with openai-harmony) needs o200k_base.tiktoken in the folder TIKTOKEN_ENCODINGS_BASE "
    "names, else it downloads it"
)
DP_PLANNED = (
    "multi-node data parallelism is planned, not built yet: --data-parallel-size runs its engine "
    "cores on this node"
)
PROMPT_ADAPTERS = "prompt adapters are not supported (vLLM has removed them too)"
VIDEO_PRUNING = "video pruning (EVS) is not built: a video keeps every one of its tokens"
VISION_TOWER = (
    "the vision tower runs replicated on every rank in eager torch (SDPA attention in the model "
    "dtype); its own parallel modes, backends and fp8 are not built"
)
MM_PLANNED = "planned, not built yet for the vision-language models served here"
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
NO_GRPC = "there is no gRPC server: the OpenAI HTTP API is the one frontend"
NO_LAYER = "linear-attention layers (gated delta net, Kimi delta attention) are not built here"
COHERE = "there is no Cohere API here"
DP_SUPERVISOR = "there is no data-parallel supervisor (external load balancing is not built)"
H11 = "the server speaks HTTP/1.1 through httptools, not h11"
NO_SSM = (
    "Mamba (state-space) models are not served here: neither their kernels nor their state cache "
    "are built"
)
NUMA = "workers are not bound to NUMA nodes"
CONTEXT_PARALLEL = (
    "context parallelism is not built: each tensor-parallel rank attends over the whole sequence"
)
EPLB_PLANNED = (
    "the expert-parallel load balancer (and elastic expert parallelism) is planned, not built "
    "yet; --enable-expert-parallel itself is built (experts split over the ranks in order)"
)
EP_ALL2ALL = "expert parallelism moves no tokens all-to-all here"
PREFETCH_OFFLOAD = (
    "the prefetch weight-offload backend (groups of layers whose weights are fetched some layers "
    "ahead) is planned, not built yet; --cpu-offload-gb (the uva backend's budget) is built"
)
OPT_LEVEL = (
    "the compilation level is -O / --compilation-config's; the optimization level's other "
    "defaults are not built"
)

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
    "tool_call_parser": honoured(
        "every built-in name, and any name a --tool-parser-plugin file registers. openai "
        "(gpt-oss's harmony format; its analysis channel is reasoning_content with "
        "--reasoning-parser openai_gptoss) reads the output with openai-harmony, which needs "
        "o200k_base.tiktoken in the folder TIKTOKEN_ENCODINGS_BASE names (else it downloads "
        "it); the prompt is the model's chat template (gpt-oss's writes the harmony format), "
        "not openai-harmony's rendering, and built-in tools (browser, python) are not run"
    ),
    "tool_parser_plugin": honoured(
        "the file is run once at startup, as vLLM runs it; its parsers register with "
        "infernetes.runtime.server.tool_parsers.register_tool_parser on a subclass of that "
        "module's ToolParser. A plugin written for vLLM imports vllm and is refused with that "
        "reason"
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
    "api_server_count": HONOURED,  # runtime/server/api_servers.py
    "headless": HONOURED,  # with --nnodes > 1 and --node-rank > 0 (schema/rules.py)
    "data_parallel_start_rank": refused(DP_PLANNED),
    "grpc": refused(NO_GRPC),
    "aggregate_engine_logging": no_effect(
        "the stats line already sums the data-parallel engine cores' requests and averages their "
        "KV-cache usage"
    ),
    "fail_on_environ_validation": no_effect(
        "an unknown VLLM_* name is warned about, never an error (a malformed value of a known one "
        "stops the server in any case)"
    ),
    "trust_request_mm_kwargs": HONOURED,
    "default_chat_template_kwargs": HONOURED,
    "reasoning_effort_map": refused(
        "reasoning_effort is passed to the chat template as given; a map of effort names is not "
        "built yet"
    ),
    "exclude_tools_when_tool_choice_none": HONOURED,
    "tool_strict_level": refused("strict tool schemas are not enforced by a grammar here yet"),
    "tool_server": refused(
        "built-in tools (demo, MCP tool servers) are not built: the Responses API runs function "
        "tools only"
    ),
    "enable_per_request_metrics": refused("per-request metrics in responses are not built yet"),
    "enable_force_include_usage": HONOURED,
    "sse_keep_alive_interval": HONOURED,
    "enable_log_outputs": no_effect(
        "generated outputs are not logged (--enable-log-requests logs requests)"
    ),
    "enable_log_deltas": no_effect(
        "generated outputs are not logged, so there are no deltas to log"
    ),
    "cohere_is_reasoning_model": no_effect(COHERE),
    "cohere_format": no_effect(COHERE),
    "anthropic_disabled_thinking_effort": no_effect("there is no Anthropic Messages API here"),
    "log_error_stack": no_effect("the server logs the traceback of every internal error already"),
    "tokens_only": refused("a tokens-only (disaggregated renderer) server is not built"),
    "enable_scale_out": refused(DP_PLANNED),
    "fingerprint_mode": refused("the system_fingerprint field is not filled in yet"),
    "fingerprint_value": refused("the system_fingerprint field is not filled in yet"),
    "grpc_port": refused(NO_GRPC),
    "data_parallel_supervisor_port": no_effect(DP_SUPERVISOR),
    "dp_supervisor_probe_interval_s": no_effect(DP_SUPERVISOR),
    "dp_supervisor_probe_timeout_s": no_effect(DP_SUPERVISOR),
    "dp_supervisor_probe_failure_threshold": no_effect(DP_SUPERVISOR),
    "uds": HONOURED,
    "disable_access_log_for_endpoints": HONOURED,
    "ssl_ciphers": HONOURED,
    "h11_max_incomplete_event_size": no_effect(H11),
    "h11_max_header_count": no_effect(H11),
    "enable_offline_docs": no_effect(
        "the /docs page (--disable-fastapi-docs) loads its assets from FastAPI's default CDN"
    ),
    "enable_flash_late_interaction": no_effect(
        "late-interaction (ColBERT) scoring is not served here"
    ),
    # ---------------------------------------------------------------- ModelConfig
    "model": HONOURED,
    "task": partial(
        ("auto", "generate", "embedding", "embed", "classify", "score", "transcription"),
        "generation, embeddings, cross-encoders (classify, score) and transcription (Whisper) "
        "are served; reward and draft models are not yet",
    ),
    "tokenizer": HONOURED,
    "hf_config_path": HONOURED,
    "tokenizer_mode": partial(
        ("auto", "slow", "mistral"),
        "custom (a tokenizer registered by name in vLLM's registry) has no registry here; "
        "mistral reads the folder's tekken.json (a SentencePiece tokenizer.model.v* alone is "
        "refused)",
    ),
    "skip_tokenizer_init": HONOURED,
    "revision": HONOURED,
    "code_revision": refused(
        "remote code is loaded at --revision; a separate code revision is not supported"
    ),
    "tokenizer_revision": HONOURED,
    "trust_remote_code": HONOURED,
    "allowed_local_media_path": HONOURED,
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
        ("awq", "awq_marlin", "compressed-tensors", "fp8", "gguf", "gptq", "gptq_marlin"),
        "pre-quantized checkpoints of these methods load (the method is read from the "
        "checkpoint's quantization_config, gguf from a GGUF file; a different --quantization is "
        "refused); on the GPU (Triton) path packed int4/int8 and fp8 weights, MoE experts "
        "included, stay as stored and run quantized GEMMs; on the CPU packed int4/int8 linear "
        "layers and GGUF blocks stay packed for its C kernel and the rest is dequantised to the "
        "model dtype at load (GGUF blocks are dequantised on a GPU; gpt-oss's mxfp4 checkpoints "
        "everywhere; see docs/quantization.md); fp8 of an unquantised checkpoint quantises it "
        "online",
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
    "model_impl": honoured(
        "transformers runs transformers' own causal LMs and image-text-to-text models (images "
        "only, one rank, eagerly) on this engine's paged KV cache; auto does so for an "
        "architecture with no native implementation; M-RoPE models and those whose images "
        "attend both ways are refused with the reason (docs/multimodal.md)"
    ),
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
    "runner": partial(
        ("auto", "generate"),
        "the pooling runner follows --task (embed, classify, score) and the draft runner comes "
        "with draft-model speculation; choosing them here is not built yet",
    ),
    "convert": refused(
        "converting a generative checkpoint into an embedding or classification model is not built"
        " yet"
    ),
    "allowed_media_domains": HONOURED,
    "quantization_config": refused(
        "the quantization settings come from the checkpoint (and --quantization); overriding them "
        "is not built yet"
    ),
    "allow_deprecated_quantization": no_effect("no quantization method served here is deprecated"),
    "enable_return_routed_experts": refused(
        "returning the routed MoE experts with outputs is not built"
    ),
    "return_sampling_mask": refused("returning the sampling mask with outputs is not built"),
    "logprobs_mode": refused(
        "logprobs are computed the one way this sampler does; choosing the mode is not built yet"
    ),
    "use_fp64_gumbel": no_effect(
        "the sampler draws by inverse CDF from one uniform per row: there is no Gumbel noise"
    ),
    "enable_trace_replay": refused("replaying recorded request traces is not built"),
    "model_class_overrides": refused(
        "the model class follows the checkpoint's architectures; overriding it is not supported"
    ),
    "pooler_config": refused("pooler settings are not configurable yet"),
    "sleep_mode_backend": no_effect(
        "sleep and wake_up free and restore memory with torch's own allocator"
    ),
    "sleep_mode_offload_cudagraph": no_effect(
        "sleep and wake_up free and restore memory with torch's own allocator"
    ),
    "sleep_preserve_parameter_names": refused(
        "sleep keeps all or none of the weights; keeping named parameters is not built"
    ),
    "enable_cumem_allocator": no_effect("memory comes from torch's own caching allocator"),
    "enable_nccl_comm_suspend": no_effect(
        "NCCL communicators are not suspended while the engine sleeps"
    ),
    "logits_processors": honoured(
        "classes with vLLM V1's LogitsProcessor interface (infernetes.runtime.logits_processor), "
        "named module.Class or module:Class, built in each worker and given vllm_xargs as "
        "SamplingParams.extra_args; a class that imports vllm is refused (vLLM is not part of "
        "this server), as is the combination with --speculative-config (vLLM refuses it too)"
    ),
    "io_processor_plugin": refused("there is no plugin system"),
    "renderer_num_workers": no_effect("prompts are rendered in the API process's own thread pool"),
    # ---------------------------------------------------------------- LoadConfig
    "load_format": partial(
        ("auto", "pt", "safetensors", "dummy", "gguf"),
        "the other weight formats are not supported yet; gguf reads a .gguf file (also what "
        "auto does for one) with the config and tokenizer from its metadata, its tensors F32, "
        "F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K (docs/gguf.md)",
    ),
    "download_dir": HONOURED,
    "model_loader_extra_config": refused("no model loader here takes extra settings"),
    "ignore_patterns": HONOURED,
    "use_tqdm_on_load": HONOURED,
    "pt_load_map_location": partial(("cpu",), "weights load to the CPU, then move to the device"),
    "safetensors_load_strategy": no_effect("safetensors files are memory-mapped and read lazily"),
    "safetensors_prefetch_num_threads": no_effect(
        "safetensors files are memory-mapped, not prefetched"
    ),
    "safetensors_prefetch_block_size": no_effect(
        "safetensors files are memory-mapped, not prefetched"
    ),
    "offload_backend": partial(
        ("auto", "uva"),
        "auto and uva take --cpu-offload-gb: the offloaded layers' weights stay in host memory "
        "and are copied to the device for each forward (vLLM's fallback for uva; its kernels "
        "reading host memory in place are not built); " + PREFETCH_OFFLOAD,
    ),
    "cpu_offload_params": refused(
        "offloading chosen parameters by name is not built: --cpu-offload-gb offloads whole "
        "decoder layers from the first"
    ),
    "offload_group_size": refused(PREFETCH_OFFLOAD),
    "offload_num_in_group": refused(PREFETCH_OFFLOAD),
    "offload_prefetch_step": refused(PREFETCH_OFFLOAD),
    "offload_params": refused(PREFETCH_OFFLOAD),
    # ---------------------------------------------------------------- DecodingConfig
    "guided_decoding_backend": partial(STRUCTURED_OUTPUT_BACKENDS, STRUCTURED_OUTPUT_BACKEND_NOTE),
    "guided_decoding_disable_fallback": honoured(
        "auto keeps to xgrammar: a constraint it cannot take is a 400 instead of guidance's"
    ),
    "guided_decoding_disable_any_whitespace": HONOURED,
    "guided_decoding_disable_additional_properties": refused(
        "not supported by the guidance backend here yet"
    ),
    "structured_outputs_config": HONOURED,  # key by key: KEY_SUPPORT
    "reasoning_parser": partial(
        (
            "deepseek_r1",
            "deepseek_v3",
            "glm45",
            "glm47",
            "granite",
            "minimax_m2",
            "mistral",
            "openai_gptoss",
            "qwen3",
            "seed_oss",
        ),
        REASONING_NOT_BUILT,
    ),
    "reasoning_parser_plugin": refused(
        "reasoning-parser plugins are not loaded; use a built-in --reasoning-parser"
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
    "enable_eplb": refused(EPLB_PLANNED),
    "enable_multimodal_encoder_data_parallel": no_effect(VISION_TOWER),
    "max_parallel_loading_workers": no_effect(
        "each rank reads only its own shard, all ranks at once"
    ),
    "ray_workers_use_nsight": refused("Ray's workers are not run under Nsight here"),
    "disable_custom_all_reduce": no_effect(
        "there is no custom all-reduce here: torch.distributed's (NCCL, gloo) always runs"
    ),
    "worker_cls": refused("custom worker classes are not loaded"),
    "worker_extension_cls": refused("worker extensions are not loaded"),
    "distributed_timeout_seconds": refused(
        "the distributed timeout is torch.distributed's default; setting it is not built yet"
    ),
    "cpu_distributed_timeout_seconds": refused(
        "the distributed timeout is torch.distributed's default; setting it is not built yet"
    ),
    "numa_bind": refused(NUMA),
    "numa_bind_nodes": refused(NUMA),
    "numa_bind_cpus": refused(NUMA),
    "device_ids": refused("devices are chosen with CUDA_VISIBLE_DEVICES"),
    "decode_context_parallel_size": refused(CONTEXT_PARALLEL),
    "dcp_comm_backend": refused(CONTEXT_PARALLEL),
    "dcp_q_replicate": refused(CONTEXT_PARALLEL),
    "dcp_kv_cache_interleave_size": refused(CONTEXT_PARALLEL),
    "cp_kv_cache_interleave_size": refused(CONTEXT_PARALLEL),
    "prefill_context_parallel_size": refused(CONTEXT_PARALLEL),
    "data_parallel_rank": refused(DP_PLANNED),
    "data_parallel_hybrid_lb": refused(DP_PLANNED),
    "data_parallel_external_lb": refused(DP_PLANNED),
    "data_parallel_multi_port_external_lb": refused(DP_PLANNED),
    "enable_hc_sp": refused("sequence parallelism is not built"),
    "enable_batch_sharded_sampling": no_effect(
        "sampling is not sharded across ranks here; the result is the same"
    ),
    "enable_ep_weight_filter": no_effect(
        "each expert-parallel rank keeps only its own experts already; the others' tensors are "
        "read and dropped at load, not filtered out before reading"
    ),
    "all2all_backend": no_effect(EP_ALL2ALL),
    "enable_dbo": refused("dual-batch overlap is not built"),
    "enable_shm_tensor_arena": no_effect(
        "tensors cross processes through pipes and torch's own sharing"
    ),
    "ubatch_size": refused("dual-batch overlap is not built"),
    "enable_elastic_ep": refused(EPLB_PLANNED),
    "elastic_ep_max_dp_size": refused(EPLB_PLANNED),
    "dbo_decode_token_threshold": no_effect("dual-batch overlap is not built"),
    "dp_sync_interval": no_effect("data-parallel engine cores do not synchronise their steps here"),
    "dbo_prefill_token_threshold": no_effect("dual-batch overlap is not built"),
    "disable_nccl_for_dp_synchronization": no_effect(
        "data-parallel engine cores do not synchronise their steps here"
    ),
    "eplb_config": refused(EPLB_PLANNED),
    "expert_placement_strategy": partial(
        ("linear",),
        "round_robin placement is not built; each expert-parallel rank holds a contiguous range "
        "of the experts (linear)",
    ),
    "enable_fault_tolerance": refused(
        "recovering a failed engine in place is not built: the server stops "
        "(VLLM_KEEP_ALIVE_ON_ENGINE_DEATH keeps it up)"
    ),
    "fault_tolerance_config": refused(
        "recovering a failed engine in place is not built: the server stops "
        "(VLLM_KEEP_ALIVE_ON_ENGINE_DEATH keeps it up)"
    ),
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
    "prefix_caching_hash_algo": partial(
        ("builtin", "sha256", "sha256_cbor"),
        "xxhash and xxhash_cbor hash as builtin: a hash's serialisation matters only where a "
        "KV-aware router recomputes it from the KV events, and sha256_cbor (vLLM's, seeded by "
        "PYTHONHASHSEED) is the one llm-d's indexer recomputes",
        others="no_effect",
    ),
    "cpu_offload_gb": honoured(
        "on a GPU, whole decoder layers from the first, up to that many GiB, kept in (pinned) host "
        "memory and copied to the device for each forward: more room for the KV cache, a slower "
        "step; CUDA graphs and compilation are off with it, and --enable-lora is refused with it; "
        "on a CPU engine it has no effect (warned): the weights are in host memory already"
    ),
    "calculate_kv_scales": HONOURED,
    "kv_sharing_fast_prefill": refused("KV sharing across layers is not supported yet"),
    "mamba_backend": no_effect(NO_SSM),
    "mamba_ssu_algorithm": no_effect(NO_SSM),
    "enable_mamba_cache_stochastic_rounding": no_effect(NO_SSM),
    "mamba_cache_philox_rounds": no_effect(NO_SSM),
    "prefix_cache_retention_interval": refused(
        "cached prefix blocks are evicted least recently used; a retention interval is not built"
    ),
    "kv_cache_dtype_skip_layers": refused(
        "--kv-cache-dtype applies to every layer; leaving some layers out is not built"
    ),
    "swa_bounded_replay": no_effect(
        "a sliding-window layer's prefix replay is not bounded here (the outputs are the same)"
    ),
    "mamba_cache_dtype": no_effect(NO_SSM),
    "mamba_ssm_cache_dtype": no_effect(NO_SSM),
    "mamba_block_size": no_effect(NO_SSM),
    "prefix_match_unit": refused(
        "prefixes match by whole blocks (--block-size); another unit is not built"
    ),
    "mamba_cache_mode": no_effect(NO_SSM),
    "enable_mamba_shared_prefix_checkpoint": no_effect(NO_SSM),
    "replayssm_buffer_len": no_effect(NO_SSM),
    "use_replayssm": no_effect(NO_SSM),
    "kv_offloading_size": honoured(
        "the OffloadingConnector with cpu_bytes_to_use of that many GiB (vLLM's native "
        "backend): a host-memory KV tier below the device's cache, LRU; refused together with "
        "--kv-transfer-config"
    ),
    "kv_offloading_backend": partial(
        ("native",), "LMCache (the lmcache backend) is not built; native is the OffloadingConnector"
    ),
    # ---------------------------------------------------------------- MultiModalConfig
    "limit_mm_per_prompt": honoured(
        "image counts (of the transformers fallback's image-text-to-text models too), video "
        "counts for Qwen2-VL, Qwen2.5-VL, Qwen3-VL and LLaVA-OneVision, audio counts for "
        "Qwen2-Audio (Whisper takes one clip a prompt); the size hints "
        'of vLLM\'s {"count", "width", ...} form are not read '
        "(there is no multimodal memory profiling); a text model has no use for it"
    ),
    "mm_processor_kwargs": honoured(
        "passed to the model's processor; for a video_url's frames Qwen2-VL's do_sample_frames "
        "with fps or num_frames (within min_frames and max_frames) sample them as its video "
        "processor does"
    ),
    "language_model_only": no_effect(MM_PLANNED),
    "enable_mm_embeds": no_effect(MM_PLANNED),
    "media_io_kwargs": honoured(
        "video.num_frames: the frames a video_url's loader keeps, spread evenly (vLLM's default "
        "32; -1 every frame, at most 768); any other key is refused at startup (images are "
        "decoded by PIL with its defaults)"
    ),
    "mm_processor_cache_gb": honoured(
        "each image's (and video frame's) processed arrays kept by its digest in an LRU of this "
        "many GiB in the process that runs the processor (0 disables); the engine core keeps no "
        "mirror, so the arrays still cross the pipe with every request; LLaVA-OneVision's "
        "images among several in a prompt and its video frames are processed uncached, and "
        "audio clips are not kept (each is processed again)"
    ),
    "mm_processor_cache_type": partial(
        ("lru",), "the shared-memory cache (shm) is not built; lru keeps each process its own"
    ),
    "mm_hasher_algorithm": no_effect(
        "image digests are sha256 of the pixels and the processor settings (audio's: of the "
        "samples and the settings)"
    ),
    "mm_shm_cache_max_object_size_mb": no_effect(
        "the shared-memory processor cache (--mm-processor-cache-type shm) is not built"
    ),
    "mm_encoder_only": no_effect(MM_PLANNED),
    "mm_encoder_tp_mode": no_effect(VISION_TOWER),
    "mm_encoder_attn_backend": no_effect(VISION_TOWER),
    "mm_encoder_attn_dtype": no_effect(VISION_TOWER),
    "mm_encoder_fp8_scale_path": no_effect(VISION_TOWER),
    "mm_encoder_fp8_scale_save_path": no_effect(VISION_TOWER),
    "mm_encoder_fp8_scale_save_margin": no_effect(VISION_TOWER),
    "interleave_mm_strings": no_effect(
        "with the string content format image placeholders come first (vLLM's default); keeping "
        "them in place is planned (templates of the openai format keep them in place)"
    ),
    "skip_mm_profiling": no_effect(
        "memory profiling runs no image or clip through the model's encoder"
    ),
    "video_pruning_rate": no_effect(VIDEO_PRUNING),
    "video_pruning_method": no_effect(VIDEO_PRUNING),
    "mm_tensor_ipc": no_effect("images reach the engine core as numpy arrays in its pipe"),
    "mm_ipc_gpu_memory_gb": no_effect("images reach the engine core as numpy arrays in its pipe"),
    "mm_device_do_normalize": no_effect("the model's processor normalizes on the API side's CPU"),
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
    "enable_tower_connector_lora": no_effect("LoRA adapters apply to the language model only"),
    "lora_target_modules": refused(
        "adapters apply to the modules they were trained on; restricting them is not built"
    ),
    "default_mm_loras": no_effect(MM_PLANNED),
    "specialize_active_lora": no_effect(
        "the LoRA kernels here are not specialised on the active adapter count"
    ),
    "enable_mixed_moe_lora_format": refused("MoE LoRA adapters are not served yet"),
    "enable_moe_shared_loras": refused("MoE LoRA adapters are not served yet"),
    "max_lora_cls_labels": refused("classification adapters are not served"),
    # ---------------------------------------------------------------- PromptAdapterConfig
    "enable_prompt_adapter": refused(PROMPT_ADAPTERS),
    "max_prompt_adapters": no_effect(PROMPT_ADAPTERS),
    "max_prompt_adapter_token": no_effect(PROMPT_ADAPTERS),
    # ---------------------------------------------------------------- DeviceConfig
    "device": partial(("auto", "cpu", "cuda"), "NVIDIA GPUs and CPUs are the targets"),
    # ---------------------------------------------------------------- SpeculativeConfig
    "speculative_config": honoured(
        "n-gram prompt lookup (method ngram, with num_speculative_tokens, prompt_lookup_min and "
        "prompt_lookup_max), draft models and EAGLE-1 and EAGLE-3 heads (methods draft_model, "
        "eagle and eagle3, with model, draft_tensor_parallel_size equal to the target's and "
        "max_model_len) and DeepSeek's MTP layer (method mtp) are built, and "
        "disable_by_batch_size for all, with or without --async-scheduling; the other methods "
        "are refused (speculative_config.method), as are --pipeline-parallel-size above 1, "
        "--logits-processors and, with a draft model or head, --enable-sleep-mode"
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
    "logging_config": refused(
        "logging is set up from VLLM_LOGGING_LEVEL, VLLM_LOGGING_PREFIX and "
        "VLLM_LOGGING_CONFIG_PATH; its JSON form is not built yet"
    ),
    "log_level": honoured(
        "sets VLLM_LOGGING_LEVEL for the server's processes (a VLLM_LOGGING_CONFIG_PATH file "
        "sets its own levels)"
    ),
    "per_request_spec_decode_metrics": refused(
        "per-request speculative decoding metrics are not built"
    ),
    "kv_cache_metrics": refused("KV-cache residency metrics are not built"),
    "kv_cache_metrics_sample": no_effect("KV-cache residency metrics are not built"),
    "custom_histogram_buckets": refused(
        "metric histograms have vLLM's default buckets; custom ones are not built"
    ),
    "cudagraph_metrics": refused("CUDA graph metrics are not built"),
    "enable_layerwise_nvtx_tracing": no_effect("there are no NVTX ranges here to enable"),
    "enable_mfu_metrics": refused("model FLOPs utilization metrics are not built"),
    "enable_logging_iteration_details": no_effect("per-iteration logs are not built"),
    "jit_monitor_mode": no_effect("there is no JIT-compilation monitor here"),
    "jit_monitor_verbose": no_effect("there is no JIT-compilation monitor here"),
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
    "disable_chunked_mm_input": no_effect(
        "an image may be cut across chunked-prefill steps: it is encoded once per request and "
        "each step takes its rows (never for Gemma 3, whose image tokens attend to each other: "
        "its chunks always end outside images)"
    ),
    "disable_hybrid_kv_cache_manager": no_effect(
        "every layer shares one KV cache layout: there is no hybrid manager"
    ),
    "cuda_graph_sizes": HONOURED,
    "async_scheduling": honoured(
        "not with --pipeline-parallel-size above 1 (refused, naming both flags); a finished "
        "request may run one more step whose token is discarded; with --speculative-config a "
        "step planned before the last one's drafts are known reserves num_speculative_tokens "
        "draft slots that the worker fills"
    ),
    "max_num_scheduled_tokens": refused(
        "the scheduler's token budget is --max-num-batched-tokens; a separate one is not built"
    ),
    "max_num_active_seqs": refused(
        "the scheduler's sequence budget is --max-num-seqs; a separate one is not built"
    ),
    "max_num_queued_reqs": refused(
        "the waiting queue is unbounded here (--max-concurrency bounds requests in the server)"
    ),
    "max_num_queued_tokens": refused(
        "the waiting queue is unbounded here (--max-concurrency bounds requests in the server)"
    ),
    "long_prefill_token_threshold_adaptive": refused(
        "--long-prefill-token-threshold is fixed; adapting it is not built"
    ),
    "scheduler_reserve_full_isl": no_effect(
        "the scheduler's admission rule is its own; reserving blocks for the whole prompt is not "
        "switchable here"
    ),
    "watermark": no_effect(
        "the scheduler admits a request when its blocks fit, keeping no free-block watermark"
    ),
    "prefill_schedule_interval": no_effect("new prefills are considered at every step"),
    "stream_interval": no_effect("every step's tokens are streamed as they come"),
    # ---------------------------------------------------------------- VllmConfig
    "kv_transfer_config": honoured(
        "kv_connector names a connector built here (OffloadingConnector: a host-memory KV tier; "
        "NixlConnector: disaggregated prefill over NIXL, CPU engines; RecordingConnector: a "
        "debug connector that records the calls and moves no KV); kv_role is kv_producer, "
        "kv_consumer or kv_both; engine_id names the engine (a fresh id when not given); "
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
    "gdn_prefill_backend": no_effect(NO_LAYER),
    "kda_prefill_backend": no_effect(NO_LAYER),
    "kda_decode_backend": no_effect(NO_LAYER),
    "ir_op_priority": no_effect(NO_KERNEL),
    "enable_flashinfer_autotune": no_effect(NO_KERNEL),
    "monokernel": refused("single-kernel model execution is not built"),
    "moe_backend": no_effect(NO_KERNEL),
    "linear_backend": no_effect(NO_KERNEL),
    "sparse_indexer_topk_backend": no_effect(NO_KERNEL),
    "watermark_config": refused("watermarking generated text is not built"),
    "diffusion_config": refused("diffusion language models are not served"),
    "ec_transfer_config": refused(
        "encoder cache transfer (encode/prefill/decode disaggregation) is not built"
    ),
    "ec_manager_config": no_effect(
        "encoder outputs are never transferred: each engine encodes its own requests' images"
    ),
    "attention_config": refused(
        "attention settings are --attention-backend only; the JSON form is not built yet"
    ),
    "engram_config": refused("Engram memory layers are not served"),
    "reasoning_config": refused("reasoning budgets are not built"),
    "kernel_config": no_effect(NO_KERNEL),
    "aux_output_config": refused("auxiliary outputs (routed experts) are not built"),
    "profiler_config": refused("there are no profiler routes yet"),
    "watchdog_config": refused(
        "there is no engine watchdog yet; VLLM_ENGINE_ITERATION_TIMEOUT_S bounds a step"
    ),
    "optimization_level": no_effect(OPT_LEVEL),
    "performance_mode": no_effect(
        "the defaults are tuned one way; a performance mode is not built"
    ),
    "weight_transfer_config": refused("weight transfer (RL weight syncing) is not built"),
}

# Keys of JSON arguments, as "dest.key": judged like arguments when the key is given.
KEY_SUPPORT: dict[str, Support] = {
    # The same names as runtime/kv_transfer/registry.py's CONNECTORS (a test keeps them equal).
    "kv_transfer_config.kv_connector": partial(
        ("NixlConnector", "OffloadingConnector", "RecordingConnector"),
        "the other connectors (LMCacheConnectorV1, MooncakeConnector, P2pNcclConnector, ...) "
        "are not built yet",
    ),
    # The same names as runtime/kv_events/publisher.py's PUBLISHERS (a test keeps them equal).
    "kv_events_config.publisher": partial(
        ("null", "zmq"), "publisher plugins (vLLM's register_publisher) are not loaded"
    ),
    "speculative_config.method": partial(
        ("ngram", "[ngram]", "draft_model", "eagle", "eagle3", "mtp"),
        "n-gram prompt lookup, draft models, EAGLE-1 and EAGLE-3 heads for Llama-family "
        "targets and DeepSeek's MTP layer are built; medusa, mlp_speculator and suffix are "
        "planned",
    ),
    # vLLM reads model "ngram" / "[ngram]" (the deprecated --speculative-model) as the method,
    # any other as a draft checkpoint (an EAGLE head by its name: refused by spec_decode/config.py)
    "speculative_config.model": honoured(
        "a draft checkpoint with the target's vocabulary, or an EAGLE-1 or EAGLE-3 head (methods "
        "eagle and eagle3, or a name with eagle or eagle3 in it), run greedily in the target's "
        "worker and KV block pool"
    ),
    "structured_outputs_config.backend": partial(
        STRUCTURED_OUTPUT_BACKENDS, STRUCTURED_OUTPUT_BACKEND_NOTE
    ),
    "structured_outputs_config.disable_fallback": honoured(
        "auto keeps to xgrammar: a constraint it cannot take is a 400 instead of guidance's"
    ),
    "structured_outputs_config.disable_any_whitespace": HONOURED,
    "structured_outputs_config.disable_additional_properties": refused(
        "not supported by the guidance backend here yet"
    ),
    "structured_outputs_config.reasoning_parser": partial(
        (
            "",
            "deepseek_r1",
            "deepseek_v3",
            "glm45",
            "glm47",
            "granite",
            "minimax_m2",
            "mistral",
            "openai_gptoss",
            "qwen3",
            "seed_oss",
        ),
        REASONING_NOT_BUILT,
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
    "VLLM_ASSETS_CACHE": no_effect("vLLM's sample media assets are never downloaded here"),
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
    "VLLM_NIXL_SIDE_CHANNEL_HOST": HONOURED,
    "VLLM_NIXL_SIDE_CHANNEL_PORT": HONOURED,
    "VLLM_NIXL_ABORT_REQUEST_TIMEOUT": HONOURED,
    "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": partial(
        (True,),
        "KV-cache event block hashes go out as unsigned 64-bit integers (runtime/kv_events/); "
        "raw digests are not sent",
    ),
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": HONOURED,
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": HONOURED,
    "VLLM_IMAGE_FETCH_TIMEOUT": HONOURED,
    "VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": honoured(
        "a file uploaded to /v1/audio/* and a chat input_audio or audio_url part's audio"
    ),
    "VLLM_VIDEO_FETCH_TIMEOUT": HONOURED,
    "VLLM_AUDIO_FETCH_TIMEOUT": honoured(
        "an http(s) audio_url's fetch (chat parts of a model that takes audio: Qwen2-Audio)"
    ),
    "VLLM_MM_INPUT_CACHE_GIB": no_effect(
        "vLLM's old bound of the processor cache; --mm-processor-cache-gb sets it"
    ),
    "VLLM_XGRAMMAR_CACHE_MB": honoured("bounds the xgrammar backend's compiled-grammar cache"),
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
        "run one intra-op thread per CPU; unset leaves torch's own placement, with as many "
        "threads as the CPUs the process may use and its CPU quota (a pod's limits.cpu) allow, "
        "shared among the ranks (OMP_NUM_THREADS, when set, decides instead)"
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
