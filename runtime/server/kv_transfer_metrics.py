"""The KV offloading metrics of vLLM's OffloadingConnector, for one engine core: bytes, seconds
and sizes of the copies into the host tier (``store``) and back (``load``), under vLLM's flat
names and its older ``transfer_type``-labelled ones (``GPU_to_CPU``, ``CPU_to_GPU``), which
dashboards still read. Made at an engine core's first copy (only a connector that copies
reports any)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from infernetes.runtime.engine.stats import KVTransfer
from prometheus_client import Counter, Histogram

# vLLM's buckets for a copy's size, in bytes
TRANSFER_SIZE_BUCKETS = [1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6]
_FLAT_NAMES = {"GPU_to_CPU": "store", "CPU_to_GPU": "load"}
_MOVED = {
    "store": "stored from GPU to offload storage",
    "load": "loaded from offload storage to GPU",
}
_WAY = {"store": "from GPU to offload storage", "load": "from offload storage to GPU"}


class KVTransferSeries:
    def __init__(
        self, family: Callable[..., Any], engine_labels: list[str], labels: Sequence[str]
    ) -> None:
        by_type = [*engine_labels, "transfer_type"]
        self._total_bytes = family(
            Counter,
            "vllm:kv_offload_total_bytes",
            "Number of bytes offloaded by KV connector",
            by_type,
        )
        self._total_time = family(
            Counter,
            "vllm:kv_offload_total_time",
            "Total time measured by all KV offloading operations",
            by_type,
        )
        self._size = family(
            Histogram,
            "vllm:kv_offload_size",
            "Histogram of KV offload transfer size, in bytes.",
            by_type,
            buckets=TRANSFER_SIZE_BUCKETS,
        )
        self._labels = list(labels)
        self._flat: dict[str, tuple[Any, Any, Any]] = {}
        for transfer_type, kind in _FLAT_NAMES.items():
            self._flat[transfer_type] = (
                family(
                    Counter,
                    f"vllm:kv_offload_{kind}_bytes",
                    f"Total bytes {_MOVED[kind]}.",
                    engine_labels,
                ).labels(*labels),
                family(
                    Counter,
                    f"vllm:kv_offload_{kind}_time",
                    f"Total {kind} time {_WAY[kind]}, in seconds.",
                    engine_labels,
                ).labels(*labels),
                family(
                    Histogram,
                    f"vllm:kv_offload_{kind}_size",
                    f"Histogram of KV offload {kind} operation size, in bytes.",
                    engine_labels,
                    buckets=TRANSFER_SIZE_BUCKETS,
                ).labels(*labels),
            )

    def record(self, transfers: Sequence[KVTransfer]) -> None:
        for transfer in transfers:
            labels = (*self._labels, transfer.transfer_type)
            self._total_bytes.labels(*labels).inc(transfer.num_bytes)
            self._total_time.labels(*labels).inc(transfer.seconds)
            self._size.labels(*labels).observe(transfer.num_bytes)
            flat_bytes, flat_time, flat_size = self._flat[transfer.transfer_type]
            flat_bytes.inc(transfer.num_bytes)
            flat_time.inc(transfer.seconds)
            flat_size.observe(transfer.num_bytes)
