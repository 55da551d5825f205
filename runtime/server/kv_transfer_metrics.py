"""The KV connectors' metrics, for one engine core. vLLM's OffloadingConnector's: bytes, seconds
and sizes of the copies into the host tier (``store``) and back (``load``), under vLLM's flat
names and its older ``transfer_type``-labelled ones (``GPU_to_CPU``, ``CPU_to_GPU``), which
dashboards still read. Its NixlConnector's (``NixlSeries``): vllm:nixl_* histograms of each
read's duration, post time, bytes and descriptors, and counters of failed reads and
notifications. Each made at an engine core's first report of its kind."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from infernetes.runtime.engine.stats import NIXL_READ, KVTransfer
from prometheus_client import Counter, Histogram

# vLLM's buckets for a copy's size, in bytes
TRANSFER_SIZE_BUCKETS = [1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6]
_FLAT_NAMES = {"GPU_to_CPU": "store", "CPU_to_GPU": "load"}
_MOVED = {
    "store": "stored from GPU to offload storage",
    "load": "loaded from offload storage to GPU",
}
_WAY = {"store": "from GPU to offload storage", "load": "from offload storage to GPU"}


# vLLM's NixlPromMetrics buckets: seconds (the transfer's start at 5 ms), bytes (2 KiB to 8 GiB,
# every other power of two) and descriptors.
NIXL_SECONDS_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0]
NIXL_BYTES_BUCKETS = [2 ** (10 + i) for i in range(1, 25, 2)]
NIXL_DESCRIPTOR_BUCKETS = [10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000]


class NixlSeries:
    def __init__(
        self, family: Callable[..., Any], engine_labels: list[str], labels: Sequence[str]
    ) -> None:
        def histogram(name: str, help_text: str, buckets: list[float] | list[int]) -> Any:
            return family(Histogram, name, help_text, engine_labels, buckets=buckets).labels(
                *labels
            )

        def counter(name: str, help_text: str) -> Any:
            return family(Counter, name, help_text, engine_labels).labels(*labels)

        self._xfer_time = histogram(
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            NIXL_SECONDS_BUCKETS[1:],
        )
        self._post_time = histogram(
            "vllm:nixl_post_time_seconds",
            "Histogram of transfer post time for NIXL KV Cache transfers.",
            NIXL_SECONDS_BUCKETS,
        )
        self._bytes = histogram(
            "vllm:nixl_bytes_transferred",
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
            NIXL_BYTES_BUCKETS,
        )
        self._descriptors = histogram(
            "vllm:nixl_num_descriptors",
            "Histogram of number of descriptors per NIXL KV Cache transfers.",
            NIXL_DESCRIPTOR_BUCKETS,
        )
        self._failed_transfers = counter(
            "vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers."
        )
        self._failed_notifications = counter(
            "vllm:nixl_num_failed_notifications", "Number of failed NIXL KV Cache notifications."
        )

    def record(self, transfers: Sequence[KVTransfer]) -> None:
        for transfer in transfers:
            if transfer.failed:
                failures = (
                    self._failed_transfers
                    if transfer.transfer_type == NIXL_READ
                    else self._failed_notifications
                )
                failures.inc()
                continue
            self._xfer_time.observe(transfer.seconds)
            self._post_time.observe(transfer.post_seconds)
            self._bytes.observe(transfer.num_bytes)
            self._descriptors.observe(transfer.num_descriptors)


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
