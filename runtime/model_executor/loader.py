"""Loading a model: find its files (local folder or the Hugging Face hub), read config.json, settle
dtype and context length, build the architecture and fill it with the checkpoint's weights."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import torch
from infernetes.runtime.model_executor.lazy_weight import LazyWeight, ReadCounter
from infernetes.runtime.model_executor.models import POOLING, model_class
from infernetes.runtime.model_executor.models.interfaces import ServableModel
from infernetes.runtime.model_executor.parallel import tp_rank, tp_size
from infernetes.runtime.model_executor.sliding_window import sliding_window
from torch import nn
from transformers import PretrainedConfig

from infernetes.schema.errors import ConfigError
from infernetes.schema.model_info import resolve_dtype_name

logger = logging.getLogger(__name__)

_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
    "max_target_positions",  # Whisper's decoder
)
_WEIGHT_PATTERNS = ["*.safetensors", "*.bin", "*.pt", "*.json", "*.txt", "*.model", "*.jinja"]
# vLLM's --ignore-patterns default: Llama repositories carry a second, original-format checkpoint.
DEFAULT_IGNORE_PATTERNS = ("original/**/*",)


class ModelLoadError(ValueError):
    """The model cannot be loaded; the message says which file or field and why."""


@dataclass
class ModelInfo:
    """What the engine needs to know about the model once it is resolved."""

    path: Path
    hf_config: PretrainedConfig
    architecture: str
    dtype: torch.dtype
    max_model_len: int
    is_pooling: bool
    pooler_overrides: dict[str, Any] | None = None
    # "native" (this engine's implementation) or "transformers" (the fallback), by --model-impl
    implementation: str = "native"


def resolve_model_path(
    model: str,
    revision: str | None = None,
    download_dir: str | None = None,
    token: str | None = None,
    allow_patterns: list[str] | None = None,
    ignore_patterns: Sequence[str] | None = None,
) -> Path:
    """A local folder as is; otherwise a hub snapshot (``HF_HUB_OFFLINE`` is honoured by the hub)
    without the files ``ignore_patterns`` match."""
    from infernetes.runtime.model_executor.gguf_checkpoint import is_gguf

    local = Path(model).expanduser()
    if local.is_dir() or is_gguf(local):
        return local
    if local.exists() or model.startswith(("/", "./", "../")):
        raise ModelLoadError(
            f"model path {model!r} is not a folder with a config.json, nor a .gguf file"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(
            snapshot_download(
                model,
                revision=revision,
                cache_dir=download_dir,
                token=token,
                allow_patterns=allow_patterns or _WEIGHT_PATTERNS,
                ignore_patterns=list(ignore_patterns or ()),
            )
        )
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as error:
        raise ModelLoadError(
            f"cannot find model {model!r} locally or on the hub: {error}"
        ) from error


def load_hf_config(
    path: Path,
    trust_remote_code: bool = False,
    hf_overrides: dict[str, Any] | None = None,
    rope_scaling: dict[str, Any] | None = None,
    rope_theta: float | None = None,
) -> Any:
    """The HF config in the folder ``path`` (its config.json), in the JSON file ``path`` or in
    the metadata of the GGUF file ``path``."""
    from infernetes.runtime.model_executor import gguf_checkpoint  # it raises our errors

    if gguf_checkpoint.is_gguf(path):
        config = gguf_checkpoint.load_config(path)
    else:
        config = _read_config_json(path, trust_remote_code)
    _apply_overrides(config, hf_overrides or {})
    if rope_scaling or rope_theta is not None:
        _override_rope(config, rope_scaling, rope_theta)
    return config


def _read_config_json(path: Path, trust_remote_code: bool) -> PretrainedConfig:
    from transformers import AutoConfig

    config_file = path if path.is_file() else path / "config.json"
    if not config_file.is_file():
        hint = " (its params.json is Mistral's format: --config-format mistral is not supported)"
        raise ModelLoadError(
            f"{path} has no config.json{hint if (path / 'params.json').is_file() else ''}"
        )
    try:
        raw = json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise ModelLoadError(f"{config_file} is not valid JSON: {error}") from error
    if raw.get("auto_map") and not trust_remote_code:
        architectures = raw.get("architectures") or []
        if not any(name in _supported() for name in architectures):
            raise ModelLoadError(
                f"the model at {path} needs its own code (auto_map in config.json); "
                "pass --trust-remote-code to allow it"
            )
    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, OSError) as error:
        raise ModelLoadError(f"cannot read the model config in {path}: {error}") from error
    return config


def _override_rope(
    config: PretrainedConfig, rope_scaling: dict[str, Any] | None, rope_theta: float | None
) -> None:
    """``--rope-scaling`` replaces the model's scaling, ``--rope-theta`` its base, each keeping
    the other. transformers 5 holds both in ``rope_parameters`` (``rope_scaling`` is an alias
    whose setter drops the base); older versions keep two attributes."""
    if not hasattr(type(config), "rope_parameters"):
        if rope_scaling:
            config.rope_scaling = dict(rope_scaling)
        if rope_theta is not None:
            config.rope_theta = rope_theta
        return
    params = dict(config.rope_parameters or {})
    theta = params.get("rope_theta") if rope_theta is None else rope_theta
    config.rope_parameters = {**(rope_scaling or params), "rope_theta": theta}


def _apply_overrides(config: PretrainedConfig, overrides: dict[str, Any]) -> None:
    """``--hf-overrides`` as vLLM applies them: a dict given for a dict or a sub-config (such as
    ``text_config``) updates it key by key; anything else replaces the attribute. ``rope_theta``
    and ``rope_scaling`` go where the model reads them (transformers 5's ``rope_parameters``)."""
    for key, value in overrides.items():
        current = getattr(config, key, None)
        if key == "rope_theta" and value is not None:
            _override_rope(config, None, float(value))
        elif key == "rope_scaling" and isinstance(value, dict):
            _override_rope(config, {**(current or {}), **value}, None)
        elif isinstance(value, dict) and isinstance(current, dict):
            setattr(config, key, {**current, **value})
        elif isinstance(value, dict) and isinstance(current, PretrainedConfig):
            _apply_overrides(current, value)
        else:
            setattr(config, key, value)


def _supported() -> set[str]:
    from infernetes.runtime.model_executor.models import ARCHITECTURES

    return set(ARCHITECTURES)


def cpu_has_fast_bf16() -> bool:
    """True when the CPU computes bf16 natively (AVX512-BF16 or AMX), so bf16 beats fp32."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # an older torch without these probes
        return False


def resolve_dtype(hf_config: PretrainedConfig, requested: str, device: torch.device) -> torch.dtype:
    """The dtype to run in, by the schema's rule (``infernetes config`` applies the same one)."""
    model_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    fast_bf16 = device.type == "cpu" and cpu_has_fast_bf16()
    try:
        name = resolve_dtype_name(requested, str(model_dtype), device.type, fast_bf16)
    except ConfigError as exc:
        raise ModelLoadError(str(exc)) from exc
    return getattr(torch, name)  # one of DTYPE_NAMES' values


def derived_max_model_len(hf_config: PretrainedConfig, path: Path | None = None) -> int:
    """The longest context the model supports, from its config (and sentence-transformers), as
    vLLM derives it: the smallest length key, stretched by the rope scaling's factor."""
    text = hf_config.get_text_config()  # a multimodal config keeps it in text_config
    lengths = [
        getattr(text, key) for key in _CONTEXT_KEYS if isinstance(getattr(text, key, None), int)
    ]
    length = min(lengths) if lengths else 2048
    if hf_config.model_type in ("roberta", "xlm-roberta"):
        length -= int(hf_config.pad_token_id or 0) + 1  # positions start after the padding index
    scaling = dict(
        getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    )
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type in ("linear", "dynamic", "yarn") and scaling.get("factor"):
        if rope_type == "yarn" and scaling.get("original_max_position_embeddings"):
            length = scaling["original_max_position_embeddings"]
        length = int(length * scaling["factor"])
    if path is not None and (path / "sentence_bert_config.json").is_file():
        st_config = json.loads((path / "sentence_bert_config.json").read_text())
        if st_config.get("max_seq_length"):
            length = min(length, int(st_config["max_seq_length"]))
    return length


def resolve_max_model_len(
    hf_config: PretrainedConfig,
    requested: int | None,
    path: Path | None,
    allow_long: bool,
    disable_sliding_window: bool = False,
) -> int:
    """The context length. ``--disable-sliding-window`` caps it at the model's sliding window
    (the layers then attend to every token, as in vLLM)."""
    derived = derived_max_model_len(hf_config, path)
    window = sliding_window(hf_config)
    source = "from its config.json"
    if window is not None and disable_sliding_window and window < derived:
        derived, source = window, "its sliding window, with --disable-sliding-window"
    if requested is not None and requested > derived and not allow_long:
        raise ModelLoadError(
            f"max_model_len={requested} is longer than the model's maximum context length of "
            f"{derived} tokens ({source}); set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 to force it"
        )
    return derived if requested is None else requested


def inspect_model(
    path: Path,
    hf_config: PretrainedConfig,
    dtype: str,
    max_model_len: int | None,
    device: torch.device,
    allow_long: bool = False,
    disable_sliding_window: bool = False,
    model_impl: str = "auto",
) -> ModelInfo:
    architecture, cls = model_class(
        list(getattr(hf_config, "architectures", None) or []), model_impl
    )
    max_len = resolve_max_model_len(
        hf_config, max_model_len, path, allow_long, disable_sliding_window
    )
    if disable_sliding_window and sliding_window(hf_config) is not None:
        hf_config.sliding_window = None  # every layer (ours or transformers') attends to all
    return ModelInfo(
        path=path,
        hf_config=hf_config,
        architecture=architecture,
        dtype=resolve_dtype(hf_config, dtype, device),
        max_model_len=max_len,
        is_pooling=architecture in POOLING,
        implementation=(
            "transformers" if getattr(cls, "is_transformers_fallback", False) else "native"
        ),
    )


# -- weights -----------------------------------------------------------------------------------


def weight_files(
    path: Path, load_format: str, ignore_patterns: Sequence[str] | None = None
) -> list[Path]:
    """The checkpoint files to read, by ``--load-format`` (auto: safetensors, else PyTorch .bin),
    leaving out those ``--ignore-patterns`` match (None: vLLM's default)."""
    if load_format not in ("auto", "safetensors", "pt"):
        raise ModelLoadError(
            f"load_format must be one of auto, safetensors, pt, dummy; got {load_format!r}"
        )
    patterns = DEFAULT_IGNORE_PATTERNS if ignore_patterns is None else tuple(ignore_patterns)

    def kept(files: list[Path]) -> list[Path]:
        return [
            f
            for f in files
            if not any(fnmatch(f.relative_to(path).as_posix(), p) for p in patterns)
        ]

    if load_format in ("auto", "safetensors"):
        files = kept(
            _indexed(path, "model.safetensors.index.json") or sorted(path.glob("*.safetensors"))
        )
        if files:
            return files
        if load_format == "safetensors":
            raise ModelLoadError(f"no *.safetensors weights in {path} (load_format=safetensors)")
    files = kept(_indexed(path, "pytorch_model.bin.index.json") or sorted(path.glob("*.bin")))
    files = files or kept(sorted(path.glob("*.pt")))
    if not files:
        ignoring = f" (ignoring {', '.join(patterns)})" if patterns else ""
        raise ModelLoadError(f"no model weights (*.safetensors or *.bin) found in {path}{ignoring}")
    return files


def _indexed(path: Path, index_name: str) -> list[Path]:
    """The files a sharded checkpoint's index names, or [] without an index."""
    index = path / index_name
    if not index.is_file():
        return []
    return [
        path / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))
    ]


def iter_weights(
    files: list[Path], use_tqdm: bool = True, counter: ReadCounter | None = None
) -> Iterator[tuple[str, torch.Tensor | LazyWeight]]:
    """Each checkpoint tensor by name. Safetensors come as ``LazyWeight``s that the loaders read
    only in part (a rank's shard); PyTorch files are memory-mapped, so narrowing them reads only
    what is copied too."""
    from safetensors import SafetensorError, safe_open
    from tqdm.auto import tqdm

    counter = counter or ReadCounter()
    progress = tqdm(
        files, desc="Loading weights", unit="file", disable=not use_tqdm or len(files) < 1
    )
    for file in progress:
        try:
            if file.suffix == ".safetensors":
                with safe_open(str(file), framework="pt") as handle:
                    for name in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                        yield name, LazyWeight(handle.get_slice(name), counter)
            else:
                state = torch.load(str(file), map_location="cpu", weights_only=True, mmap=True)
                yield from state.items()
        except (SafetensorError, OSError, RuntimeError, ValueError, EOFError) as error:
            raise ModelLoadError(f"cannot read weights from {file}: {error}") from error


def model_class_of(info: ModelInfo) -> type[nn.Module]:
    """The class that runs the resolved model: ours, or the transformers fallback."""
    impl = "transformers" if info.implementation == "transformers" else "vllm"
    return model_class([info.architecture], impl)[1]


def build_model(
    info: ModelInfo,
    device: torch.device,
    load_format: str = "auto",
    use_tqdm: bool = True,
    seed: int = 0,
    quantization: str | None = None,
    ignore_patterns: Sequence[str] | None = None,
) -> ServableModel:
    """Construct the model on ``device`` in ``info.dtype`` and load its weights."""
    from infernetes.runtime.model_executor import gguf_checkpoint

    cls = model_class_of(info)
    quantized_checkpoint = quantization_config(info)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(info.dtype)
    try:
        with torch.device(device), _linear_weights(info, quantized_checkpoint, load_format, device):
            model: Any = cls(info.hf_config, max_position=max(info.max_model_len, 1))
    finally:
        torch.set_default_dtype(default_dtype)
    if info.is_pooling:
        from infernetes.runtime.model_executor.layers.pooler import Pooler

        model.pooler = Pooler.for_model(info.path, overrides=info.pooler_overrides)
    if load_format == "dummy":
        _dummy_weights(model, seed)
        if quantized_checkpoint is not None:
            from infernetes.runtime.model_executor.layers.quantization.loading import (
                dummy_quantized,
            )

            dummy_quantized(model, quantized_checkpoint, info.dtype, device, seed)
    elif gguf_checkpoint.is_gguf(info.path):
        loaded = gguf_checkpoint.load_gguf(model, info.path, info.hf_config, info.dtype, device)
        _refuse_missing(model, loaded, info.path)
    else:
        files = weight_files(info.path, load_format, ignore_patterns)
        counter = ReadCounter()
        loaded = _load_checkpoint(model, info, iter_weights(files, use_tqdm, counter), device)
        model.checkpoint_bytes_read = counter.bytes
        if tp_size() > 1:
            total = sum(f.stat().st_size for f in files if f.suffix == ".safetensors")
            logger.info(
                "Rank %d read %.1f MiB of the checkpoint's %.1f MiB (its shard)",
                tp_rank(),
                counter.bytes / 2**20,
                total / 2**20,
            )
        _refuse_missing(model, loaded, info.path)
    if quantization == "fp8" and quantized_checkpoint is None:  # online, of full weights
        from infernetes.runtime.model_executor.layers.fused_moe import FusedMoE
        from infernetes.runtime.model_executor.layers.linear import LinearBase

        for module in model.modules():
            if isinstance(module, LinearBase | FusedMoE):
                module.quantize_fp8()
    if device.type == "cpu":  # after quantisation: fp8 weights are not packed
        for module in model.modules():
            pack = getattr(module, "pack_for_cpu", None)
            if pack is not None:
                pack()
    return model.eval()


def _refuse_missing(model: nn.Module, loaded: set[str], path: Path) -> None:
    missing = sorted(name for name, _ in model.named_parameters() if name not in loaded)
    if missing:
        raise ModelLoadError(
            f"the checkpoint in {path} lacks weights for: {', '.join(missing[:8])}"
        )


def _linear_weights(
    info: ModelInfo, quantized: dict[str, Any] | None, load_format: str, device: torch.device
) -> AbstractContextManager[None]:
    """Where the GPU kernels keep a quantized checkpoint's stored weights, or the CPU a GGUF
    file's blocks, the linear layers are built without dense ones (allocated only for the layers
    loaded dense)."""
    from infernetes.runtime.model_executor import gguf_checkpoint
    from infernetes.runtime.model_executor.layers.deferred_weights import (
        dense_weights_on_first_write,
    )
    from infernetes.runtime.model_executor.layers.quantization.loading import keeps_stored

    keeps = (quantized is not None and keeps_stored(device)) or (
        gguf_checkpoint.is_gguf(info.path) and gguf_checkpoint.keeps_quantized(device)
    )
    if keeps and load_format != "dummy" and info.implementation == "native":
        return dense_weights_on_first_write()
    return nullcontext()


def quantization_config(info: ModelInfo) -> dict[str, Any] | None:
    """The checkpoint's quantization_config, None when there is none or the model reads the
    quantized tensors itself."""
    from infernetes.runtime.model_executor.layers.quantization.detect import (
        checkpoint_quant_config,
        read_by_model,
    )

    try:
        config = checkpoint_quant_config(info.path, info.hf_config)
    except ConfigError as error:
        raise ModelLoadError(str(error)) from error
    return None if read_by_model(config) else config


def _load_checkpoint(
    model: Any,
    info: ModelInfo,
    weights: Iterator[tuple[str, torch.Tensor | LazyWeight]],
    device: torch.device,
) -> set[str]:
    """Load the checkpoint's tensors, a quantized checkpoint's through its method
    (layers/quantization)."""
    from infernetes.runtime.model_executor.layers.quantization.checkpoint import CheckpointError
    from infernetes.runtime.model_executor.layers.quantization.loading import load_quantized

    try:
        return load_quantized(model, weights, quantization_config(info), info.dtype, device)
    except (CheckpointError, ConfigError) as error:
        raise ModelLoadError(f"cannot load {info.path}: {error}") from error


def _dummy_weights(model: nn.Module, seed: int) -> None:
    """Small random weights (``--load-format dummy``), for benchmarks of the shape alone."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    for _, param in model.named_parameters():
        values = torch.empty(param.shape, dtype=torch.float32).uniform_(
            -1e-3, 1e-3, generator=generator
        )
        param.data.copy_(values)
