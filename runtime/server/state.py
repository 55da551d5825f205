"""What the routes reach through ``app.state.server``: the engine once loaded, the serving
objects built on it, the metrics, and the lifecycle flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infernetes.runtime.server.chat_template import ChatRenderer, load_chat_template
from infernetes.runtime.server.errors import APIError
from infernetes.runtime.server.log_stats import LoggingStatLogger
from infernetes.runtime.server.lora_models import LoRAModels
from infernetes.runtime.server.metrics import PrometheusStatLogger
from infernetes.runtime.server.reasoning import make_reasoning_parser
from infernetes.runtime.server.serving_chat import ChatServing
from infernetes.runtime.server.serving_completion import CompletionServing
from infernetes.runtime.server.serving_embedding import EmbeddingServing
from infernetes.runtime.server.serving_responses import ResponsesServing
from infernetes.runtime.server.serving_score import ScoreServing
from infernetes.runtime.server.serving_tokenization import TokenizationServing
from infernetes.runtime.server.serving_transcription import TranscriptionServing
from infernetes.runtime.server.settings import FrontendSettings

if TYPE_CHECKING:
    from infernetes.runtime.engine.async_engine import AsyncEngine


class StatLoggerFanout:
    """The stat logger handed to the engine before it loads; the Prometheus logger (which needs
    the loaded model's max_model_len) joins it afterwards."""

    def __init__(self, loggers: list[Any] | None = None) -> None:
        self.loggers: list[Any] = list(loggers or [])

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        for logger in self.loggers:
            logger.record(scheduler_stats, iteration_stats)


@dataclass(frozen=True)
class Servings:
    """The serving objects built on a loaded engine, one per kind of endpoint."""

    engine: AsyncEngine
    completion: CompletionServing
    chat: ChatServing
    responses: ResponsesServing
    embedding: EmbeddingServing
    score: ScoreServing
    tokenization: TokenizationServing
    transcription: TranscriptionServing


@dataclass
class ServerState:
    settings: FrontendSettings
    stat_fanout: StatLoggerFanout = field(default_factory=StatLoggerFanout)
    cache_config: dict[str, Any] = field(default_factory=dict)
    # the resolved serve configuration by group, secrets masked (dev mode's /server_info)
    serve_config: dict[str, Any] = field(default_factory=dict)
    engine: AsyncEngine | None = None
    load_error: BaseException | None = None
    metrics: PrometheusStatLogger | None = None
    servings: Servings | None = None
    is_embedding_model: bool = False
    is_cross_encoder: bool = False
    loras: LoRAModels = field(init=False)

    def __post_init__(self) -> None:
        self.loras = LoRAModels(self.settings)

    async def load_lora_modules(self, engine: AsyncEngine) -> None:
        """Load ``--lora-modules`` before the routes answer: a request may name one at once."""
        await self.loras.load_modules(engine, self.settings.lora_modules)

    def attach_engine(self, engine: AsyncEngine) -> None:
        """Builds the serving objects on a loaded engine; the routes answer from then on."""
        settings = self.settings
        renderer = ChatRenderer(
            engine.tokenizer,
            load_chat_template(settings.chat_template),
            settings.chat_template_content_format,
            settings.trust_request_chat_template,
            settings.default_chat_template_kwargs,
            engine.media_placeholders,
        )
        reasoning = (
            make_reasoning_parser(settings.reasoning_parser) if settings.reasoning_parser else None
        )
        self.metrics = PrometheusStatLogger(
            settings.model_name,
            engine.max_model_len,
            self.cache_config,
            settings.show_hidden_metrics_for_version,
            engines=len(engine.cores),
            max_loras=settings.max_loras,
        )
        self.stat_fanout.loggers.append(self.metrics)
        for stat_logger in self.stat_fanout.loggers:
            if isinstance(stat_logger, LoggingStatLogger):
                stat_logger.cache_label = (
                    "CPU" if getattr(engine, "device", "cuda") == "cpu" else "GPU"
                )
        chat = ChatServing(engine, settings, renderer, reasoning)
        self.servings = Servings(
            engine=engine,
            completion=CompletionServing(engine, settings),
            chat=chat,
            responses=ResponsesServing(chat),
            embedding=EmbeddingServing(engine, settings),
            score=ScoreServing(engine, settings),
            tokenization=TokenizationServing(engine, settings, renderer),
            transcription=TranscriptionServing(engine, settings),
        )
        for serving in (
            self.servings.completion,
            chat,
            self.servings.embedding,
            self.servings.score,
            self.servings.tokenization,
            self.servings.transcription,
        ):
            serving.loras = self.loras
        pooling = bool(getattr(engine, "is_pooling", False))
        architectures = getattr(getattr(engine, "model_config", None), "architectures", None)
        self.is_cross_encoder = pooling and any(
            name.endswith("ForSequenceClassification") for name in architectures or []
        )
        self.is_embedding_model = not self.is_cross_encoder and (
            settings.task in ("embed", "embedding") or pooling
        )
        self.engine = engine

    @property
    def healthy(self) -> bool:
        return self.engine is not None and not getattr(self.engine, "errored", False)

    def require_engine(self) -> Servings:
        """The serving objects, or the API error that says why there are none to answer with."""
        if self.load_error is not None:
            raise APIError(f"the model failed to load: {self.load_error}", 503)
        if self.engine is None:
            raise APIError("the model is still loading; retry shortly", 503)
        if getattr(self.engine, "errored", False):
            raise APIError(
                f"the engine has stopped: {getattr(self.engine, 'dead_error', None)}", 503
            )
        if self.servings is None:  # attach_engine sets it with the engine
            raise APIError("the model is still loading; retry shortly", 503)
        return self.servings

    def require_generation(self) -> Servings:
        servings = self.require_engine()
        if self.is_cross_encoder:
            raise APIError(
                "this model is a cross-encoder; it answers /score, /rerank and /classify",
                400,
                "model",
            )
        if self.is_embedding_model:
            raise APIError(
                "this model is served for embeddings (--task embed); it has no completions or chat",
                400,
                "model",
            )
        return servings

    def require_transcription(self) -> Servings:
        """The serving objects of a speech model (Whisper), else a 400 naming ``model``."""
        servings = self.require_engine()
        inputs = getattr(servings.engine, "input_processor", None)  # a stand-in engine has none
        processor = getattr(inputs, "mm_processor", None)
        if not getattr(processor, "requires_audio", False):
            raise APIError(
                "this model does not transcribe audio: /v1/audio/transcriptions and "
                "/v1/audio/translations need a speech model such as Whisper",
                400,
                "model",
            )
        return servings

    def require_embedding(self) -> Servings:
        servings = self.require_engine()
        if not self.is_embedding_model:
            raise APIError(
                "this model does not support embeddings; serve an embedding model "
                "with --task embed",
                400,
                "model",
            )
        return servings

    def require_cross_encoder(self) -> Servings:
        servings = self.require_engine()
        if not self.is_cross_encoder:
            raise APIError(
                "this model is not a cross-encoder (a *ForSequenceClassification model): "
                "it has no /score, /rerank or /classify",
                400,
                "model",
            )
        return servings
