"""The table of environment variables the server reads (``ENV_VARS``) and ``read_env``.

Every variable of the reference documents is here, with its type, default and meaning. Build-time
variables (``build_time=True``) only matter when compiling kernels and are listed for completeness.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infernetes.schema.choices import ATTENTION_BACKENDS
from infernetes.schema.values import parse_bool, parse_float, parse_size

ENV_KINDS = ("str", "int", "float", "bool", "path", "list")


@dataclass(frozen=True)
class EnvVar:
    """One environment variable. ``list`` values are comma-separated strings."""

    name: str
    kind: str
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    secret: bool = False
    build_time: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ENV_KINDS:
            raise ValueError(f"{self.name}: unknown kind {self.kind!r}")


E = EnvVar
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

ENV_VARS: tuple[EnvVar, ...] = (
    # Building and installing.
    E(
        "VLLM_TARGET_DEVICE",
        "str",
        "cuda",
        "Device the package is built for.",
        ("cuda", "rocm", "neuron", "cpu", "openvino", "tpu", "xpu", "hpu"),
        build_time=True,
    ),
    E(
        "MAX_JOBS",
        "int",
        None,
        "Parallel compile jobs; the number of CPUs when unset.",
        build_time=True,
    ),
    E(
        "NVCC_THREADS",
        "int",
        1,
        "Threads per nvcc process (MAX_JOBS is lowered to compensate).",
        build_time=True,
    ),
    E(
        "VLLM_USE_PRECOMPILED",
        "bool",
        False,
        "Use precompiled binaries instead of compiling.",
        build_time=True,
    ),
    E(
        "VLLM_TEST_USE_PRECOMPILED_NIGHTLY_WHEEL",
        "bool",
        False,
        "Build against the nightly wheel's binaries.",
        build_time=True,
    ),
    E(
        "CMAKE_BUILD_TYPE",
        "str",
        "Release",
        "CMake build type.",
        ("Debug", "Release", "RelWithDebInfo"),
        build_time=True,
    ),
    E("VERBOSE", "bool", False, "Verbose build logs.", build_time=True),
    E(
        "CUDA_HOME",
        "path",
        None,
        "CUDA toolkit folder (with bin/, include/, lib/).",
        build_time=True,
    ),
    # Where things live.
    E("VLLM_CONFIG_ROOT", "path", "~/.config/vllm", "Folder for configuration files."),
    E(
        "VLLM_CACHE_ROOT",
        "path",
        None,
        "Folder for cache files: the compiled CPU kernels go to its kernels/ "
        "folder; $XDG_CACHE_HOME/infernetes (~/.cache/infernetes) when unset.",
    ),
    E("VLLM_ASSETS_CACHE", "path", "~/.cache/vllm/assets", "Folder for downloaded assets."),
    E(
        "VLLM_XLA_CACHE_PATH",
        "path",
        "~/.cache/vllm/xla_cache",
        "Persistent XLA compilation cache (TPU).",
    ),
    E(
        "VLLM_RPC_BASE_PATH",
        "path",
        "/tmp",
        "Folder for the IPC sockets between the API server and the engine.",
    ),
    E(
        "VLLM_TORCH_PROFILER_DIR",
        "path",
        None,
        "Write torch profiler traces here; profiling is off when unset.",
    ),
    E(
        "VLLM_USE_MODELSCOPE",
        "bool",
        False,
        "Load models from ModelScope instead of the Hugging Face hub.",
    ),
    E("HF_TOKEN", "str", None, "Hugging Face hub token.", secret=True),
    E("S3_ACCESS_KEY_ID", "str", None, "S3 access key for tensorizer loading.", secret=True),
    E("S3_SECRET_ACCESS_KEY", "str", None, "S3 secret key for tensorizer loading.", secret=True),
    E("S3_ENDPOINT_URL", "str", None, "S3 endpoint for tensorizer loading."),
    E("VLLM_CI_USE_S3", "bool", False, "CI: load models from S3 with the Run:ai streamer."),
    # Distributed setup (internal addresses, not the API server's --host/--port).
    E(
        "VLLM_HOST_IP",
        "str",
        "",
        "IP of this node for distributed communication; detected when unset.",
    ),
    E(
        "VLLM_PORT",
        "int",
        None,
        "First port for internal distributed communication; random when unset.",
    ),
    E("LOCAL_RANK", "int", 0, "Rank of this process on its node; picks the GPU."),
    E("CUDA_VISIBLE_DEVICES", "str", None, "GPUs this process may use."),
    E("VLLM_NCCL_SO_PATH", "path", None, "Path of the NCCL library to load."),
    E("LD_LIBRARY_PATH", "str", None, "Searched for NCCL when VLLM_NCCL_SO_PATH is unset."),
    E(
        "VLLM_CUDART_SO_PATH",
        "path",
        None,
        "Path of the CUDA runtime library when it cannot be found.",
    ),
    E(
        "VLLM_WORKER_MULTIPROC_METHOD",
        "str",
        "fork",
        "How worker processes start.",
        ("fork", "spawn"),
    ),
    E("VLLM_PP_LAYER_PARTITION", "str", None, "Layers per pipeline stage, comma-separated."),
    E("VLLM_SKIP_P2P_CHECK", "bool", False, "Skip the GPU peer-to-peer capability check."),
    E(
        "VLLM_DISABLE_CUSTOM_ALL_REDUCE",
        "bool",
        False,
        "Use NCCL all-reduce instead of the custom kernel.",
    ),
    E("VLLM_DP_RANK", "int", 0, "Data-parallel rank of this process."),
    E("VLLM_DP_SIZE", "int", 1, "Data-parallel world size."),
    E("VLLM_DP_MASTER_IP", "str", "127.0.0.1", "IP of the data-parallel master."),
    E("VLLM_DP_MASTER_PORT", "int", 0, "Port of the data-parallel master."),
    E(
        "VLLM_RAY_PER_WORKER_GPUS",
        "float",
        1.0,
        "GPUs per Ray worker; a fraction packs several per GPU.",
    ),
    E(
        "VLLM_RAY_BUNDLE_INDICES",
        "list",
        (),
        "Ray placement-group bundle index of each worker, e.g. 0,1,2,3.",
    ),
    E(
        "VLLM_USE_RAY_SPMD_WORKER",
        "bool",
        False,
        "Run every worker, the driver included, as a Ray SPMD worker.",
    ),
    E(
        "VLLM_USE_RAY_COMPILED_DAG",
        "bool",
        False,
        "Use Ray's compiled graph to cut control-plane overhead.",
    ),
    E(
        "VLLM_USE_RAY_COMPILED_DAG_NCCL_CHANNEL",
        "bool",
        True,
        "Use NCCL channels in Ray's compiled graph.",
    ),
    E(
        "VLLM_USE_RAY_COMPILED_DAG_OVERLAP_COMM",
        "bool",
        False,
        "Overlap GPU communication in Ray's compiled graph.",
    ),
    E("VLLM_RPC_TIMEOUT", "int", 180000, "Milliseconds to wait for the engine's answer to an RPC."),
    E(
        "VLLM_INSTANCE_ID",
        "str",
        None,
        "Identifier of this instance when several run side by side.",
    ),
    # The server.
    E("VLLM_API_KEY", "str", None, "API key the server requires (like --api-key).", secret=True),
    E(
        "VLLM_ENGINE_ITERATION_TIMEOUT_S",
        "int",
        60,
        "Seconds one engine step may take before it is an error.",
    ),
    E(
        "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH",
        "bool",
        False,
        "Keep the API server up after the engine died.",
    ),
    E(
        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
        "int",
        5,
        "Seconds an idle HTTP keep-alive connection stays open.",
    ),
    E(
        "VLLM_SERVER_DEV_MODE",
        "bool",
        False,
        "Serve debugging endpoints such as /reset_prefix_cache.",
    ),
    E(
        "VLLM_NIXL_SIDE_CHANNEL_HOST",
        "str",
        "localhost",
        "Address the NixlConnector's side channel (its handshake) listens on and a producer "
        "hands out as remote_host.",
    ),
    E(
        "VLLM_NIXL_SIDE_CHANNEL_PORT",
        "int",
        5600,
        "Port of the NixlConnector's side channel (tensor-parallel rank r listens on port + r).",
    ),
    E(
        "VLLM_NIXL_ABORT_REQUEST_TIMEOUT",
        "int",
        480,
        "Seconds a prefill engine keeps a finished request's KV blocks for the decode engine "
        "to pull before freeing them.",
    ),
    E(
        "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES",
        "bool",
        True,
        "Publish KV-cache event block hashes as 64-bit integers rather than raw digests.",
    ),
    E(
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
        "bool",
        False,
        "Allow --max-model-len beyond the model's config.json.",
    ),
    E(
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
        "bool",
        False,
        "Allow loading and unloading LoRA adapters at run time.",
    ),
    E("VLLM_IMAGE_FETCH_TIMEOUT", "int", 5, "Seconds to fetch one image URL."),
    E("VLLM_VIDEO_FETCH_TIMEOUT", "int", 30, "Seconds to fetch one video URL."),
    E("VLLM_AUDIO_FETCH_TIMEOUT", "int", 10, "Seconds to fetch one audio URL."),
    E(
        "VLLM_MAX_AUDIO_CLIP_FILESIZE_MB",
        "int",
        25,
        "MiB an audio file uploaded to /v1/audio/transcriptions or /translations may have.",
    ),
    E("VLLM_MM_INPUT_CACHE_GIB", "int", 8, "GiB of cache for processed multimodal inputs."),
    E("VLLM_XGRAMMAR_CACHE_MB", "int", 512, "MiB of cache for compiled xgrammar grammars."),
    E(
        "VLLM_V0_USE_OUTLINES_CACHE",
        "bool",
        False,
        "Keep an unbounded on-disk outlines cache (unsafe with untrusted users).",
    ),
    E("VLLM_LOGITS_PROCESSOR_THREADS", "int", None, "Threads for custom logits processors."),
    E(
        "VLLM_V1_OUTPUT_PROC_CHUNK_SIZE",
        "int",
        128,
        "Most requests whose outputs one asyncio task processes.",
    ),
    E(
        "VLLM_RINGBUFFER_WARNING_INTERVAL",
        "int",
        60,
        "Seconds between warnings that the shared ring buffer is full.",
    ),
    E(
        "VLLM_PLUGINS",
        "list",
        None,
        "Plugins to load, comma-separated; all installed ones when unset.",
    ),
    # Usage statistics.
    E(
        "VLLM_USAGE_STATS_SERVER",
        "str",
        "https://stats.vllm.ai",
        "Where usage statistics would be sent.",
    ),
    E("VLLM_NO_USAGE_STATS", "bool", False, "Send no usage statistics."),
    E("VLLM_DO_NOT_TRACK", "bool", False, "Send no usage statistics."),
    E("VLLM_USAGE_SOURCE", "str", "production", "Source label of usage statistics."),
    # Logging.
    E(
        "VLLM_CONFIGURE_LOGGING",
        "bool",
        True,
        "Configure logging (default config or VLLM_LOGGING_CONFIG_PATH).",
    ),
    E("VLLM_LOGGING_CONFIG_PATH", "path", None, "Logging configuration file (JSON)."),
    E("VLLM_LOGGING_LEVEL", "str", "INFO", "Default log level.", _LOG_LEVELS),
    E("VLLM_LOGGING_PREFIX", "str", "", "Prefix for every log line."),
    E("VLLM_TRACE_FUNCTION", "bool", False, "Trace every function call (debugging; very slow)."),
    E(
        "VLLM_LOG_BATCHSIZE_INTERVAL",
        "float",
        -1.0,
        "Seconds between batch-size log lines; off when negative.",
    ),
    E("VLLM_NO_DEPRECATION_WARNING", "bool", False, "Hide deprecation warnings."),
    # Engine and kernels.
    E("VLLM_USE_V1", "bool", True, "Use the V1 engine."),
    E("VLLM_ENABLE_V1_MULTIPROCESSING", "bool", True, "Run the V1 engine core in its own process."),
    E(
        "VLLM_ATTENTION_BACKEND",
        "str",
        None,
        "Attention implementation; picked for the platform when unset "
        "(TRITON_ATTN on CUDA, TORCH_SDPA on CPU).",
        ATTENTION_BACKENDS,
    ),
    E("VLLM_USE_TRITON_FLASH_ATTN", "bool", True, "Use the Triton flash-attention kernel (ROCm)."),
    E("VLLM_FLASH_ATTN_VERSION", "int", None, "Force flash-attention version 2 or 3.", (2, 3)),
    E("VLLM_USE_FLASHINFER_SAMPLER", "bool", True, "Sample with FlashInfer's kernels."),
    E(
        "VLLM_FLASHINFER_FORCE_TENSOR_CORES",
        "bool",
        False,
        "Make FlashInfer always use tensor cores.",
    ),
    E("VLLM_USE_FLASHINFER_MOE_FP8", "bool", False, "Use FlashInfer MoE kernels for FP8."),
    E("VLLM_USE_FLASHINFER_MOE_FP16", "bool", False, "Use FlashInfer MoE kernels for FP16."),
    E(
        "VLLM_FLASHINFER_MOE_BACKEND",
        "str",
        "throughput",
        "FlashInfer MoE kernel flavour.",
        ("throughput", "latency"),
    ),
    E("VLLM_USE_DEEP_GEMM", "bool", False, "Use DeepGEMM kernels (DeepSeek models)."),
    E("VLLM_MLA_DISABLE", "bool", False, "Turn off multi-head latent attention optimizations."),
    E(
        "VLLM_FUSED_MOE_CHUNK_SIZE",
        "int",
        65536,
        "Tokens per chunk of the fused MoE layer (takes 64K).",
    ),
    E(
        "VLLM_ENABLE_MOE_ALIGN_BLOCK_SIZE_TRITON",
        "bool",
        False,
        "Use the Triton moe_align_block_size.",
    ),
    E("VLLM_USE_TRITON_AWQ", "bool", False, "Use the Triton AWQ kernels."),
    E(
        "VLLM_MARLIN_USE_ATOMIC_ADD",
        "bool",
        False,
        "Reduce with atomicAdd in the GPTQ/AWQ Marlin kernels.",
    ),
    E("VLLM_DISABLED_KERNELS", "list", (), "Quantization kernels to turn off, comma-separated."),
    E("VLLM_ROCM_FP8_PADDING", "bool", True, "Pad FP8 weights to 256 bytes on ROCm."),
    E("Q_SCALE_CONSTANT", "int", 200, "Divisor for the dynamic fp8 query scale."),
    E("K_SCALE_CONSTANT", "int", 200, "Divisor for the dynamic fp8 key scale."),
    E("V_SCALE_CONSTANT", "int", 100, "Divisor for the dynamic fp8 value scale."),
    E(
        "VLLM_TEST_DYNAMO_FULLGRAPH_CAPTURE",
        "bool",
        True,
        "Capture the whole graph with Dynamo (internal).",
    ),
    E(
        "VLLM_TEST_FORCE_FP8_MARLIN",
        "bool",
        False,
        "Use FP8 Marlin even where the hardware has FP8.",
    ),
    E("VLLM_TEST_FORCE_LOAD_FORMAT", "str", "dummy", "Load format forced in tests."),
    E(
        "VLLM_TEST_FORCE_MIXED_CHUNKED_PREFILL",
        "bool",
        False,
        "Force mixing chunked prefills with decodes (tests).",
    ),
    E("VLLM_USE_DUMMY_WEIGHTS", "bool", False, "Random weights instead of loading (tests)."),
    E("VLLM_SKIP_WARMUP", "bool", False, "Skip warm-up runs at start."),
    # Platforms.
    E("VLLM_CPU_KVCACHE_SPACE", "int", 4, "GiB of KV cache on CPU."),
    E(
        "VLLM_CPU_OMP_THREADS_BIND",
        "str",
        None,
        "CPU cores the OpenMP threads are bound to, e.g. 0-31.",
    ),
    E("VLLM_CPU_MOE_PREPACK", "bool", True, "Prepack MoE weights on CPU."),
    E("OMP_NUM_THREADS", "int", None, "OpenMP threads for CPU work."),
    E("VLLM_OPENVINO_DEVICE", "str", "CPU", "OpenVINO device."),
    E("VLLM_OPENVINO_KVCACHE_SPACE", "int", 0, "GiB of KV cache for OpenVINO."),
    E(
        "VLLM_OPENVINO_CPU_KV_CACHE_PRECISION",
        "str",
        None,
        "OpenVINO KV-cache precision (auto when unset).",
    ),
    E(
        "VLLM_OPENVINO_ENABLE_QUANTIZED_WEIGHTS",
        "bool",
        False,
        "Compress weights when exporting with Optimum.",
    ),
    E(
        "VLLM_XLA_CHECK_RECOMPILATION",
        "bool",
        False,
        "Fail when XLA recompiles after a step (TPU).",
    ),
    E(
        "VLLM_TPU_DISABLE_TOPK_TOPP_OPTIMIZATION",
        "bool",
        False,
        "Turn off the TPU top-k/top-p sampling shortcut.",
    ),
    E(
        "VLLM_USE_HPU_CONTIGUOUS_CACHE_FETCH",
        "bool",
        True,
        "Fetch the KV cache contiguously on Gaudi3.",
    ),
)

ENV_BY_NAME: dict[str, EnvVar] = {var.name: var for var in ENV_VARS}
if len(ENV_BY_NAME) != len(ENV_VARS):
    raise RuntimeError("an environment variable is declared twice")

# Kubernetes injects <SERVICE>_PORT=tcp://10.0.0.1:8000 for every Service named like a variable
# prefix (a Service "vllm" sets VLLM_PORT): such values are not ours.
_SERVICE_LINK = re.compile(r"^(tcp|udp|sctp)://")
_warned_links: set[tuple[str, str]] = set()  # warned once a process: a value is read many times


def read_env(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The typed value of ``name`` from ``environ``, or its default when unset or empty.

    Raises ``ValueError`` naming the variable and what it allows when the value is malformed.
    A Kubernetes service-link value (``tcp://...``) is ignored with a warning.
    """
    var = ENV_BY_NAME[name]
    environ = os.environ if environ is None else environ
    raw = environ.get(name)
    if raw is None or (raw == "" and var.kind != "str"):
        return var.default
    if _SERVICE_LINK.match(raw):
        if (name, raw) not in _warned_links:
            _warned_links.add((name, raw))
            print(
                f"WARNING: ignoring {name}={raw}: it looks like a Kubernetes service link, not a "
                "setting; do not name a Service after the VLLM_ prefix",
                file=sys.stderr,
            )
        return var.default
    try:
        value = _convert(var, raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}: {exc}") from None
    return value


def check_env_values(environ: Mapping[str, str] | None = None) -> None:
    """Reads every ``VLLM_*`` variable set in ``environ``: a malformed value raises the
    ``ValueError`` ``read_env`` gives wherever the runtime would read it later."""
    environ = os.environ if environ is None else environ
    for var in ENV_VARS:
        if var.name.startswith("VLLM_") and var.name in environ:
            read_env(var.name, environ)


def _convert(var: EnvVar, raw: str) -> Any:
    value: int | str | tuple[str, ...]
    if var.kind == "bool":
        return parse_bool(raw)
    if var.kind == "float":
        return parse_float(raw)
    if var.kind == "int":
        value = parse_size(raw)
    elif var.kind == "list":
        value = tuple(item.strip() for item in raw.split(",") if item.strip())
    elif var.kind == "path":
        return os.path.expanduser(raw)
    else:
        value = raw
    if var.choices is None:
        return value
    for choice in var.choices:
        if value == choice or (isinstance(choice, str) and choice.lower() == str(value).lower()):
            return choice
    raise ValueError(f"invalid value {raw!r} (choose from {', '.join(map(str, var.choices))})")
