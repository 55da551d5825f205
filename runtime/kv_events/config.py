"""--kv-events-config read into a ``KVEventsConfig`` as vLLM's checks it, and the endpoint each
data-parallel rank publishes on. Called before serve starts (``runtime/preflight.py``) and when the
engine resolves its configuration; the publisher's name was checked by the support table."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from infernetes.runtime.config import KVEventsConfig

from infernetes.schema.errors import check_json_keys

_KEYS = tuple(f.name for f in fields(KVEventsConfig))
_COUNTS = ("buffer_steps", "hwm", "max_queue_size")


def kv_events_config(
    given: dict[str, Any] | None, data_parallel_size: int = 1
) -> KVEventsConfig | None:
    """--kv-events-config with vLLM's defaults filled in: an unset ``publisher`` is ``zmq`` when
    events are enabled, else ``null``. Under data parallelism every rank's endpoints must take
    its offset (``rank_endpoint``), so they are checked for the last rank now."""
    if not given:
        return None
    check_json_keys("kv_events_config", given, _KEYS)
    settings = {k: v for k, v in given.items() if v is not None}
    enabled = settings.get("enable_kv_cache_events", False)
    if not isinstance(enabled, bool):
        raise ValueError(
            f"kv_events_config.enable_kv_cache_events must be true or false; got {enabled!r}"
        )
    settings.setdefault("publisher", "zmq" if enabled else "null")
    for key in ("publisher", "endpoint", "replay_endpoint", "topic"):
        if key in settings and not isinstance(settings[key], str):
            raise ValueError(f"kv_events_config.{key} must be a string; got {settings[key]!r}")
    for key in _COUNTS:
        value = settings.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(
                f"kv_events_config.{key} must be an integer of 0 or more; got {value!r}"
            )
    config = KVEventsConfig(**settings)
    if config.publishes and data_parallel_size > 1:
        for endpoint in (config.endpoint, config.replay_endpoint):
            rank_endpoint(endpoint, data_parallel_size - 1)
    return config


def rank_endpoint(endpoint: str | None, data_parallel_rank: int) -> str | None:
    """The endpoint data-parallel rank ``data_parallel_rank`` uses, as vLLM's publisher offsets
    it: a tcp port plus the rank, an inproc name with ``_dp<rank>``; rank 0 keeps it as given.
    Any other transport cannot be told apart per rank (ValueError)."""
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{data_parallel_rank}"
    if "tcp" in endpoint:
        base, _, port = endpoint.rpartition(":")
        if not port.isdigit():
            raise ValueError(
                f"kv_events_config endpoint {endpoint!r} has no port to offset by the data "
                "parallel rank"
            )
        return f"{base}:{int(port) + data_parallel_rank}"
    raise ValueError(
        f"kv_events_config endpoint {endpoint!r}: with --data-parallel-size above 1 an endpoint "
        "must be tcp:// (each rank's port is offset by its rank) or inproc://"
    )
