"""The LoRA adapters a server serves beside its base model (vLLM's ``OpenAIServingModels``):
the ``--lora-modules`` loaded at startup, those loaded and unloaded at run time through
``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``), and a request's ``model`` resolved to its adapter."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.server.errors import APIError
from infernetes.runtime.server.settings import FrontendSettings


class LoRAModels:
    def __init__(self, settings: FrontendSettings) -> None:
        self.settings = settings
        self.adapters: dict[str, LoRARequest] = {}
        self._ids = itertools.count(1)  # a new id per load: the engine's caches key on it
        self._lock = asyncio.Lock()  # one load or unload at a time: names stay unique

    def resolve(self, name: str | None) -> LoRARequest | None:
        """The adapter a request's ``model`` names; None for the base model (or no name)."""
        return None if name is None else self.adapters.get(name)

    async def load_modules(self, engine: Any, modules: Iterable[Mapping[str, Any]]) -> None:
        """The ``--lora-modules`` at startup; a bad one stops the server (ValueError)."""
        for module in modules:
            try:
                await self.load(
                    engine, module["name"], module["path"], module.get("base_model_name")
                )
            except APIError as error:
                raise ValueError(f"--lora-modules {module['name']}: {error.message}") from None

    async def load(
        self, engine: Any, name: str, path: str, base_model_name: str | None = None
    ) -> LoRARequest:
        if not self.settings.enable_lora:
            raise APIError("LoRA adapters need the server to run with --enable-lora", 400)
        if not name or not path:
            raise APIError("lora_name and lora_path are both required", 400, "lora_name")
        async with self._lock:
            if name in self.adapters:
                raise APIError(
                    f"The lora adapter '{name}' has already been loaded.", 400, "lora_name"
                )
            if name in self.settings.served_model_names:
                raise APIError(
                    f"'{name}' is the base model's name; give the adapter another", 400, "lora_name"
                )
            base = base_model_name or self.settings.model_name
            request = LoRARequest(name, next(self._ids), path, base)
            try:
                await engine.add_lora(request)
            except ValueError as error:
                raise APIError(str(error), 400, "lora_path") from None
            self.adapters[name] = request
            return request

    async def unload(self, engine: Any, name: str) -> None:
        async with self._lock:
            request = self.adapters.pop(name, None)
            if request is None:
                raise APIError(f"The lora adapter '{name}' cannot be found.", 404, "lora_name")
            await engine.remove_lora(request.lora_int_id)
