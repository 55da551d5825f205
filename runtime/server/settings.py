"""The frontend's view of the configuration: what the HTTP side needs, read once from ServeConfig.

Keeping it a small dataclass lets the app be built and tested without a full engine config, and
keeps the server's dependencies on argument names in one place.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infernetes.runtime.multimodal.media import MediaSettings

from infernetes.schema.config import ServeConfig
from infernetes.schema.env import read_env
from infernetes.schema.rules import structured_outputs_backend

TRUE_VALUES = {"1", "true", "yes", "on"}


def env_flag(name: str, environ: Any = None) -> bool:
    environ = os.environ if environ is None else environ
    return str(environ.get(name, "")).strip().lower() in TRUE_VALUES


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


@dataclass(frozen=True)
class FrontendSettings:
    model: str = "model"
    served_model_names: tuple[str, ...] = ("model",)
    host: str | None = None
    port: int = 8000
    uds: str | None = None  # --uds: a Unix socket instead of host and port
    uvicorn_log_level: str = "info"
    api_keys: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ("*",)
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    root_path: str | None = None
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = 0
    ssl_ciphers: str | None = None  # None: Python's default cipher list
    enable_ssl_refresh: bool = False
    enable_request_id_headers: bool = False
    max_log_len: int | None = None
    enable_log_requests: bool = False
    disable_uvicorn_access_log: bool = False
    quiet_access_paths: tuple[str, ...] = ()  # --disable-access-log-for-endpoints
    middleware: tuple[str, ...] = ()
    return_tokens_as_token_ids: bool = False
    enable_prompt_tokens_details: bool = False
    enable_force_include_usage: bool = False
    sse_keep_alive_interval: float = 0  # seconds; 0: no keep-alive comments
    enable_server_load_tracking: bool = False
    enable_tokenizer_info_endpoint: bool = False
    max_concurrency: int | None = None
    shutdown_timeout: int = 30
    log_config_file: str | None = None
    disable_log_stats: bool = False
    disable_fastapi_docs: bool = False
    chat_template: str | None = None
    chat_template_content_format: str = "auto"
    trust_request_chat_template: bool = False
    response_role: str = "assistant"
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    tool_parser_plugin: str = ""  # a Python file registering more tool-call parsers
    reasoning_parser: str | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None  # --default-chat-template-kwargs
    exclude_tools_when_tool_choice_none: bool = False
    guided_decoding_backend: str = "auto"
    guided_decoding_disable_any_whitespace: bool = False
    show_hidden_metrics_for_version: str | None = None
    task: str = "auto"
    dev_mode: bool = False
    keep_alive_on_engine_death: bool = False
    http_keep_alive_s: int = 5
    enable_lora: bool = False
    max_loras: int = 0  # with --enable-lora (the lora_requests_info gauge's max_lora)
    lora_modules: tuple[Mapping[str, Any], ...] = ()  # loaded at startup
    allow_runtime_lora_updating: bool = False  # VLLM_ALLOW_RUNTIME_LORA_UPDATING
    # where images, videos and audio come from; the audio file size limit
    media: MediaSettings = field(default_factory=MediaSettings)
    trust_request_mm_kwargs: bool = False  # requests may set mm_processor_kwargs

    @property
    def default_chat_template_kwargs(self) -> dict[str, Any]:
        """What chat templates receive unless a request says otherwise:
        ``--default-chat-template-kwargs``, and ``--reasoning-effort`` as ``reasoning_effort``,
        the way vLLM passes it."""
        effort = {"reasoning_effort": self.reasoning_effort} if self.reasoning_effort else {}
        return {**(self.chat_template_kwargs or {}), **effort}

    @property
    def model_name(self) -> str:
        """The name reported in responses and in the metrics' model_name label."""
        return self.served_model_names[0]

    @classmethod
    def from_config(
        cls, config: ServeConfig, environ: Mapping[str, str] | None = None
    ) -> FrontendSettings:
        environ = os.environ if environ is None else environ

        def get(dest: str, default: Any = None) -> Any:
            value = getattr(config, dest, default)
            return default if value is None else value

        model = str(get("model", "model"))
        names = tuple(_as_list(get("served_model_name"))) or (model,)
        api_keys = tuple(_as_list(get("api_key"))) or tuple(
            k for k in [environ.get("VLLM_API_KEY")] if k
        )
        # --structured-outputs-config's keys, where given, over the older --guided-decoding-*
        structured = dict(get("structured_outputs_config", {}))
        return cls(
            model=model,
            media=MediaSettings.of(config, environ),
            served_model_names=names,
            host=getattr(config, "host", None),
            port=int(get("port", 8000)),
            uds=get("uds"),
            uvicorn_log_level=str(get("uvicorn_log_level", "info")),
            api_keys=api_keys,
            allowed_origins=tuple(_as_list(get("allowed_origins", ["*"]))),
            allowed_methods=tuple(_as_list(get("allowed_methods", ["*"]))),
            allowed_headers=tuple(_as_list(get("allowed_headers", ["*"]))),
            allow_credentials=bool(get("allow_credentials", False)),
            root_path=get("root_path"),
            ssl_keyfile=get("ssl_keyfile"),
            ssl_certfile=get("ssl_certfile"),
            ssl_ca_certs=get("ssl_ca_certs"),
            ssl_cert_reqs=int(get("ssl_cert_reqs", 0)),
            ssl_ciphers=get("ssl_ciphers"),
            enable_ssl_refresh=bool(get("enable_ssl_refresh", False)),
            enable_request_id_headers=bool(get("enable_request_id_headers", False)),
            max_log_len=get("max_log_len"),
            enable_log_requests=bool(get("enable_log_requests", False)),
            disable_uvicorn_access_log=bool(get("disable_uvicorn_access_log", False)),
            quiet_access_paths=tuple(
                p.strip()
                for p in get("disable_access_log_for_endpoints", "").split(",")
                if p.strip()
            ),
            middleware=tuple(_as_list(get("middleware"))),
            return_tokens_as_token_ids=bool(get("return_tokens_as_token_ids", False)),
            enable_prompt_tokens_details=bool(get("enable_prompt_tokens_details", False)),
            enable_force_include_usage=bool(get("enable_force_include_usage", False)),
            sse_keep_alive_interval=float(get("sse_keep_alive_interval", 0)),
            enable_server_load_tracking=bool(get("enable_server_load_tracking", False)),
            enable_tokenizer_info_endpoint=bool(get("enable_tokenizer_info_endpoint", False)),
            max_concurrency=get("max_concurrency"),
            shutdown_timeout=int(get("shutdown_timeout", 30)),
            log_config_file=get("log_config_file"),
            disable_log_stats=bool(get("disable_log_stats", False)),
            disable_fastapi_docs=bool(get("disable_fastapi_docs", False)),
            chat_template=get("chat_template"),
            chat_template_content_format=str(get("chat_template_content_format", "auto")),
            trust_request_chat_template=bool(get("trust_request_chat_template", False)),
            trust_request_mm_kwargs=bool(get("trust_request_mm_kwargs", False)),
            response_role=str(get("response_role", "assistant")),
            enable_auto_tool_choice=bool(get("enable_auto_tool_choice", False)),
            tool_call_parser=get("tool_call_parser"),
            tool_parser_plugin=str(get("tool_parser_plugin") or ""),
            reasoning_parser=get("reasoning_parser") or structured.get("reasoning_parser") or None,
            reasoning_effort=get("reasoning_effort"),
            chat_template_kwargs=dict(get("default_chat_template_kwargs", {})),
            exclude_tools_when_tool_choice_none=bool(
                get("exclude_tools_when_tool_choice_none", False)
            ),
            guided_decoding_backend=structured_outputs_backend(
                structured, get("guided_decoding_backend")
            ),
            guided_decoding_disable_any_whitespace=bool(
                structured.get(
                    "disable_any_whitespace", get("guided_decoding_disable_any_whitespace", False)
                )
            ),
            show_hidden_metrics_for_version=get("show_hidden_metrics_for_version"),
            task=str(get("task", "auto")),
            dev_mode=env_flag("VLLM_SERVER_DEV_MODE", environ),
            keep_alive_on_engine_death=env_flag("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", environ),
            http_keep_alive_s=read_env("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", environ),
            enable_lora=bool(get("enable_lora", False)),
            max_loras=int(get("max_loras", 1)) if get("enable_lora", False) else 0,
            lora_modules=tuple(dict(m) for m in get("lora_modules", [])),
            allow_runtime_lora_updating=env_flag("VLLM_ALLOW_RUNTIME_LORA_UPDATING", environ),
        )
