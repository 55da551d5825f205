"""The rules that tie several arguments together, checked after each value is valid on its own."""

from __future__ import annotations

from typing import Any

from infernetes.schema.args import BY_DEST
from infernetes.schema.choices import REASONING_PARSERS
from infernetes.schema.errors import ConfigError

# --structured-outputs-config's keys (vLLM's StructuredOutputsConfig) and the values each takes.
STRUCTURED_OUTPUTS_KEYS: dict[str, tuple[type, tuple[Any, ...] | None]] = {
    "backend": (str, ("auto", "guidance", "lm-format-enforcer", "outlines", "xgrammar")),
    "disable_fallback": (bool, None),
    "disable_any_whitespace": (bool, None),
    "disable_additional_properties": (bool, None),
    "reasoning_parser": (str, ("", *REASONING_PARSERS)),
    "enable_in_reasoning": (bool, None),
}


def _check_structured_outputs(config: dict[str, Any]) -> None:
    for key, value in config.items():
        flag = f"--structured-outputs-config.{key}"
        if key not in STRUCTURED_OUTPUTS_KEYS:
            raise ConfigError(
                f"argument --structured-outputs-config: unknown key {key!r} "
                f"(allowed: {', '.join(STRUCTURED_OUTPUTS_KEYS)})",
                "structured_outputs_config",
            )
        kind, allowed = STRUCTURED_OUTPUTS_KEYS[key]
        if not isinstance(value, kind):
            raise ConfigError(
                f"argument {flag}: expected a {kind.__name__}, got {value!r}",
                "structured_outputs_config",
            )
        if allowed is not None and value not in allowed:
            shown = ", ".join(repr(a) if a == "" else str(a) for a in allowed)
            raise ConfigError(
                f"argument {flag}: invalid choice {value!r} (choose from {shown})",
                "structured_outputs_config",
            )


# The structured-output backends the engine has; "auto" is xgrammar, falling back to guidance
# for a constraint xgrammar cannot take, as in vLLM.
STRUCTURED_OUTPUT_BACKENDS = ("auto", "guidance", "xgrammar")


def structured_outputs_backend(
    structured_outputs_config: dict[str, Any] | None, guided_decoding_backend: str | None
) -> str:
    """The backend serve runs: --structured-outputs-config's, else --guided-decoding-backend's
    name (before any ``:options``), else auto."""
    name = (structured_outputs_config or {}).get("backend") or guided_decoding_backend or "auto"
    return name.split(":", 1)[0]


def _check_nodes(v: dict[str, Any]) -> None:
    """--nnodes splits the tensor x pipeline ranks evenly; node 0 serves the API, the others
    run --headless."""
    nnodes, node_rank = v["nnodes"], v["node_rank"]
    if node_rank >= nnodes:
        raise ConfigError(
            f"--node-rank ({node_rank}) must be < --nnodes ({nnodes}): nodes count from 0",
            "node_rank",
        )
    if v["headless"] and node_rank == 0:
        raise ConfigError(
            "--headless is for the nodes after the first (--node-rank 1 and up, with --nnodes > 1): "
            "node 0 serves the API (multi-node data parallelism is planned, not built yet)",
            "headless",
        )
    if node_rank > 0 and not v["headless"]:
        raise ConfigError(
            f"--node-rank {node_rank} needs --headless: only node 0 serves the API", "headless"
        )
    if nnodes == 1:
        return
    world = v["tensor_parallel_size"] * v["pipeline_parallel_size"]
    if world % nnodes:
        raise ConfigError(
            f"--tensor-parallel-size x --pipeline-parallel-size ({world}) must be divisible by "
            f"--nnodes ({nnodes}): each node runs the same number of ranks",
            "nnodes",
        )
    if v["data_parallel_size"] > 1:
        raise ConfigError(
            f"--data-parallel-size ({v['data_parallel_size']}) must be 1 with --nnodes "
            f"({nnodes}) > 1: multi-node data parallelism is planned, not built yet",
            "data_parallel_size",
        )


def check_rules(values: dict[str, Any]) -> None:
    """Raises ConfigError for the first rule the values break."""
    v = values
    _check_structured_outputs(v["structured_outputs_config"] or {})
    _check_nodes(v)
    _check_async_scheduling(v)
    _require(v, "enable_auto_tool_choice", "tool_call_parser", field="tool_call_parser")
    _check_adapters(v)
    _check_batch_budget(v)
    _require(v, "collect_detailed_traces", "otlp_traces_endpoint")
    _check_local_data_parallel(v)
    _check_api_servers(v)


def _require(v: dict[str, Any], flag: str, needed: str, *, field: str | None = None) -> None:
    """`flag` set needs `needed` set; the error is `field`'s (by default the flag's)."""
    if v[flag] and not v[needed]:
        raise ConfigError(f"{BY_DEST[flag].flag} requires {BY_DEST[needed].flag}", field or flag)


def _check_async_scheduling(v: dict[str, Any]) -> None:
    if v["async_scheduling"] and v["pipeline_parallel_size"] > 1:
        raise ConfigError(
            f"--async-scheduling cannot be combined with --pipeline-parallel-size "
            f"({v['pipeline_parallel_size']}) > 1: the stages already keep one step in flight per "
            "stage, of other requests (as in vLLM, which refuses it too)",
            "async_scheduling",
        )


def _check_adapters(v: dict[str, Any]) -> None:
    """LoRA and prompt adapters."""
    if v["max_cpu_loras"] is not None and v["max_cpu_loras"] < v["max_loras"]:
        raise ConfigError(
            f"--max-cpu-loras ({v['max_cpu_loras']}) must be >= --max-loras ({v['max_loras']})",
            "max_cpu_loras",
        )
    _require(v, "lora_modules", "enable_lora")
    _require(v, "prompt_adapters", "enable_prompt_adapter")


def _check_batch_budget(v: dict[str, Any]) -> None:
    """The scheduler's tokens and prompts per step."""
    batched, model_len = v["max_num_batched_tokens"], v["max_model_len"]
    if (
        v["enable_chunked_prefill"] is False
        and batched is not None
        and model_len is not None
        and batched < model_len
    ):
        raise ConfigError(
            f"--max-num-batched-tokens ({batched}) is smaller than --max-model-len ({model_len}): without "
            "chunked prefill no prompt longer than the batch budget could run; raise "
            "--max-num-batched-tokens or lower --max-model-len",
            "max_num_batched_tokens",
        )
    if batched is not None and v["max_num_seqs"] is not None and batched < v["max_num_seqs"]:
        raise ConfigError(
            f"--max-num-batched-tokens ({batched}) must be >= --max-num-seqs ({v['max_num_seqs']})",
            "max_num_batched_tokens",
        )
    if v["max_long_partial_prefills"] > v["max_num_partial_prefills"]:
        raise ConfigError(
            f"--max-long-partial-prefills ({v['max_long_partial_prefills']}) must be <= "
            f"--max-num-partial-prefills ({v['max_num_partial_prefills']})",
            "max_long_partial_prefills",
        )
    if v["max_num_partial_prefills"] > 1 and v["enable_chunked_prefill"] is False:
        raise ConfigError(
            "--max-num-partial-prefills > 1 requires chunked prefill", "max_num_partial_prefills"
        )


def _check_local_data_parallel(v: dict[str, Any]) -> None:
    local = v["data_parallel_size_local"]
    if local is not None and local > v["data_parallel_size"]:
        raise ConfigError(
            f"--data-parallel-size-local ({local}) must be <= --data-parallel-size ({v['data_parallel_size']})",
            "data_parallel_size_local",
        )


def _check_api_servers(v: dict[str, Any]) -> None:
    if v["api_server_count"] > 1 and v["data_parallel_size"] > 1:
        raise ConfigError(
            f"--api-server-count ({v['api_server_count']}) above 1 cannot be combined with "
            f"--data-parallel-size ({v['data_parallel_size']}) above 1 yet: the API processes "
            "share one engine core",
            "api_server_count",
        )
