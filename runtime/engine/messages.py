"""What crosses the engine-core boundary (a queue in this process, or the pipe to the core
process), one small type per kind, dispatched with ``match``. NamedTuples: they pickle as a tuple
plus a class reference, as cheap as the bare tuples they replace.

API side -> core: ``AddRequest``, ``AbortRequests``, ``UtilityCall`` (one of
``UTILITY_METHODS``), ``Shutdown``. Core -> API side: ``EngineReady`` or ``LoadFailed`` once, then
``StepOutputs`` (the outputs that changed and the stats recorded since the last message),
``UtilityReply`` (answers a command with a call id) and ``EngineDead`` (the loop has stopped).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from infernetes.runtime.engine.stats import IterationStats, SchedulerStats
from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch
    from infernetes.runtime.engine.input_processor import InputSettings
    from infernetes.runtime.multimodal.audio import AudioProcessor
    from infernetes.runtime.multimodal.audio_language import AudioLanguageProcessor
    from infernetes.runtime.multimodal.inputs import MultiModalFeature
    from infernetes.runtime.multimodal.processor import MultiModalProcessor
    from transformers import PretrainedConfig

UTILITY_METHODS = frozenset(
    {
        "reset_prefix_cache",
        "sleep",
        "wake_up",
        "reload_weights",
        "collective_rpc",
        "add_lora",
        "remove_lora",
        "list_loras",
    }
)


class EngineCoreRequest(NamedTuple):
    """A request prepared on the client side (``input_processor``): tokenized and checked; the
    core only admits it."""

    request_id: str
    prompt: str | None  # the text, when it came as text
    prompt_token_ids: list[int]  # placeholders (0) for a prompt given as embeddings
    params: SamplingParams | None  # checked and settled; None: a pooling request
    priority: int = 0
    lora_request: LoRARequest | None = None
    arrival_time: float | None = None  # wall-clock; None: when the core admits it
    prompt_embeds: torch.Tensor | None = None  # [num_prompt_tokens, hidden] on the CPU
    prompt_embeds_digest: bytes | None = None  # what its prefix-cache hashes start from
    mm_features: list[MultiModalFeature] | None = None  # its images, in order of position


class AddRequest(NamedTuple):
    call_id: int
    # Pickled on its own over the pipe, so a request that cannot be unpickled fails alone.
    request: EngineCoreRequest | bytes


class AbortRequests(NamedTuple):
    call_id: int | None  # None: nobody waits for the reply
    request_ids: list[str]


class UtilityCall(NamedTuple):
    call_id: int
    method: str
    args: tuple[Any, ...] = ()


class Shutdown(NamedTuple):
    pass


EngineCommand = AddRequest | AbortRequests | UtilityCall | Shutdown


class ModelFacts(NamedTuple):
    """What the API side reads of the model's Hugging Face config. Not the PretrainedConfig
    itself: unpickling one imports transformers' configuration module, which imports torch, and
    the API process has no other use for torch."""

    architectures: list[str] | None
    vocab_size: int | None
    num_labels: int | None
    id2label: dict[Any, str]  # transformers types its keys int or str
    # Matryoshka-trained embeddings (is_matryoshka or matryoshka_dimensions in the config, as
    # vLLM reads them; --hf-overrides can set them): the ones whose leading dimensions stand alone
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] | None = None  # None: any

    @classmethod
    def of(cls, hf_config: PretrainedConfig) -> ModelFacts:
        dimensions = getattr(hf_config, "matryoshka_dimensions", None)
        return cls(
            list(hf_config.architectures) if hf_config.architectures else None,
            getattr(hf_config.get_text_config(), "vocab_size", None),
            hf_config.num_labels,
            dict(hf_config.id2label or {}),
            bool(getattr(hf_config, "is_matryoshka", False) or dimensions),
            tuple(dimensions) if dimensions else None,
        )


class EngineInfo(NamedTuple):
    """What the API side needs to know of the loaded engine (all picklable)."""

    tokenizer: Any
    model_config: ModelFacts
    device: str  # "cuda" or "cpu"
    inputs: InputSettings  # what the API side's input processor checks requests against
    # a vision-language model's processor, or a speech model's (Whisper's)
    mm_processor: MultiModalProcessor | AudioProcessor | AudioLanguageProcessor | None = None


class EngineReady(NamedTuple):
    info: EngineInfo


class LoadFailed(NamedTuple):
    error: BaseException


class StepOutputs(NamedTuple):
    outputs: list[Any]  # RequestOutput | PoolingRequestOutput (packed tuples over the pipe)
    stats: list[tuple[SchedulerStats, IterationStats]]


class UtilityReply(NamedTuple):
    call_id: int
    ok: bool
    value: Any  # the result, or the exception when not ok


class EngineDead(NamedTuple):
    error: BaseException


EngineMessage = EngineReady | LoadFailed | StepOutputs | UtilityReply | EngineDead


# Over the pipe a message travels as a bare tuple, its type's index first: pickling a NamedTuple
# looks its class up by name both ways (about 5 us a message, ten times a tuple's).
_WIRE_TYPES: tuple[type, ...] = (
    AddRequest,
    AbortRequests,
    UtilityCall,
    Shutdown,
    EngineReady,
    LoadFailed,
    StepOutputs,
    UtilityReply,
    EngineDead,
)
_WIRE_TAGS = {cls: tag for tag, cls in enumerate(_WIRE_TYPES)}


def to_wire(message: EngineCommand | EngineMessage) -> tuple[Any, ...]:
    return (_WIRE_TAGS[type(message)], *message)


def from_wire(data: tuple[Any, ...]) -> Any:
    """The command or message ``to_wire`` made ``data`` from."""
    return _WIRE_TYPES[data[0]]._make(data[1:])
