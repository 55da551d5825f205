"""CUDA graphs for decode steps.

A decode step (one new token per sequence) launches the same kernels every time; on a GPU their
launch overhead rivals the work for small batches. So the model forward is captured once per batch
size from ``--cuda-graph-sizes`` (or ``compilation_config.cudagraph_capture_sizes``) on static
input and metadata buffers, and a decode batch is replayed on the smallest captured size that holds
it. Padding rows write no cache slot (slot -1) and attend to nothing (``seq_len`` 0). Prefill and
mixed batches, batches larger than the largest size and sequences longer than
``--max-seq-len-to-capture`` (wider block tables than the static one) run eagerly.

The capture mechanism is a ``GraphBackend``: ``CudaGraphBackend`` records real CUDA graphs;
``CpuKernelBackend`` records the CPU's C kernel calls and replays them from C
(kernels/cpu/replay.py), each size at its first decode step; ``RerunBackend`` "replays" by running
the forward again on the same static buffers, which is how the padding and static-buffer logic is
tested without either.
"""

from __future__ import annotations

import bisect
import functools
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from infernetes.kernels import backend as attention_backends
from infernetes.runtime.model_executor.compilation import CompilationSettings
from infernetes.runtime.model_executor.context import AttentionMetadata, set_attention_metadata
from infernetes.runtime.model_executor.models.interfaces import ModelForward

from infernetes.schema.config import ServeConfig

if TYPE_CHECKING:
    from infernetes.runtime.lora.layers import LoRABatch

logger = logging.getLogger(__name__)


def capture_sizes(
    cuda_graph_sizes: Sequence[int],
    max_num_seqs: int,
    override: Sequence[int] | None = None,
    max_capture_size: int | None = None,
) -> tuple[int, ...]:
    """The batch sizes to capture, as vLLM picks them.

    One value N means ``[1, 2, 4] + multiples of 8 up to N``; several values are used as given;
    ``override`` (``compilation_config.cudagraph_capture_sizes``) wins over both. Sizes above
    ``max_num_seqs`` are dropped, except the smallest one that still holds ``max_num_seqs`` rows
    (so every decode batch has a graph when the pattern does not hit ``max_num_seqs`` exactly).
    """
    given, source = (
        (override, "compilation_config.cudagraph_capture_sizes")
        if override
        else (cuda_graph_sizes, "--cuda-graph-sizes")
    )
    bad = [s for s in given if not isinstance(s, int) or isinstance(s, bool) or s < 1]
    if bad:
        raise ValueError(f"{source} must be positive integers; got {bad[0]!r}")
    if len(given) == 1 and not override:
        n = given[0]
        sizes = [s for s in (1, 2, 4, *range(8, n + 1, 8)) if s <= n]
    else:
        sizes = list(given)
    cap = max_capture_size if max_capture_size else math.inf
    sizes = sorted({s for s in sizes if s <= cap})
    kept = [s for s in sizes if s <= max_num_seqs]
    above = [s for s in sizes if s > max_num_seqs]
    if above and (not kept or kept[-1] < max_num_seqs):
        kept.append(above[0])
    return tuple(kept)


@dataclass(frozen=True)
class DecodeGraphSettings:
    sizes: tuple[int, ...]  # ascending
    max_seq_len: int  # the longest sequence a graph step holds (fixes the block-table width)


def decode_graph_settings(
    config: ServeConfig,
    compilation: CompilationSettings,
    max_num_seqs: int,
    max_model_len: int,
) -> DecodeGraphSettings | None:
    """What to capture per the serve arguments, or None (with the reason logged) when graphs are
    off. The device is not looked at here (``select_graph_backend`` does)."""
    if config.enforce_eager:
        logger.info("CUDA graphs are off (--enforce-eager): every step runs eagerly")
        return None
    if not compilation.use_cudagraph:
        logger.info("CUDA graphs are off (compilation_config): every step runs eagerly")
        return None
    sizes = capture_sizes(
        list(config.cuda_graph_sizes or [512]),
        max_num_seqs,
        compilation.capture_sizes,
        compilation.max_capture_size,
    )
    if not sizes:
        logger.info("CUDA graphs are off: no capture size is left after the limits")
        return None
    return DecodeGraphSettings(
        sizes, min(config.max_seq_len_to_capture or max_model_len, max_model_len)
    )


class GraphBackend(Protocol):
    name: str
    lazy: bool  # each size recorded at its first decode step, not all at start-up
    max_batch: int | None  # the largest batch it replays (None: every captured size)

    def capture(self, run: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        """Record ``run`` (which reads and writes only static buffers); return its replay, which
        returns the output tensor."""
        ...


class CudaGraphBackend:
    """Real CUDA graphs; all sizes share one memory pool (captured largest first, so the smaller
    graphs reuse the larger ones' memory)."""

    name = "cuda"
    lazy = False
    max_batch: int | None = None

    def __init__(self, device: torch.device, warmups: int = 1) -> None:
        self.device = device
        self.warmups = warmups
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, run: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        # Warm up first: Triton compiles its kernels and torch.compile traces on the first call,
        # neither of which may happen inside a capture.
        for _ in range(self.warmups):
            run()
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = run()
        torch.cuda.synchronize(self.device)

        def replay() -> torch.Tensor:
            graph.replay()
            return output

        return replay  # its closure keeps the graph alive


class CpuKernelBackend:
    """The CPU's C kernel calls, recorded at a size's first decode step and replayed from C
    (kernels/cpu/replay.py). A forward that cannot be replayed (it reads tensor values on the host:
    fp8 KV scales, MoE routing, the Triton interpreter) keeps running eagerly on the static
    buffers, with the reason logged once."""

    name = "cpu"
    lazy = True  # recording is one forward: no start-up cost for sizes never used
    # Larger decode batches run eagerly: their step is the kernels' work, not the host's, and a
    # replayed torch op copies its output into the recorded one (bench serve_vs_offline at
    # concurrency 64, bf16 through oneDNN: 0.93x of eager).
    max_batch: int | None = 8

    def capture(self, run: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        from infernetes.kernels.cpu import replay

        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            # gloo's collectives are called past the dispatcher, so a recording would miss them
            _log_refusal("the ranks' all-reduces and sends are not recorded")
            return run
        try:
            return replay.record(run)
        except replay.Refused as refused:
            _log_refusal(str(refused))
            return run


@functools.cache
def _log_refusal(reason: str) -> None:
    logger.info("decode steps run eagerly: the CPU kernel replay is refused (%s)", reason)


class RerunBackend:
    """No device graph: the replay runs the forward again on the static buffers. It exercises
    everything about graph replay but the recording (padding, static metadata, slicing) on any
    device."""

    name = "rerun"
    lazy = False
    max_batch: int | None = None

    def capture(self, run: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        # No warm-up run: the static buffers hold only padding rows at capture time, a batch
        # that never reaches the (torch reference) ops otherwise.
        return run


def select_graph_backend(device: torch.device) -> GraphBackend | None:
    """The backend for a device, or None (reason logged) where decode must run eagerly."""
    if device.type == "cpu":
        from infernetes.kernels.cpu import native

        name = attention_backends.attention_backend(device)
        if not native.enabled() or name != attention_backends.TORCH_SDPA:
            logger.info(
                "CPU decode steps run eagerly (C kernels %s, attention backend %s)",
                "on" if native.enabled() else "off",
                name,
            )
            return None
        return CpuKernelBackend()
    if device.type != "cuda":
        logger.info("CUDA graphs need a CUDA device; decode runs eagerly on %s", device.type)
        return None
    name = attention_backends.attention_backend(device)
    if name != attention_backends.TRITON_ATTN:
        logger.warning(
            "CUDA graphs need the TRITON_ATTN attention backend (%s plans each step on the host); "
            "decode runs eagerly",
            name,
        )
        return None
    return CudaGraphBackend(device)


class DecodeGraphs:
    """Static buffers for the largest batch, one captured forward per size, and the replay."""

    def __init__(
        self,
        forward: ModelForward,
        settings: DecodeGraphSettings,
        block_size: int,
        device: torch.device,
        backend: GraphBackend,
        lora: LoRABatch | None = None,
    ) -> None:
        self.forward = forward
        # With --enable-lora every graph runs the LoRA layers on a static slot buffer (-1 for
        # tokens of the base model), so a step mixing adapters replays as well.
        self.lora = lora
        self.sizes = settings.sizes
        self.backend = backend
        self.max_batch = settings.sizes[-1]
        self.max_blocks = -(-settings.max_seq_len // block_size)
        n = self.max_batch
        with torch.inference_mode():  # like the step's own tensors (torch.compile guards on it)
            self._allocate(n, device)
        self._replays: dict[int, Callable[[], torch.Tensor]] = {}
        self.replays: Counter[int] = Counter()  # per captured size: how often it ran
        self.capture_seconds = 0.0
        self.capture_bytes = 0  # device memory the graphs took (CUDA)

    def _allocate(self, n: int, device: torch.device) -> None:
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((n, self.max_blocks), dtype=torch.int32, device=device)
        self.cu_seqlens_q = torch.arange(n + 1, dtype=torch.int32, device=device)  # one token each
        self.lora_indices = torch.full((n,), -1, dtype=torch.long, device=device)

    def _run_static(self, size: int) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            block_tables=self.block_tables[:size],
            cu_seqlens_q=self.cu_seqlens_q[: size + 1],
            seq_lens=self.seq_lens[:size],
        )
        set_attention_metadata(meta)
        if self.lora is not None:
            self.lora.indices = self.lora_indices[:size]
        try:
            return self.forward(self.input_ids[:size], self.positions[:size])
        finally:
            set_attention_metadata(None)
            if self.lora is not None:
                self.lora.indices = None

    @torch.inference_mode()
    def capture(self) -> None:
        if self.backend.lazy:
            sizes = [s for s in self.sizes if self._replayed(s)]
            logger.info(
                "Decode graphs for %d batch sizes (%s) with the %s backend: each recorded at its "
                "first decode step",
                len(sizes),
                _describe(sizes),
                self.backend.name,
            )
            return
        start = time.perf_counter()
        free_before = _free_device_memory(self.input_ids.device)
        for size in reversed(self.sizes):
            self._replays[size] = self.backend.capture(functools.partial(self._run_static, size))
        self.capture_seconds = time.perf_counter() - start
        self.capture_bytes = free_before - _free_device_memory(self.input_ids.device)
        logger.info(
            "Capturing CUDA graphs for %d batch sizes (%s) with the %s backend took %.2f s and %.2f GiB",
            len(self.sizes),
            _describe(self.sizes),
            self.backend.name,
            self.capture_seconds,
            self.capture_bytes / (1 << 30),
        )

    def _replayed(self, size: int) -> bool:
        return self.backend.max_batch is None or size <= self.backend.max_batch

    def padded_size(self, num_seqs: int) -> int | None:
        i = bisect.bisect_left(self.sizes, num_seqs)
        return self.sizes[i] if i < len(self.sizes) else None

    @torch.inference_mode()
    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        lora_indices: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """The step's hidden states ``[B, hidden]`` by replay, or None when the batch must run
        eagerly (not pure decode, too large, too long, or measuring fp8 scales).
        ``lora_indices`` are the tokens' adapter slots (None: the base model for all)."""
        num_seqs, width = meta.block_tables.shape
        if input_ids.shape[0] != num_seqs or meta.calculate_kv_scales or width > self.max_blocks:
            return None
        size = self.padded_size(num_seqs)
        if size is None or not self._replayed(size):
            return None
        if size not in self._replays and not self.backend.lazy:
            return None
        self.input_ids[:num_seqs].copy_(input_ids)
        self.positions[:num_seqs].copy_(positions)
        self.slot_mapping[:num_seqs].copy_(meta.slot_mapping)
        self.seq_lens[:num_seqs].copy_(meta.seq_lens)
        self.block_tables[:num_seqs, :width].copy_(meta.block_tables)
        if lora_indices is None:
            self.lora_indices[:size].fill_(-1)
        else:
            self.lora_indices[:num_seqs].copy_(lora_indices)
            self.lora_indices[num_seqs:size].fill_(-1)
        if size > num_seqs:  # padding rows: write nowhere, attend to nothing
            self.input_ids[num_seqs:size].zero_()
            self.positions[num_seqs:size].zero_()
            self.slot_mapping[num_seqs:size].fill_(-1)
            self.seq_lens[num_seqs:size].zero_()
        if size not in self._replays:  # a lazy backend: recorded now, on this step's buffers
            self._replays[size] = self.backend.capture(functools.partial(self._run_static, size))
        self.replays[size] += 1
        return self._replays[size]()[:num_seqs]


def _free_device_memory(device: torch.device) -> int:
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0


def _describe(sizes: Sequence[int]) -> str:
    return ", ".join(map(str, sizes)) if len(sizes) <= 8 else f"{sizes[0]} ... {sizes[-1]}"


__all__ = [
    "CpuKernelBackend",
    "CudaGraphBackend",
    "DecodeGraphSettings",
    "DecodeGraphs",
    "GraphBackend",
    "RerunBackend",
    "capture_sizes",
    "decode_graph_settings",
    "select_graph_backend",
]
