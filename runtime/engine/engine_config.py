"""Settling a ServeConfig against the model: the values the schema leaves open (context length,
dtype, block size, scheduler limits, generation-config defaults) are decided here, once, into the
typed ``RuntimeConfig`` the engine reads (``runtime/config.py``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from infernetes.kernels.backend import startup_backend
from infernetes.runtime.config import (
    CacheConfig,
    DeviceConfig,
    LoadConfig,
    LoRAConfig,
    ModelConfig,
    ParallelConfig,
    RuntimeConfig,
    SchedulerConfig,
)
from infernetes.runtime.engine.generation_config import read_generation_config, sampling_defaults
from infernetes.runtime.executor.backend_check import check_executor_backend
from infernetes.runtime.kv_events.config import kv_events_config
from infernetes.runtime.kv_transfer.config import (
    NIXL_CONNECTOR,
    OFFLOADING_CONNECTOR,
    check_nixl_engine,
    kv_transfer_config,
)
from infernetes.runtime.model_executor.compilation import parse_compilation_config
from infernetes.runtime.model_executor.cuda_graph import decode_graph_settings
from infernetes.runtime.model_executor.gguf_checkpoint import gguf_file
from infernetes.runtime.model_executor.layers.quantization import resolve_quantization
from infernetes.runtime.model_executor.loader import (
    DEFAULT_IGNORE_PATTERNS,
    ModelInfo,
    inspect_model,
    load_hf_config,
    model_class_of,
    resolve_model_path,
)
from infernetes.runtime.model_executor.models import DRAFT_HEADS
from infernetes.runtime.model_executor.models.interfaces import (
    is_encoder_decoder,
    supports_multimodal,
)
from infernetes.runtime.model_executor.parallel import stage_layers
from infernetes.runtime.multimodal.processor import SUPPORTED_MODALITIES, check_limits
from infernetes.runtime.preflight import pp_layer_partition
from infernetes.runtime.spec_decode.config import speculative_config, with_draft_model
from infernetes.runtime.tokenization.tokenizer import get_tokenizer
from infernetes.runtime.worker.cpu_binding import check_bind
from transformers import PretrainedConfig

from infernetes.schema.config import ServeConfig
from infernetes.schema.env import read_env
from infernetes.schema.support_check import refuse_unsupported

logger = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 16
DEFAULT_MAX_NUM_SEQS = 256


def resolve_device(name: str | None) -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but no CUDA device is available")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"device must be one of auto, cpu, cuda; got {name!r}")
    return torch.device(name)


def _scheduler_config(
    config: ServeConfig, max_model_len: int, device: torch.device, pooling: bool
) -> SchedulerConfig:
    chunked = config.enable_chunked_prefill
    chunked = (not pooling) if chunked is None else bool(chunked) and not pooling
    max_num_seqs = config.max_num_seqs or DEFAULT_MAX_NUM_SEQS
    budget = config.max_num_batched_tokens
    if budget is None:
        budget = 8192 if device.type == "cuda" else 4096
        if not chunked:
            budget = max(budget, max_model_len)
    elif not chunked and budget < max_model_len:
        raise ValueError(
            f"max_num_batched_tokens ({budget}) is smaller than max_model_len ({max_model_len}): "
            "every prompt must fit in one step when chunked prefill is disabled; raise "
            "--max-num-batched-tokens, lower --max-model-len or --enable-chunked-prefill"
        )
    return SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        max_num_partial_prefills=config.max_num_partial_prefills,
        max_long_partial_prefills=config.max_long_partial_prefills,
        long_prefill_token_threshold=config.long_prefill_token_threshold or 0,
        policy=config.scheduling_policy,
        max_loras=config.max_loras if config.enable_lora else 0,
        async_scheduling=config.async_scheduling,
    )


def _parallel_config(
    config: ServeConfig,
    hf_config: PretrainedConfig,
    pooling: bool,
    environ: dict[str, str],
    data_parallel_rank: int,
) -> ParallelConfig:
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    backend = config.distributed_executor_backend or ("mp" if tp * pp > 1 else "uni")
    check_executor_backend(backend)
    if backend == "uni" and tp * pp > 1:
        raise ValueError(
            f"distributed_executor_backend='uni' runs one rank, but tensor_parallel_size x "
            f"pipeline_parallel_size is {tp * pp}; use 'mp' (the default) for more ranks"
        )
    text = hf_config.get_text_config()  # a vision-language model's language model is sharded
    heads = getattr(text, "num_attention_heads", 0)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    if heads % tp or (kv_heads % tp and tp % kv_heads):
        raise ValueError(
            f"tensor_parallel_size {tp} does not divide the model's {heads} attention heads "
            f"and {kv_heads} key/value heads (each rank holds an equal share; with fewer KV heads "
            "than ranks, the ranks must be a multiple of them)"
        )
    if pp > 1 and pooling:
        raise ValueError(
            "pipeline_parallel_size above 1 is for generative models, not pooling ones"
        )
    partition = pp_layer_partition(environ)
    if partition is not None or pp > 1:  # the stages must cover the layers: say so now
        stage_layers(text.num_hidden_layers, partition, pp)
    return ParallelConfig(
        tp,
        pp,
        backend,
        partition,
        config.data_parallel_size,
        data_parallel_rank,
        expert_parallel=config.enable_expert_parallel,
        nnodes=config.nnodes,
        node_rank=config.node_rank,
        master_addr=config.master_addr,
        master_port=config.master_port,
    )


def _config_source(config: ServeConfig, model_path: Path) -> Path:
    """Where config.json comes from: ``--hf-config-path`` (a folder, a JSON file or a hub id whose
    JSON files are fetched alone), else the model's folder."""
    name = config.hf_config_path
    if not name:
        return model_path
    if Path(name).expanduser().is_file():
        return Path(name).expanduser()
    return resolve_model_path(
        name, config.revision, config.download_dir, config.hf_token, allow_patterns=["*.json"]
    )


def _load_tokenizer(config: ServeConfig, model_path: Path) -> Any:
    if config.skip_tokenizer_init:
        return None
    tokenizer_path = config.tokenizer or str(model_path)
    if config.tokenizer is not None and not Path(config.tokenizer).is_dir():
        tokenizer_path = str(
            resolve_model_path(
                config.tokenizer, config.tokenizer_revision, config.download_dir, config.hf_token
            )
        )
    return get_tokenizer(
        tokenizer_path,
        config.tokenizer_mode,
        None,
        config.trust_remote_code,
        config.download_dir,
        config.hf_token,
    )


def _eos_token_ids(
    tokenizer: Any, hf_config: PretrainedConfig, generation: dict[str, Any]
) -> tuple[int | None, frozenset[int]]:
    """The EOS token (the tokenizer's, else the model's) and the other ids that also stop a
    request (generation_config.json's ``eos_token_id`` list, a list in config.json)."""
    eos = tokenizer.eos_token_id if tokenizer is not None else None
    if eos is None:
        eos = getattr(hf_config.get_text_config(), "eos_token_id", None)
    extra_eos = generation.get("eos_token_id")
    extra = set(
        extra_eos if isinstance(extra_eos, list) else [extra_eos] if extra_eos is not None else []
    )
    if isinstance(eos, list):
        extra |= set(eos[1:])
        eos = eos[0] if eos else None
    extra.discard(eos)
    return eos, frozenset(extra)


def _classifier_tokens(hf_config: PretrainedConfig, tokenizer: Any) -> None:
    """``classifier_from_token`` (vLLM's --hf-overrides recipe for rerankers that are causal LMs,
    models/qwen3_classifier.py): the tokens' ids, and the label count the head will have."""
    tokens = list(hf_config.classifier_from_token)
    ids = [tokenizer.convert_tokens_to_ids(token) for token in tokens]
    unknown = [t for t, i in zip(tokens, ids, strict=True) if i in (None, tokenizer.unk_token_id)]
    if unknown:
        raise ValueError(f"hf_overrides.classifier_from_token: not in the vocabulary: {unknown}")
    if getattr(hf_config, "is_original_qwen3_reranker", False) and len(ids) != 2:
        raise ValueError(
            "hf_overrides.classifier_from_token: is_original_qwen3_reranker takes two tokens, "
            f'the "no" and the "yes" token; got {tokens}'
        )
    hf_config.classifier_token_ids = ids
    hf_config.num_labels = (
        1 if getattr(hf_config, "is_original_qwen3_reranker", False) else len(ids)
    )


def _multimodal_settings(config: ServeConfig, info: ModelInfo) -> dict[str, Any]:
    """``--limit-mm-per-prompt``, ``--mm-processor-kwargs`` and ``--mm-processor-cache-gb`` of a
    vision-language model, checked against what it takes; a text model has no use for them."""
    model_class = model_class_of(info)
    if not (supports_multimodal(model_class) or is_encoder_decoder(model_class)):
        return {}
    modalities = getattr(model_class, "modalities", SUPPORTED_MODALITIES)
    return dict(
        limit_mm_per_prompt=check_limits(
            config.limit_mm_per_prompt or {}, info.architecture, modalities
        ),
        mm_processor_kwargs=dict(config.mm_processor_kwargs or {}),
        mm_processor_cache_gb=config.mm_processor_cache_gb,
    )


def _check_whole_images_fit(scheduler: SchedulerConfig, info: ModelInfo) -> None:
    """A model whose image tokens see their whole image computes an image in one step: the
    step's token budget must hold one (else such a prompt would never be scheduled)."""
    if not getattr(model_class_of(info), "bidirectional_image_attention", False):
        return
    tokens = info.hf_config.mm_tokens_per_image
    if scheduler.max_num_batched_tokens < tokens:
        raise ValueError(
            f"max_num_batched_tokens ({scheduler.max_num_batched_tokens}) must be at least "
            f"{tokens}: {info.architecture} computes each image's {tokens} tokens in one step "
            "(they attend to each other)"
        )


def resolve_config(
    config: ServeConfig, environ: dict[str, str] | None = None, data_parallel_rank: int = 0
) -> tuple[RuntimeConfig, Any]:
    """The runtime configuration and the tokenizer (None with ``--skip-tokenizer-init``), for
    data-parallel engine core ``data_parallel_rank``."""
    environ = dict(os.environ) if environ is None else environ
    if config.model is None:
        raise ValueError("model is required: a local folder or a Hugging Face model id")
    refuse_unsupported(config, environ)  # the support table; its warnings are the caller's to show
    device = resolve_device(config.device)
    logger.info(
        "Attention backend: %s", startup_backend(config.attention_backend, device.type, environ)
    )
    ignore = DEFAULT_IGNORE_PATTERNS if config.ignore_patterns is None else config.ignore_patterns
    path = resolve_model_path(
        config.model, config.revision, config.download_dir, config.hf_token, ignore_patterns=ignore
    )
    path = gguf_file(path, config.load_format) or path  # the model is that one file
    hf_config = load_hf_config(
        _config_source(config, path),
        config.trust_remote_code,
        config.hf_overrides,
        config.rope_scaling,
        config.rope_theta,
    )
    info = inspect_model(
        path,
        hf_config,
        config.dtype,
        config.max_model_len,
        device,
        allow_long=bool(read_env("VLLM_ALLOW_LONG_MAX_MODEL_LEN", environ)),
        disable_sliding_window=config.disable_sliding_window,
        model_impl=config.model_impl,
    )
    _check_model_fits(config, info)
    logger.info(
        "Model %s (%s implementation): dtype %s on %s, max_model_len %d",
        info.architecture,
        info.implementation,
        str(info.dtype).removeprefix("torch."),
        device,
        info.max_model_len,
    )
    tokenizer = _load_tokenizer(config, path)
    if info.is_pooling and getattr(info.hf_config, "sep_token_id", None) is None:
        # a cross-encoder finds the pair's boundary by it (models/bert.py: pair_token_types)
        info.hf_config.sep_token_id = getattr(tokenizer, "sep_token_id", None)
    if info.is_pooling and getattr(info.hf_config, "classifier_from_token", None):
        _classifier_tokens(info.hf_config, tokenizer)
    generation = read_generation_config(config.generation_config, path)
    eos, extra_eos = _eos_token_ids(tokenizer, hf_config, generation)
    scheduler = _scheduler_config(config, info.max_model_len, device, info.is_pooling)
    _check_whole_images_fit(scheduler, info)
    compilation = parse_compilation_config(config.compilation_config)
    kv_transfer = kv_transfer_config(
        config.kv_transfer_config,
        config.kv_offloading_size,
        config.kv_offloading_backend,
        config.block_size or DEFAULT_BLOCK_SIZE,
    )
    offloading = kv_transfer is not None and kv_transfer.kv_connector == OFFLOADING_CONNECTOR
    if offloading and info.is_pooling:
        raise ValueError("KV offloading serves generative models; this is a pooling model")
    if offloading and config.enable_sleep_mode:
        # the cache given back would leave the host tier stores of blocks that are gone
        raise ValueError(
            "--enable-sleep-mode with KV offloading (--kv-offloading-size, the "
            "OffloadingConnector) is not supported yet: give one or the other"
        )
    if kv_transfer is not None and kv_transfer.kv_connector == NIXL_CONNECTOR:
        check_nixl_engine(
            device.type, info.is_pooling, config.enable_sleep_mode, config.pipeline_parallel_size
        )
    speculative = with_draft_model(
        speculative_config(
            config.speculative_config,
            config.pipeline_parallel_size,
            config.tensor_parallel_size,
        ),
        info,
        device,
        config.download_dir,
        config.hf_token,
        ignore,
    )
    if speculative is not None and speculative.draft is not None and config.enable_sleep_mode:
        # sleeping would free or offload the target's weights and cache and leave the draft's
        raise ValueError(
            "--enable-sleep-mode with a draft model or EAGLE head (--speculative-config methods "
            "draft_model, eagle and eagle3) is not supported yet (planned)"
        )
    if speculative is not None and config.logits_processors:
        # vLLM refuses it the same way (its STR_SPEC_DEC_REJECTS_LOGITSPROCS): a processor keeps
        # one state per request, which a draft's row would need as of the drafts before it
        raise ValueError(
            "--logits-processors cannot be combined with --speculative-config, as in vLLM: "
            "custom logits processors are not supported when speculative decoding is enabled "
            "(a processor keeps one state per request and sees one row of it per step)"
        )
    decode_graphs = decode_graph_settings(
        config, compilation, scheduler.max_num_seqs, info.max_model_len
    )
    if kv_transfer is not None and decode_graphs is not None:
        logger.info(
            "CUDA graphs are off with --kv-transfer-config: the connector's per-layer calls run "
            "in Python, which a graph would not replay; every step runs eagerly"
        )
        decode_graphs = None
    cpu_offload_bytes = _cpu_offload_bytes(config, device)
    if cpu_offload_bytes and decode_graphs is not None:
        logger.info(
            "CUDA graphs are off with --cpu-offload-gb: the offloaded layers' weights are copied "
            "to the device by Python hooks, which a graph would not replay; every step runs eagerly"
        )
        decode_graphs = None
    if decode_graphs is not None and speculative is not None and speculative.method == "eagle3":
        logger.info(
            "CUDA graphs are off with an EAGLE-3 head: it reads the hidden states of three "
            "target layers, which a graph would not hand out; every step runs eagerly"
        )
        decode_graphs = None
    runtime = RuntimeConfig(
        model=ModelConfig(
            info=info,
            max_logprobs=config.max_logprobs,
            seed=config.seed,
            quantization=resolve_quantization(config.quantization, path, hf_config),
            default_sampling_params=sampling_defaults(
                generation, config.override_generation_config
            ),
            eos_token_id=eos,
            extra_eos_token_ids=extra_eos,
            enable_prompt_embeds=config.enable_prompt_embeds,
            logits_processors=tuple(config.logits_processors or ()),
            **_multimodal_settings(config, info),
        ),
        cache=_cache_config(config, info.is_pooling, environ),
        scheduler=scheduler,
        parallel=_parallel_config(config, hf_config, info.is_pooling, environ, data_parallel_rank),
        device=DeviceConfig(
            device=device,
            attention_backend=config.attention_backend,
            cpu_threads_bind=_cpu_threads_bind(environ),
        ),
        load=LoadConfig(
            load_format=config.load_format,
            ignore_patterns=tuple(ignore),
            use_tqdm_on_load=bool(config.use_tqdm_on_load),
            cpu_offload_bytes=cpu_offload_bytes,
        ),
        compilation=compilation,
        decode_graphs=decode_graphs,
        lora=_lora_config(config, info.is_pooling),
        kv_transfer=kv_transfer,
        speculative=speculative,
        kv_events=kv_events_config(config.kv_events_config, config.data_parallel_size),
    )
    return runtime, tokenizer


def _check_model_fits(config: ServeConfig, info: ModelInfo) -> None:
    """What the model's implementation and kind allow of the parallel layout and ``--task``."""
    if info.architecture in DRAFT_HEADS:
        raise ValueError(
            f"{info.architecture} is a speculative decoding head, not a model to serve: give it "
            "as --speculative-config's model beside its target"
        )
    model_class = model_class_of(info)
    if getattr(model_class, "single_rank", False) and (
        config.tensor_parallel_size * config.pipeline_parallel_size > 1
    ):
        raise ValueError(
            f"{info.architecture} runs on one rank: tensor_parallel_size and "
            "pipeline_parallel_size must be 1 (splitting it is planned)"
        )
    if is_encoder_decoder(model_class):
        _check_encoder_decoder_fits(config, info.architecture)
    fallback = info.implementation == "transformers"
    if fallback and config.pipeline_parallel_size > 1:
        raise ValueError(
            f"{info.architecture} runs through the transformers fallback, which runs as one "
            "pipeline stage: --pipeline-parallel-size above 1 needs a native implementation (for "
            "the fallback it is planned)"
        )
    if fallback and config.tensor_parallel_size > 1 and supports_multimodal(model_class):
        raise ValueError(
            f"{info.architecture} runs through the transformers fallback for image-text-to-text "
            "models, which runs on one rank: --tensor-parallel-size above 1 needs a native "
            "implementation (for this fallback it is planned)"
        )
    if (
        fallback
        and config.tensor_parallel_size > 1
        and not getattr(info.hf_config, "base_model_tp_plan", None)
    ):
        raise ValueError(
            f"transformers' {info.architecture} has no tensor-parallel plan "
            "(base_model_tp_plan), so the transformers fallback cannot split it across ranks"
        )
    if config.task not in ("auto", None):
        wanted_pooling = config.task in ("embed", "embedding", "classify", "score", "reward")
        if wanted_pooling != info.is_pooling:
            kind = "an embedding" if info.is_pooling else "a generative"
            raise ValueError(f"task={config.task!r} does not fit {info.architecture}, {kind} model")
        if config.task == "transcription" and not is_encoder_decoder(model_class):
            raise ValueError(
                f"task='transcription' does not fit {info.architecture}: transcription is for "
                "speech models (Whisper)"
            )


def _check_encoder_decoder_fits(config: ServeConfig, architecture: str) -> None:
    """What a speech model (Whisper) cannot be served with here."""
    if config.skip_tokenizer_init:
        raise ValueError(
            f"{architecture} needs its tokenizer and feature extractor to build each prompt "
            "from its audio: skip_tokenizer_init is not supported for it"
        )
    for name, value in (
        ("enable_lora", config.enable_lora),
        ("speculative_config", config.speculative_config),
    ):
        if value:
            raise ValueError(f"{name} is not supported for {architecture} yet (planned)")


def _cache_config(config: ServeConfig, pooling: bool, environ: dict[str, str]) -> CacheConfig:
    prefix_caching = config.enable_prefix_caching
    return CacheConfig(
        block_size=config.block_size or DEFAULT_BLOCK_SIZE,
        # vLLM's default: on for generative models, off for pooling ones
        enable_prefix_caching=(not pooling) if prefix_caching is None else bool(prefix_caching),
        prefix_caching_hash_algo=config.prefix_caching_hash_algo,
        kv_cache_dtype=config.kv_cache_dtype,
        calculate_kv_scales=bool(config.calculate_kv_scales),
        gpu_memory_utilization=config.gpu_memory_utilization,
        num_gpu_blocks_override=config.num_gpu_blocks_override,
        kv_cache_memory_bytes=config.kv_cache_memory_bytes,
        cpu_kv_cache_bytes=int(read_env("VLLM_CPU_KVCACHE_SPACE", environ) or 4) << 30,
    )


def _cpu_threads_bind(environ: dict[str, str]) -> str | None:
    bind = read_env("VLLM_CPU_OMP_THREADS_BIND", environ)
    try:
        check_bind(bind)
    except ValueError as error:
        raise ValueError(f"VLLM_CPU_OMP_THREADS_BIND: {error}") from None
    return bind or None


def _lora_config(config: ServeConfig, pooling: bool) -> LoRAConfig | None:
    if not config.enable_lora:
        return None
    if pooling:
        raise ValueError("--enable-lora serves generative models; this is a pooling model")
    return LoRAConfig(
        max_loras=config.max_loras,
        max_lora_rank=config.max_lora_rank,
        max_cpu_loras=config.max_cpu_loras or config.max_loras,
    )


__all__ = ["resolve_config", "resolve_device"]


def _cpu_offload_bytes(config: ServeConfig, device: torch.device) -> int:
    """--cpu-offload-gb in bytes; 0 on a CPU, where the weights are in host memory already."""
    gigabytes = float(config.cpu_offload_gb or 0)  # (the schema's minimum refuses a negative)
    if not gigabytes:
        return 0
    if device.type == "cpu":
        logger.warning(
            "--cpu-offload-gb has no effect on a CPU engine: the weights are in host memory already"
        )
        return 0
    if config.enable_lora:
        raise ValueError(
            "--cpu-offload-gb cannot be combined with --enable-lora: adapters are written into "
            "the linear layers' device tensors, which offloaded layers do not keep between forwards"
        )
    return int(gigabytes * 2**30)
