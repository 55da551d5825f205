"""--kv-transfer-config read into a ``KVTransferConfig``: which connector, this engine's role,
the connector's own settings; ``--kv-offloading-size`` turned into the OffloadingConnector's
configuration as vLLM does. Called before serve starts (``runtime/preflight.py``) and when the
engine resolves its configuration."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from infernetes.runtime.config import KVTransferConfig

from infernetes.schema.errors import check_json_keys

_KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
_KV_TRANSFER_KEYS = ("kv_connector", "kv_role", "kv_connector_extra_config", "engine_id")

OFFLOADING_CONNECTOR = "OffloadingConnector"
NIXL_CONNECTOR = "NixlConnector"
# What vLLM's NixlConnector reads of kv_connector_extra_config and is built here.
_NIXL_KEYS = ("backends",)
_NIXL_BACKENDS = ("UCX",)
# What vLLM's OffloadingConnector (its CPU spec) reads of kv_connector_extra_config and is built
# here; its other keys (spec_module_path, store_threshold, ...) are refused as unknown.
_OFFLOADING_KEYS = (
    "cpu_bytes_to_use",
    "num_cpu_blocks",
    "block_size",
    "eviction_policy",
    "spec_name",
)
_OFFLOADING_SPEC = "CPUOffloadingSpec"
_EVICTION_POLICIES = ("lru",)


@dataclass(frozen=True)
class OffloadingSettings:
    """The host tier's size: bytes across all ranks (vLLM's ``cpu_bytes_to_use``) or blocks."""

    cpu_bytes_to_use: int | None = None
    num_cpu_blocks: int | None = None

    def num_blocks(self, rank_block_bytes: int, world_size: int) -> int:
        """Blocks in the tier: every rank keeps its shard of each, so a block takes
        ``rank_block_bytes`` on each of ``world_size`` ranks (vLLM's reckoning)."""
        if self.num_cpu_blocks is not None:
            return self.num_cpu_blocks
        assert self.cpu_bytes_to_use is not None
        return self.cpu_bytes_to_use // max(rank_block_bytes * world_size, 1)


def kv_transfer_config(
    given: dict[str, Any] | None,
    kv_offloading_size: float | None = None,
    kv_offloading_backend: str = "native",
    block_size: int | None = None,
) -> KVTransferConfig | None:
    """--kv-transfer-config's keys checked (the connector's name already was, by the support
    table); other keys of vLLM's (kv_ip, engine_id, ...) serve connectors not built here.
    ``--kv-offloading-size`` (GiB) stands for the OffloadingConnector with that many bytes."""
    if kv_offloading_size is not None:
        given = _offloading_transfer_config(given, kv_offloading_size, kv_offloading_backend)
    if not given:
        return None
    check_json_keys("kv_transfer_config", given, _KV_TRANSFER_KEYS)
    for key in ("kv_connector", "kv_role"):
        if given.get(key) is None:
            raise ValueError(f"kv_transfer_config.{key} is required with --kv-transfer-config")
    if given["kv_role"] not in _KV_ROLES:
        raise ValueError(
            f"kv_transfer_config.kv_role {given['kv_role']!r} is not one of {', '.join(_KV_ROLES)}"
        )
    extra = given.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ValueError("kv_transfer_config.kv_connector_extra_config must be a JSON object")
    if given["kv_connector"] == OFFLOADING_CONNECTOR:
        offloading_settings(extra, block_size)
    if given["kv_connector"] == NIXL_CONNECTOR:
        _check_nixl_settings(extra)
    # vLLM's default: a fresh id per engine, which a producer hands out as remote_engine_id
    engine_id = str(given.get("engine_id") or uuid.uuid4())
    return KVTransferConfig(given["kv_connector"], given["kv_role"], extra, engine_id)


def _check_nixl_settings(extra: dict[str, Any]) -> None:
    field = "kv_transfer_config.kv_connector_extra_config"
    check_json_keys(field, extra, _NIXL_KEYS)
    backends = extra.get("backends", list(_NIXL_BACKENDS))
    if not isinstance(backends, list) or not set(backends) <= set(_NIXL_BACKENDS) or not backends:
        raise ValueError(
            f"{field}.backends {backends!r}: only {list(_NIXL_BACKENDS)} (NIXL's UCX backend, "
            "which moves host memory over TCP or shared memory) is built"
        )


def check_nixl_engine(
    device_type: str, pooling: bool, sleep_mode: bool, pipeline_parallel_size: int
) -> None:
    """What the NixlConnector serves: a CPU engine's cache (host memory, which NIXL registers
    as DRAM), one pipeline stage, a generative model, a cache that stays where it was registered."""
    name = f"--kv-transfer-config's {NIXL_CONNECTOR}"
    if device_type != "cpu":
        raise ValueError(
            f"{name} moves a CPU engine's KV cache (host memory); registering a CUDA cache with "
            "NIXL is not built yet"
        )
    if pooling:
        raise ValueError(f"{name} serves generative models; this is a pooling model")
    if sleep_mode:
        raise ValueError(f"{name} with --enable-sleep-mode is not supported: give one or the other")
    if pipeline_parallel_size > 1:
        raise ValueError(
            f"{name} with --pipeline-parallel-size {pipeline_parallel_size} is not built: "
            "tensor-parallel ranks each move their own shard, pipeline stages do not yet"
        )


def _offloading_transfer_config(
    given: dict[str, Any] | None, size_gib: float, backend: str
) -> dict[str, Any]:
    if given:
        raise ValueError(
            "--kv-offloading-size configures the KV connector itself: give it or "
            "--kv-transfer-config, not both"
        )
    if backend != "native":
        raise ValueError(
            f"--kv-offloading-backend {backend!r}: only 'native' (the OffloadingConnector) is "
            "built; LMCache is not"
        )
    if not size_gib > 0:
        raise ValueError(f"--kv-offloading-size must be a positive number of GiB, not {size_gib}")
    return {
        "kv_connector": OFFLOADING_CONNECTOR,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": int(size_gib * (1 << 30))},
    }


def offloading_settings(extra: dict[str, Any], block_size: int | None) -> OffloadingSettings:
    """The OffloadingConnector's kv_connector_extra_config checked: the tier's size in bytes or
    blocks (one of them), and the choices built here."""
    field = "kv_transfer_config.kv_connector_extra_config"
    check_json_keys(field, extra, _OFFLOADING_KEYS)
    sizes = [key for key in ("cpu_bytes_to_use", "num_cpu_blocks") if extra.get(key) is not None]
    if len(sizes) != 1:
        raise ValueError(
            f"{field}: the OffloadingConnector needs one of cpu_bytes_to_use (bytes of host "
            "memory) or num_cpu_blocks (or --kv-offloading-size in GiB)"
        )
    (key,) = sizes
    value = extra[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{field}.{key} must be a positive integer, not {value!r}")
    given_size = extra.get("block_size")
    if given_size is not None and block_size is not None and given_size != block_size:
        raise ValueError(
            f"{field}.block_size {extra['block_size']!r}: the host tier keeps blocks of the "
            f"engine's --block-size ({block_size}); larger offloaded blocks are not built"
        )
    policy = extra.get("eviction_policy", "lru")
    if policy not in _EVICTION_POLICIES:
        raise ValueError(
            f"{field}.eviction_policy {policy!r}: only {', '.join(_EVICTION_POLICIES)} is built"
        )
    spec = extra.get("spec_name", _OFFLOADING_SPEC)
    if spec != _OFFLOADING_SPEC:
        raise ValueError(f"{field}.spec_name {spec!r}: only {_OFFLOADING_SPEC} is built")
    return OffloadingSettings(**{key: value})
