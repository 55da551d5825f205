"""Request and response bodies of the OpenAI API, with vLLM's extra sampling fields.

Requests validate the shape (types, ranges); checks that need the model (context length,
logprob cap) happen in the serving classes. Unknown fields are accepted and ignored, as OpenAI
and vLLM do, so newer clients keep working; each such name is logged once at warning level.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

logger = logging.getLogger("infernetes.runtime.server")


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class OpenAIBase(BaseModel):
    # NaN and Infinity parse as JSON numbers in Python; no request field means anything with them.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _first_lone_surrogate(value: Any) -> str | None:
    """The path of the first string holding a lone surrogate (JSON can escape one, e.g. "\\ud800";
    no tokenizer or UTF-8 encoder takes it). Iterative: a body may nest deeper than the stack."""
    pending = [(value, "")]
    while pending:
        item, path = pending.pop()
        if isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                return path or "body"
        elif isinstance(item, dict):
            for key, child in item.items():
                if _LONE_SURROGATE.search(key):
                    return path or "body"
                pending.append((child, f"{path}.{key}" if path else key))
        elif isinstance(item, list):
            pending.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
    return None


# Unknown request fields warned of so far: each name once per process, as vLLM does.
_WARNED_FIELDS: set[str] = set()
_WARNED_FIELDS_LIMIT = 1024  # a client sending random names cannot grow this without bound


def _warn_ignored(body: str, names: list[str]) -> None:
    new = [n for n in names if n not in _WARNED_FIELDS]
    if not new or len(_WARNED_FIELDS) >= _WARNED_FIELDS_LIMIT:
        return
    _WARNED_FIELDS.update(new)
    logger.warning(
        "%s: the request fields %s are not known here and were ignored (warned once per name)",
        body,
        ", ".join(sorted(new)),
    )


class RequestBody(OpenAIBase):
    """A whole request body: its text must be valid Unicode; fields this server does not know
    are accepted (newer clients keep working) and logged, once per name."""

    @model_validator(mode="after")
    def _log_ignored_fields(self) -> RequestBody:
        if self.model_extra:
            _warn_ignored(type(self).__name__, [name[:100] for name in self.model_extra])
        return self

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        if isinstance(data, dict):
            found = _first_lone_surrogate(data)
            if found:
                raise ValueError(
                    f"{found[:200]}: the text holds a lone UTF-16 surrogate "
                    "(\\ud800-\\udfff), which is not valid Unicode"
                )
        return data


# ---------------------------------------------------------------- errors


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


# ---------------------------------------------------------------- shared request fields


class StreamOptions(OpenAIBase):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class JsonSchemaFormat(OpenAIBase):
    name: str | None = None
    description: str | None = None
    # "schema" shadows a BaseModel attribute, hence the alias.
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIBase):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_present(self) -> ResponseFormat:
        if self.type == "json_schema" and (
            self.json_schema is None or self.json_schema.json_schema is None
        ):
            raise ValueError(
                "response_format.json_schema.schema is required when type is 'json_schema'"
            )
        return self


class StructuredOutputs(OpenAIBase):
    """vLLM's ``structured_outputs`` request field: one constraint, and how to apply it."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, populate_by_name=True)

    # "json" shadows a BaseModel attribute, hence the alias.
    json_schema: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    @property
    def constraints(self) -> list[str]:
        """The constraints given, by their request names."""
        given = {
            "json": self.json_schema is not None,
            "regex": self.regex is not None,
            "choice": self.choice is not None,
            "grammar": self.grammar is not None,
            "json_object": bool(self.json_object),
            "structural_tag": self.structural_tag is not None,
        }
        return [name for name, present in given.items() if present]

    @model_validator(mode="after")
    def _one_constraint(self) -> StructuredOutputs:
        given = self.constraints
        if len(given) != 1:
            raise ValueError(
                "give exactly one of json, regex, choice, grammar, json_object, structural_tag; "
                f"got {given or 'none'}"
            )
        if self.choice is not None and not self.choice:
            raise ValueError("choice must list at least one choice")
        return self


# vllm_xargs: arguments of the server's --logits-processors (SamplingParams.extra_args)
VllmXargs = dict[str, str | int | float | list[str | int | float]]


class SamplingFields(RequestBody):
    """Fields common to completions and chat: OpenAI's plus vLLM's extras."""

    model: str | None = None
    frequency_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    # OpenAI's range; a larger bias would only overflow the logits it is added to.
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    n: int = Field(default=1, ge=1, le=128)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=100.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    user: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM's extra sampling parameters
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    # Symmetric around 1 (no penalty): a seen token's logit is divided or multiplied by at most 100.
    repetition_penalty: float | None = Field(default=None, ge=0.01, le=100.0)
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(default=None, ge=1)
    prompt_logprobs: int | None = Field(default=None, ge=0)
    priority: int = 0
    vllm_xargs: VllmXargs | None = None
    request_id: str | None = None
    add_special_tokens: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    # structured output, vLLM's spelling
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    # structured output, current vLLM's spelling
    structured_outputs: StructuredOutputs | None = None
    # a disaggregated prefill's parameters, for the KV connector (docs/disaggregation.md)
    kv_transfer_params: dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str] | None:
        if value is None:
            return None
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_guide(self) -> SamplingFields:
        guides = [
            name
            for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
            if getattr(self, name) is not None
        ]
        if self.response_format is not None and self.response_format.type != "text":
            guides.append("response_format")
        if self.structured_outputs is not None:
            guides.append("structured_outputs")
        if len(guides) > 1:
            raise ValueError(f"only one kind of structured output per request, got {guides}")
        if self.guided_choice is not None and not self.guided_choice:
            raise ValueError("guided_choice must list at least one choice")
        return self


# ---------------------------------------------------------------- completions

PromptInput = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(SamplingFields):
    # vLLM's base64 torch.save'd tensors; before ``prompt`` so that its error is named first when
    # it comes instead of a prompt
    prompt_embeds: str | list[str] | None = None
    prompt: PromptInput | None = None
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0)
    # 0 only with echo: score the prompt (its logprobs), generate nothing, as vLLM allows.
    max_tokens: int | None = Field(default=16, ge=0)
    best_of: int | None = Field(default=None, ge=1)
    suffix: str | None = None

    @property
    def scores_prompt_only(self) -> bool:
        """``max_tokens: 0`` with ``echo``: the prompt and its logprobs, nothing generated."""
        return self.max_tokens == 0

    @field_validator("prompt_embeds")
    @classmethod
    def _embeds_not_empty(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and not value:
            raise ValueError("prompt_embeds must not be an empty list")
        return value

    @model_validator(mode="after")
    def _a_prompt(self) -> CompletionRequest:
        if self.prompt is None and self.prompt_embeds is None:
            raise ValueError("prompt: one of prompt or prompt_embeds is required")
        return self

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, value: PromptInput | None) -> PromptInput | None:
        if isinstance(value, list) and not value:
            raise ValueError("prompt must not be an empty list")
        if isinstance(value, list) and any(isinstance(p, list) and not p for p in value):
            raise ValueError("prompt token lists must not be empty")
        return value


class Logprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: list[dict[int, Any] | None] | None = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    kv_transfer_params: dict[str, Any] | None = None  # a prefill engine's, for the decode one


# ---------------------------------------------------------------- chat


class FunctionDefinition(OpenAIBase):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(OpenAIBase):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIBase):
    name: str


class NamedToolChoice(OpenAIBase):
    type: Literal["function"] = "function"
    function: NamedFunction


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl-tool"))
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionCallIn(OpenAIBase):
    name: str
    # OpenAI sends a JSON string; some clients send the object itself
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(OpenAIBase):
    """A tool call of an earlier assistant message, as the client sends it back."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(OpenAIBase):
    role: str = Field(min_length=1)
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessageIn] = Field(min_length=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=0, ge=0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True
    # vLLM's chat extras
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, str]] | None = None
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None  # over --mm-processor-kwargs

    @model_validator(mode="after")
    def _check_tools(self) -> ChatCompletionRequest:
        if self.continue_final_message and self.add_generation_prompt:
            # vLLM's rule: continuing the final message means no new generation prompt.
            self.add_generation_prompt = False
        if isinstance(self.tool_choice, NamedToolChoice):
            names = {tool.function.name for tool in self.tools or []}
            if self.tool_choice.function.name not in names:
                raise ValueError(
                    f"tool_choice names function {self.tool_choice.function.name!r}, "
                    f"which is not in tools (have: {sorted(names)})"
                )
        if self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs a non-empty tools list")
        return self

    @property
    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class ChatMessageOut(BaseModel):
    role: str
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: list[dict[int, Any] | None] | None = None
    kv_transfer_params: dict[str, Any] | None = None  # a prefill engine's, for the decode one


# ---------------------------------------------------------------- embeddings


class EmbeddingRequest(RequestBody):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=1)

    @field_validator("input")
    @classmethod
    def _input_not_empty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("input must not be an empty list")
        return value


class EmbeddingData(BaseModel):
    index: int
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str


class EmbeddingResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("embd"))
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[EmbeddingData]
    usage: UsageInfo


# ---------------------------------------------------------------- pooling


class PoolingRequest(EmbeddingRequest):
    """POST /pooling (vLLM): the pooled output of each input; for an embedding model, its
    embedding."""


class PoolingData(BaseModel):
    index: int
    object: Literal["pooling"] = "pooling"
    data: list[float] | str


class PoolingResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("pool"))
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[PoolingData]
    usage: UsageInfo


# ---------------------------------------------------------------- cross-encoders


class ScoreRequest(RequestBody):
    """POST /score (vLLM): ``text_1`` against each ``text_2`` (one to many, or pairwise)."""

    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]
    truncate_prompt_tokens: int | None = Field(default=None, ge=1)
    user: str | None = None


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("score"))
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ScoreData]
    usage: UsageInfo


class RerankRequest(RequestBody):
    """POST /rerank (Jina's and Cohere's shape, v1 and v2): documents ordered by relevance."""

    model: str | None = None
    query: str
    documents: list[str] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=0)
    return_documents: bool = True
    truncate_prompt_tokens: int | None = Field(default=None, ge=1)


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    document: RerankDocument | None = None
    relevance_score: float


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("rerank"))
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class ClassificationRequest(RequestBody):
    """POST /classify (vLLM): each input's class probabilities and most likely label."""

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    truncate_prompt_tokens: int | None = Field(default=None, ge=1)
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _input_not_empty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("input must not be an empty list")
        return value


class ClassificationData(BaseModel):
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("classify"))
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ClassificationData]
    usage: UsageInfo


# ---------------------------------------------------------------- responses


class ResponsesTextFormat(OpenAIBase):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    description: str | None = None
    # "schema" shadows a BaseModel attribute, hence the alias.
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponsesText(OpenAIBase):
    format: ResponsesTextFormat | None = None


class ResponsesFunctionTool(OpenAIBase):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesNamedToolChoice(OpenAIBase):
    type: Literal["function"]
    name: str


class ResponsesReasoning(OpenAIBase):
    effort: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(RequestBody):
    """POST /v1/responses (OpenAI's Responses API, as vLLM serves it)."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    tools: list[ResponsesFunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponsesNamedToolChoice = "auto"
    parallel_tool_calls: bool = True
    text: ResponsesText | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None
    reasoning: ResponsesReasoning | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    # vLLM's extras: --logits-processors' arguments, and the chat template's own
    vllm_xargs: VllmXargs | None = None
    chat_template_kwargs: dict[str, Any] | None = None


# ---------------------------------------------------------------- tokenizer routes


class TokenizeCompletionRequest(RequestBody):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(RequestBody):
    model: str | None = None
    messages: list[ChatMessageIn] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    return_token_strs: bool | None = False


TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class LoadLoRAAdapterRequest(RequestBody):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(RequestBody):
    lora_name: str
    lora_int_id: int | None = None


class DetokenizeRequest(RequestBody):
    model: str | None = None
    tokens: list[int]


class CollectiveRpcRequest(RequestBody):
    """vLLM's dev-mode ``/collective_rpc``: a worker method by name, on every rank."""

    method: str
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    timeout: float | None = None  # vLLM's field; the call waits as long as the method runs


class DetokenizeResponse(BaseModel):
    prompt: str


# ---------------------------------------------------------------- models


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "infernetes"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TranscriptionRequest(RequestBody):
    """The form fields of ``/v1/audio/transcriptions`` and ``/v1/audio/translations`` beside
    the ``file`` (vLLM's): the decoder's language and previous text, the answer's format, and
    vLLM's sampling extras."""

    model: str | None = None
    language: str | None = None
    prompt: str = ""
    response_format: Literal["json", "text", "srt", "verbose_json", "vtt"] = "json"
    timestamp_granularities: list[Literal["word", "segment"]] = Field(
        default_factory=list, alias="timestamp_granularities[]"
    )
    # a translation's target: Whisper translates into English only
    to_language: str | None = None
    stream: bool = False
    stream_include_usage: bool = False
    stream_continuous_usage_stats: bool = False
    temperature: float = Field(default=0.0, ge=0.0, le=100.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, ge=0.01, le=100.0)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class TranscriptionUsage(OpenAIBase):
    type: Literal["duration"] = "duration"
    seconds: int


class TranscriptionResponse(OpenAIBase):
    text: str
    usage: TranscriptionUsage


class TranslationResponse(OpenAIBase):
    text: str


class TranscriptionSegment(OpenAIBase):
    """One timed stretch of a ``verbose_json`` answer (OpenAI's fields): ``seek`` is its clip's
    start in mel frames (10 ms), ``no_speech_prob`` is not computed (null)."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float | None = None


class VerboseTranslationResponse(OpenAIBase):
    task: Literal["transcribe", "translate"] = "translate"
    language: str
    duration: float
    text: str
    segments: list[TranscriptionSegment]


class VerboseTranscriptionResponse(VerboseTranslationResponse):
    task: Literal["transcribe", "translate"] = "transcribe"
    usage: TranscriptionUsage
