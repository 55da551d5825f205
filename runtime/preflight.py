"""What ``serve`` checks before it starts anything, and ``config`` checks the same way: every
setting that can be judged without the model. The ``VLLM_*`` values, logging, the frontend's
parsers, templates and structured-output backend, the device and backends, and the JSON arguments
the engine parses (``--compilation-config``, ``--override-generation-config``,
``--kv-transfer-config``). What depends on
the model (its context length, dtype, layers) is the engine's ``resolve_config``, which ``config``
runs too when the model is on local disk.

Nothing heavy is imported at module level: the API process stays free of torch unless a setting
given needs it to be judged (a device, a compile backend)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from infernetes.schema.config import ServeConfig
from infernetes.schema.env import check_env_values, read_env

if TYPE_CHECKING:
    from infernetes.runtime.server.settings import FrontendSettings


def check_settings(config: ServeConfig, environ: Mapping[str, str] | None = None) -> None:
    """Raises ValueError naming the first setting ``serve`` would fail on."""
    from infernetes.runtime.logging_config import LoggingSettings
    from infernetes.runtime.server.settings import FrontendSettings

    environ = os.environ if environ is None else environ
    check_env_values(environ)
    LoggingSettings.from_env(environ)
    settings = FrontendSettings.from_config(config, environ)
    check_frontend_settings(settings)
    check_api_servers(config, settings)
    check_engine_settings(config, environ)


def check_api_servers(config: ServeConfig, settings: FrontendSettings) -> None:
    """What several API processes (``--api-server-count``) cannot share: each keeps its own
    adapter names and its own idea of whether the engine sleeps."""
    if config.api_server_count <= 1:
        return
    if settings.allow_runtime_lora_updating:
        raise ValueError(
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING cannot be combined with --api-server-count above 1: "
            "an adapter loaded through one API process would be unknown to the others "
            "(--lora-modules load in every one)"
        )
    if config.enable_sleep_mode:
        raise ValueError(
            "--enable-sleep-mode cannot be combined with --api-server-count above 1: a sleep "
            "asked of one API process would leave the others sending requests to a sleeping "
            "engine"
        )


def check_frontend_settings(settings: FrontendSettings) -> None:
    """Refuses settings the API server cannot honour (parsers, chat template, guided backend)."""
    from infernetes.runtime.server.chat_template import load_chat_template
    from infernetes.runtime.server.middleware import resolve_user_middleware
    from infernetes.runtime.server.reasoning import make_reasoning_parser
    from infernetes.runtime.server.structured_output import GuideError, check_backend
    from infernetes.runtime.server.tool_parsers import (
        check_tool_parser_name,
        load_tool_parser_plugin,
    )

    if settings.tool_parser_plugin:  # first: its parsers are valid --tool-call-parser names
        load_tool_parser_plugin(settings.tool_parser_plugin)
    if settings.tool_call_parser:
        check_tool_parser_name(settings.tool_call_parser)
    if settings.enable_auto_tool_choice and not settings.tool_call_parser:
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")
    if settings.reasoning_parser:
        make_reasoning_parser(settings.reasoning_parser)
    if settings.tool_call_parser == "openai" or settings.reasoning_parser == "openai_gptoss":
        from infernetes.runtime.server.harmony import harmony_encoding

        harmony_encoding()  # a vocabulary it cannot find fails now, not at the first request
    load_chat_template(settings.chat_template)  # a missing file fails now, not after loading
    for qualified in settings.middleware:
        resolve_user_middleware(qualified)
    try:
        check_backend(settings.guided_decoding_backend, "--guided-decoding-backend")
    except GuideError as exc:
        raise ValueError(str(exc)) from exc


def check_engine_settings(config: ServeConfig, environ: Mapping[str, str]) -> None:
    """What would fail the engine once its process has started, by the engine's own functions.

    The device is looked up (torch, seconds of imports this process otherwise never needs) only
    where the answer depends on it: ``--device cuda`` must find one, and TRITON_ATTN needs one
    (or the interpreter); any other backend runs on whatever ``auto`` finds."""
    from infernetes.kernels.backend import (
        TRITON_ATTN,
        BackendError,
        requested_backend,
        startup_backend,
    )
    from infernetes.runtime.engine.generation_config import check_generation_overrides
    from infernetes.runtime.executor.backend_check import check_executor_backend

    check_executor_backend(config.distributed_executor_backend)
    if config.logits_processors:
        from infernetes.runtime.logits_processor import load_logits_processor_classes

        load_logits_processor_classes(config.logits_processors)
    check_generation_overrides(config.override_generation_config)
    pp_layer_partition(environ)
    # their parsers' module needs torch
    if (
        config.compilation_config
        or config.kv_transfer_config
        or config.kv_offloading_size is not None
        or config.speculative_config
        or config.kv_events_config
    ):
        from infernetes.runtime.kv_events.config import kv_events_config
        from infernetes.runtime.kv_transfer.config import kv_transfer_config
        from infernetes.runtime.model_executor.compilation import parse_compilation_config
        from infernetes.runtime.spec_decode.config import speculative_config

        parse_compilation_config(config.compilation_config)
        kv_transfer_config(
            config.kv_transfer_config,
            config.kv_offloading_size,
            config.kv_offloading_backend,
            config.block_size,  # (None: the engine checks its default)
        )
        kv_events_config(config.kv_events_config, config.data_parallel_size)
        speculative_config(
            config.speculative_config,
            config.pipeline_parallel_size,
            config.tensor_parallel_size,
        )
    device = config.device
    if device in (None, "auto") and requested_backend(config.attention_backend) != TRITON_ATTN:
        return  # the engine's own check (and its warnings) cannot fail on any device
    try:
        if device != "cpu":
            from infernetes.runtime.engine.engine_config import resolve_device

            device = resolve_device(device).type
        startup_backend(config.attention_backend, device)
    except BackendError as exc:
        raise ValueError(str(exc)) from exc


def pp_layer_partition(environ: Mapping[str, str]) -> tuple[int, ...] | None:
    """``VLLM_PP_LAYER_PARTITION`` as layer counts (None: unset, an even split); that they fit
    the model's layers and the stages is ``parallel.stage_layers``'s rule."""
    text = read_env("VLLM_PP_LAYER_PARTITION", environ)
    if not text:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(
            f"VLLM_PP_LAYER_PARTITION={text!r} must be comma-separated layer counts, e.g. 12,20"
        ) from None
