"""The connectors ``--kv-transfer-config``'s ``kv_connector`` may name: only those built here.

The support table lists the same names (``kv_transfer_config.kv_connector`` in
``infernetes/schema/support.py``, which refuses any other at startup; a test keeps the two equal).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infernetes.runtime.kv_transfer.base import KVConnectorBase, KVConnectorRole
from infernetes.runtime.kv_transfer.nixl import NixlConnector
from infernetes.runtime.kv_transfer.offloading import OffloadingConnector
from infernetes.runtime.kv_transfer.recording import RecordingConnector

if TYPE_CHECKING:
    from infernetes.runtime.config import RuntimeConfig

CONNECTORS: dict[str, type[KVConnectorBase]] = {
    "NixlConnector": NixlConnector,
    "OffloadingConnector": OffloadingConnector,
    "RecordingConnector": RecordingConnector,
}


def create_connector(
    config: RuntimeConfig, role: KVConnectorRole, rank_block_bytes: int
) -> KVConnectorBase | None:
    """The configured connector's ``role`` half, or None without ``--kv-transfer-config``."""
    if config.kv_transfer is None:
        return None
    return CONNECTORS[config.kv_transfer.kv_connector](config, role, rank_block_bytes)
