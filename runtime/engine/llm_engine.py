"""LLMEngine: the synchronous client of an EngineCore in this process (what the offline ``LLM``
drives): prepare requests (its input processor), add them, step until they finish, read the
outputs. The server goes through ``AsyncEngine`` instead, with the core in a thread or a process of
its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infernetes.runtime.engine.engine_core import EngineCore, EngineOutput
from infernetes.runtime.engine.input_processor import InputProcessor, Prompt
from infernetes.runtime.engine.stats import StatLogger
from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.sampling_params import SamplingParams

from infernetes.schema.config import ServeConfig


class LLMEngine:
    def __init__(self, config: ServeConfig, stat_loggers: Sequence[StatLogger] = ()) -> None:
        if config.data_parallel_size > 1:
            raise ValueError(
                "data_parallel_size above 1 runs several engine cores behind the server "
                "(infernetes serve, AsyncEngine); the offline engine runs one"
            )
        self.engine_core = EngineCore(config, stat_loggers)
        info = self.engine_core.info()
        self.input_processor = InputProcessor(info.inputs, info.tokenizer, info.mm_processor)
        self.tokenizer = info.tokenizer
        self.max_model_len = info.inputs.max_model_len
        self.model_config = info.model_config
        self.is_pooling = info.inputs.is_pooling
        self.default_sampling_params: dict[str, Any] = info.inputs.default_sampling_params

    @classmethod
    def from_config(cls, config: ServeConfig, stat_loggers: Sequence[StatLogger] = ()) -> LLMEngine:
        return cls(config, stat_loggers)

    def get_default_sampling_params(self) -> SamplingParams:
        return self.input_processor.default_sampling_params()

    def add_request(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        priority: int = 0,
        arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Validate and queue a request; raises ValueError naming the problem (nothing is queued)."""
        self.engine_core.add_request(
            self.input_processor.process(
                request_id, prompt, params, priority, arrival_time, lora_request
            )
        )

    def abort_request(self, request_ids: str | Sequence[str]) -> list[EngineOutput]:
        """Abort requests at any point; their blocks are freed now. Returns their final outputs."""
        return self.engine_core.abort_requests(request_ids)

    def step(self) -> list[EngineOutput]:
        return self.engine_core.step()

    def has_unfinished_requests(self) -> bool:
        return self.engine_core.has_unfinished_requests()

    def reset_prefix_cache(self) -> bool:
        return self.engine_core.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        self.engine_core.sleep(level)

    def wake_up(self, tags: Sequence[str] | None = None) -> bool:
        return self.engine_core.wake_up(tags)

    def reload_weights(self) -> None:
        self.engine_core.reload_weights()

    def collective_rpc(
        self, method: str, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> list[Any]:
        return self.engine_core.collective_rpc(method, args, kwargs)

    @property
    def is_sleeping(self) -> bool:
        return self.engine_core.is_sleeping

    def shutdown(self) -> None:
        """Stop the worker processes now (otherwise when the engine is collected, or at exit)."""
        self.engine_core.shutdown()
