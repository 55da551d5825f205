"""--speculative-config read into a ``SpeculativeConfig`` as vLLM's checks it, for the method
built here (n-gram prompt lookup). Called before serve starts (``runtime/preflight.py``) and when
the engine resolves its configuration."""

from __future__ import annotations

from typing import Any

from infernetes.runtime.config import SpeculativeConfig

from infernetes.schema.errors import check_json_keys

_SPECULATIVE_KEYS = (
    "method",
    "model",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
)
# vLLM's default when neither bound is given ("arbitrarily chosen", its comment says)
_PROMPT_LOOKUP_DEFAULT = 5


def speculative_config(
    given: dict[str, Any] | None, async_scheduling: bool = False, pipeline_parallel_size: int = 1
) -> SpeculativeConfig | None:
    """--speculative-config's keys checked as vLLM's SpeculativeConfig checks them, for the
    n-gram method (the support table already refused other methods and draft models). As in
    vLLM, ``model`` "ngram" or "[ngram]" (the deprecated --speculative-model) names the method,
    and a missing lookup bound takes the other's value (both missing: 5)."""
    if not given:
        return None
    check_json_keys("speculative_config", given, _SPECULATIVE_KEYS)
    method = given.get("method") or given.get("model")
    if method not in ("ngram", "[ngram]"):
        raise ValueError(
            'speculative_config.method must be "ngram" (n-gram prompt lookup), the method built '
            f"here; got {method!r}"
        )
    k = _positive_int("num_speculative_tokens", given.get("num_speculative_tokens"))
    low, high = given.get("prompt_lookup_min"), given.get("prompt_lookup_max")
    if low is None and high is None:
        low = high = _PROMPT_LOOKUP_DEFAULT
    low = _positive_int("prompt_lookup_min", high if low is None else low)
    high = _positive_int("prompt_lookup_max", low if high is None else high)
    if low > high:
        raise ValueError(
            f"speculative_config.prompt_lookup_min={low} must be <= prompt_lookup_max={high}"
        )
    if async_scheduling:
        # the scheduler plans a step before the last one's drafts are known (_drafts_to_verify)
        raise ValueError(
            "--speculative-config cannot be combined with --async-scheduling yet: speculative "
            "decoding with --async-scheduling is planned"
        )
    if pipeline_parallel_size > 1:
        # the earlier stages learn a step's sampled tokens from the scheduler, not its drafts
        raise ValueError(
            "--speculative-config cannot be combined with --pipeline-parallel-size above 1 yet: "
            "speculative decoding across pipeline stages is planned"
        )
    return SpeculativeConfig("ngram", k, low, high)


def _positive_int(key: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"speculative_config.{key} must be an integer of 1 or more; got {value!r}")
    return value
