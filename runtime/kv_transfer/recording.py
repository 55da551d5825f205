"""RecordingConnector: a debug and test connector that records every call and moves no KV.

Selected by ``--kv-transfer-config '{"kv_connector": "RecordingConnector", "kv_role": "kv_both"}'``,
it shows what a real connector would be asked, in order, with which blocks and token counts: it
brings no tokens, keeps no block after its request ends and reports nothing sent or received, so
generation is exactly as without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from infernetes.runtime.kv_transfer.base import (
    KVCaches,
    KVConnectorBase,
    KVConnectorMetadata,
    KVConnectorRole,
)

if TYPE_CHECKING:
    from infernetes.runtime.config import RuntimeConfig
    from infernetes.runtime.engine.request import Request
    from infernetes.runtime.engine.scheduler_output import SchedulerOutput
    from infernetes.runtime.model_executor.context import AttentionMetadata


@dataclass(frozen=True)
class RecordedStep(KVConnectorMetadata):
    """The step, by the scheduler's number, and its requests' scheduled token counts."""

    step_id: int
    num_scheduled_tokens: dict[str, int]


class RecordingConnector(KVConnectorBase):
    """Each call as ``(method name, *what it was given)``, in ``calls``."""

    def __init__(
        self, config: RuntimeConfig, role: KVConnectorRole, rank_block_bytes: int = 0
    ) -> None:
        super().__init__(config, role, rank_block_bytes)
        self.calls: list[tuple[Any, ...]] = []

    # -- scheduler side ------------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        self.calls.append(("get_num_new_matched_tokens", request.request_id, num_computed_tokens))
        return 0, False

    def update_state_after_alloc(
        self, request: Request, block_ids: list[int], num_external_tokens: int
    ) -> None:
        self.calls.append(
            ("update_state_after_alloc", request.request_id, list(block_ids), num_external_tokens)
        )

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> RecordedStep:
        step = RecordedStep(
            scheduler_output.step_id,
            dict(
                zip(
                    scheduler_output.request_ids,
                    scheduler_output.num_scheduled_tokens,
                    strict=True,
                )
            ),
        )
        self.calls.append(("build_connector_meta", step))
        return step

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        self.calls.append(("request_finished", request.request_id, list(block_ids)))
        return False, None

    # -- worker side ---------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: KVCaches) -> None:
        self.calls.append(("register_kv_caches", list(kv_caches)))

    def start_load_kv(self, metadata: KVConnectorMetadata) -> None:
        self.calls.append(("start_load_kv", metadata))

    def wait_for_layer_load(self, layer_name: str) -> None:
        self.calls.append(("wait_for_layer_load", layer_name))

    def save_kv_layer(
        self, layer_name: str, kv_layer: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
    ) -> None:
        self.calls.append(("save_kv_layer", layer_name, int(meta.slot_mapping.numel())))

    def wait_for_save(self) -> None:
        self.calls.append(("wait_for_save",))

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        self.calls.append(("get_finished", set(finished_req_ids)))
        return set(), set()
