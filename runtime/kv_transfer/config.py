"""--kv-transfer-config read into a ``KVTransferConfig``: which connector, this engine's role,
the connector's own settings. Called before serve starts (``runtime/preflight.py``) and when the
engine resolves its configuration."""

from __future__ import annotations

from typing import Any

from infernetes.runtime.config import KVTransferConfig

from infernetes.schema.errors import check_json_keys

_KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
_KV_TRANSFER_KEYS = ("kv_connector", "kv_role", "kv_connector_extra_config")


def kv_transfer_config(given: dict[str, Any] | None) -> KVTransferConfig | None:
    """--kv-transfer-config's keys checked (the connector's name already was, by the support
    table); other keys of vLLM's (kv_ip, engine_id, ...) serve connectors not built here."""
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
    return KVTransferConfig(given["kv_connector"], given["kv_role"], extra)
