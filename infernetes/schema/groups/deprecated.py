"""Flags older releases had and newer ones renamed or removed.

They stay accepted so old command lines keep working: each prints a deprecation warning and either
moves its value to the replacement or, when nothing replaced it, is ignored.
"""

from infernetes.schema.choices import QUANTIZATION_METHODS
from infernetes.schema.declare import Arg


def _spec(name: str, kind: str, key: str, help: str, **extra) -> Arg:
    """A speculative-decoding flag that became a key of --speculative-config."""
    return Arg(
        name,
        kind,
        None,
        "SpeculativeConfig",
        help,
        deprecated=f"use --speculative-config '{{\"{key}\": ...}}'",
        replaced_by=f"speculative_config.{key}",
        **extra,
    )


def _removed(name: str, kind: str, group: str, help: str, why: str, **extra) -> Arg:
    return Arg(name, kind, None, group, help, deprecated=why, **extra)


_IMAGE = "removed: multimodal input settings now come from the model's processor"
_POOL = "removed: tokenization runs in the engine's own processes"

ARGS = (
    Arg(
        "max-context-len-to-capture",
        "int",
        None,
        "ModelConfig",
        "Old name of --max-seq-len-to-capture.",
        deprecated="renamed to --max-seq-len-to-capture",
        replaced_by="max_seq_len_to_capture",
    ),
    Arg(
        "worker-use-ray",
        "bool",
        None,
        "ParallelConfig",
        "Old way to ask for Ray workers.",
        deprecated="use --distributed-executor-backend ray",
        replaced_by="distributed_executor_backend=ray",
    ),
    _removed(
        "disable-log-requests",
        "bool",
        "frontend",
        "Did not log each request.",
        "since v0.10.2; requests are not logged by default: --enable-log-requests logs them",
    ),
    _removed(
        "engine-use-ray",
        "bool",
        "ParallelConfig",
        "Ran the engine in a Ray actor.",
        "removed; the engine no longer runs as a Ray actor",
    ),
    _removed(
        "use-v2-block-manager",
        "bool",
        "CacheConfig",
        "Chose the v2 block manager.",
        "has no effect: the v2 block manager is the only one",
    ),
    _removed(
        "enable-reasoning",
        "bool",
        "DecodingConfig",
        "Turned reasoning mode on.",
        "since v0.9.0; has no effect: --reasoning-parser turns reasoning mode on",
    ),
    _removed(
        "qlora-adapter-name-or-path",
        "str",
        "LoadConfig",
        "QLoRA adapter to load.",
        "has no effect and was removed in v0.10.0: serve QLoRA adapters with --lora-modules",
    ),
    _removed(
        "quantization-param-path",
        "str",
        "ModelConfig",
        "JSON file of fp8 KV-cache scales.",
        "has no effect: KV-cache scales are read from the checkpoint (or --calculate-kv-scales)",
    ),
    _removed(
        "mm-cache-preprocessor",
        "bool",
        "MultiModalConfig",
        "Cached preprocessed multimodal inputs.",
        "has no effect: the cache is on by default; --disable-mm-preprocessor-cache turns it off",
    ),
    _removed(
        "tokenizer-pool-size",
        "int",
        "ParallelConfig",
        "Size of the asynchronous tokenizer pool.",
        _POOL,
    ),
    _removed(
        "tokenizer-pool-type", "str", "ParallelConfig", "Kind of tokenizer pool (ray).", _POOL
    ),
    _removed(
        "tokenizer-pool-extra-config",
        "json",
        "ParallelConfig",
        "Extra tokenizer-pool settings.",
        _POOL,
    ),
    _removed(
        "image-input-type",
        "str",
        "MultiModalConfig",
        "How images were passed in.",
        _IMAGE,
        choices=("pixel_values", "image_features"),
    ),
    _removed(
        "image-token-id", "int", "MultiModalConfig", "Token id of the image placeholder.", _IMAGE
    ),
    _removed("image-input-shape", "str", "MultiModalConfig", "Largest image input shape.", _IMAGE),
    _removed(
        "image-feature-size",
        "int",
        "MultiModalConfig",
        "Image feature size along the context.",
        _IMAGE,
    ),
    _removed("image-processor", "str", "MultiModalConfig", "Image processor name or path.", _IMAGE),
    _removed(
        "image-processor-revision", "str", "MultiModalConfig", "Image processor revision.", _IMAGE
    ),
    _removed(
        "disable-image-processor",
        "bool",
        "MultiModalConfig",
        "Skipped the image processor.",
        _IMAGE,
    ),
    _spec(
        "speculative-model",
        "str",
        "model",
        "Draft model for speculative decoding ([ngram] for n-gram lookup).",
    ),
    _spec(
        "speculative-model-quantization",
        "str",
        "quantization",
        "Quantization of the draft model.",
        choices=QUANTIZATION_METHODS,
    ),
    _spec(
        "num-speculative-tokens",
        "int",
        "num_speculative_tokens",
        "Tokens proposed per speculative step.",
        minimum=1,
    ),
    _spec(
        "speculative-draft-tensor-parallel-size",
        "int",
        "draft_tensor_parallel_size",
        "Tensor-parallel size of the draft model.",
        aliases=("-spec-draft-tp",),
        minimum=1,
    ),
    _spec(
        "speculative-max-model-len",
        "int",
        "max_model_len",
        "Longest sequence the draft model handles.",
        minimum=1,
    ),
    _spec(
        "speculative-disable-by-batch-size",
        "int",
        "disable_by_batch_size",
        "Stop speculating for new requests when more than this many are queued.",
        minimum=1,
    ),
    _spec(
        "speculative-disable-mqa-scorer",
        "bool",
        "disable_mqa_scorer",
        "Score drafts by batch expansion.",
    ),
    _spec(
        "ngram-prompt-lookup-max",
        "int",
        "prompt_lookup_max",
        "Largest n-gram for prompt-lookup drafting.",
        minimum=1,
    ),
    _spec(
        "ngram-prompt-lookup-min",
        "int",
        "prompt_lookup_min",
        "Smallest n-gram for prompt-lookup drafting.",
        minimum=1,
    ),
    _spec(
        "spec-decoding-acceptance-method",
        "str",
        "acceptance_method",
        "How draft tokens are accepted.",
        choices=("rejection_sampler", "typical_acceptance_sampler"),
    ),
    _spec(
        "typical-acceptance-sampler-posterior-threshold",
        "float",
        "posterior_threshold",
        "Typical acceptance: lower bound of a token's posterior probability.",
        minimum=0,
    ),
    _spec(
        "typical-acceptance-sampler-posterior-alpha",
        "float",
        "posterior_alpha",
        "Typical acceptance: scale of the entropy-based threshold.",
        minimum=0,
    ),
    _spec(
        "disable-logprobs-during-spec-decoding",
        "bool",
        "disable_logprobs",
        "Return no logprobs while speculating.",
    ),
)
