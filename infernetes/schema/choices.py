"""Named choices that several arguments and env variables share.

Every name any of the reference documents lists is here, so a command line written for any of
those releases is accepted.
"""

TOOL_CALL_PARSERS = (
    "deepseek_v3",
    "deepseek_v31",
    "gigachat3",
    "glm45",
    "glm47",
    "granite",
    "granite-20b-fc",
    "hermes",
    "hunyuan_a13b",
    "internlm",
    "jamba",
    "kimi_k2",
    "llama3_json",
    "llama4_json",
    "llama4_pythonic",
    "minimax_m1",
    "minimax_m2",
    "mistral",
    "olmo3",
    "openai",
    "phi4_mini_json",
    "pythonic",
    "qwen",
    "qwen3_coder",
    "seed_oss",
    "step3p5",
    "xlam",
)

REASONING_PARSERS = (
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
    "step3p5",
)

QUANTIZATION_METHODS = (
    "aqlm",
    "auto-round",
    "awq",
    "awq_marlin",
    "bitblas",
    "bitsandbytes",
    "compressed-tensors",
    "deepspeedfp",
    "experts_int8",
    "fbgemm_fp8",
    "fp8",
    "gguf",
    "gptq",
    "gptq_bitblas",
    "gptq_marlin",
    "gptq_marlin_24",
    "gptqmodel",
    "hqq",
    "int4",
    "int8",
    "ipex",
    "marlin",
    "modelopt",
    "moe_wna16",
    "neuron_quant",
    "nvfp4",
    "ptpc_fp8",
    "qqq",
    "quark",
    "squeezellm",
    "torchao",
    "tpu_int8",
)

LOAD_FORMATS = (
    "auto",
    "pt",
    "safetensors",
    "npcache",
    "dummy",
    "tensorizer",
    "runai_streamer",
    "bitsandbytes",
    "sharded_state",
    "gguf",
    "mistral",
    "runai_streamer_sharded",
    "fastsafetensors",
)

# Our own kernels are TRITON_ATTN (CUDA default) and TORCH_SDPA (CPU default); the other names
# are accepted so vLLM command lines and env files keep working.
ATTENTION_BACKENDS = ("TRITON_ATTN", "TORCH_SDPA", "FLASH_ATTN", "FLASHINFER", "XFORMERS")

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
TASKS = (
    "auto",
    "generate",
    "embedding",
    "embed",
    "classify",
    "score",
    "reward",
    "transcription",
    "draft",
)
