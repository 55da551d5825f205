"""ModelRunner: turns a scheduled batch into flat tensors, runs the model, samples.

All tokens of the step are concatenated (``[T]`` input ids and positions); each new token has a
slot in the paged cache (``block * block_size + offset``); each request has a row in the block
table. Only rows that produce a token (a request whose computed tokens reach its end) go through
the LM head. The shapes are the ones a CUDA graph would capture for decode.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from infernetes.runtime.engine.request import Request
from infernetes.runtime.engine.scheduler import ScheduledBatch
from infernetes.runtime.model_executor import cuda_graph
from infernetes.runtime.model_executor.compilation import CompilationSettings, compile_forward
from infernetes.runtime.model_executor.context import AttentionMetadata, set_attention_metadata
from infernetes.runtime.model_executor.cuda_graph import DecodeGraphs, DecodeGraphSettings
from infernetes.runtime.model_executor.layers.attention import Attention
from infernetes.runtime.model_executor.loader import ModelInfo, build_model
from infernetes.runtime.model_executor.memory_profile import (
    CudaMemoryProbe,
    KVCacheBudget,
    MemoryProbe,
    MemorySnapshot,
    kv_cache_budget,
    memory_snapshot,
    profile_memory,
)
from infernetes.runtime.model_executor.sampler import (
    SampledToken,
    Sampler,
    TopLogprobs,
    prompt_logprobs,
)
from infernetes.runtime.sampling_params import SamplingParams
from torch import nn

logger = logging.getLogger(__name__)

KV_CACHE_DTYPES = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


@dataclass
class StepOutput:
    """Per scheduled request: its new token (None for a prefill chunk that does not finish),
    prompt logprobs computed in this chunk, and (pooling models) its embedding."""

    sampled: list[SampledToken | None] = field(default_factory=list)
    prompt_logprobs: list[list[TopLogprobs] | None] = field(default_factory=list)
    pooled: list[torch.Tensor | None] = field(default_factory=list)


class ModelRunner:
    def __init__(
        self,
        info: ModelInfo,
        device: torch.device,
        block_size: int,
        kv_cache_dtype: str = "auto",
        load_format: str = "auto",
        ignore_patterns: Sequence[str] | None = None,
        use_tqdm_on_load: bool = True,
        seed: int | None = None,
        calculate_kv_scales: bool = False,
        quantization: str | None = None,
        compilation: CompilationSettings | None = None,
        decode_graphs: DecodeGraphSettings | None = None,
    ) -> None:
        self.info = info
        self.device = device
        self.block_size = block_size
        self._load_format = load_format
        self._ignore_patterns = ignore_patterns
        self._seed = seed or 0
        self._quantization = quantization
        # Device memory before the weights: what other processes hold is not this engine's
        self._memory_baseline = (
            memory_snapshot(CudaMemoryProbe(device)) if device.type == "cuda" else None
        )
        self.model: nn.Module | None = build_model(
            info, device, load_format, use_tqdm_on_load, self._seed, quantization, ignore_patterns
        )
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self._compilation = compilation or CompilationSettings()
        self.run_model = compile_forward(self.model, self._compilation, device)
        self._graph_settings = decode_graphs
        self.decode_graphs: DecodeGraphs | None = None  # captured by capture_decode_graphs()
        if kv_cache_dtype != "auto" and kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of auto, {', '.join(KV_CACHE_DTYPES)}; got {kv_cache_dtype!r}"
            )
        self.kv_cache_dtype = KV_CACHE_DTYPES.get(kv_cache_dtype, info.dtype)
        self.calculate_kv_scales = (
            calculate_kv_scales and self.kv_cache_dtype in KV_CACHE_DTYPES.values()
        )
        self.sampler = Sampler(seed)
        self.num_blocks = 0

    # -- KV cache ------------------------------------------------------------------------------

    @property
    def bytes_per_block(self) -> int:
        element = torch.empty((), dtype=self.kv_cache_dtype).element_size()
        per_token = sum(2 * a.num_kv_heads * a.head_dim for a in self.attention_layers) * element
        return per_token * self.block_size

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Give every attention layer its ``[num_blocks, block_size, Hkv, D]`` key and value caches.

        Zeroed, not ``torch.empty``: attention reads whole blocks and masks the unused slots, and a
        masked NaN from uninitialised memory would still poison the result (0 * NaN).
        """
        self.num_blocks = num_blocks
        fp8 = self.kv_cache_dtype in KV_CACHE_DTYPES.values()
        for layer in self.attention_layers:
            shape = (num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim)
            layer.k_cache = torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
            layer.v_cache = torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
            if fp8:
                layer.k_scale = torch.ones((), dtype=torch.float32, device=self.device)
                layer.v_scale = torch.ones((), dtype=torch.float32, device=self.device)

    def release_kv_cache(self) -> None:
        self.decode_graphs = None  # they hold the old caches' addresses
        for layer in self.attention_layers:
            layer.k_cache = torch.tensor([])
            layer.v_cache = torch.tensor([])
        self.num_blocks = 0
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def profile_kv_cache_budget(
        self,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        utilization: float,
        probe: MemoryProbe | None = None,
        baseline: MemorySnapshot | None = None,
    ) -> KVCacheBudget:
        """The KV-cache budget on a GPU: a dummy step of ``max_num_batched_tokens`` prompt tokens
        (sequences up to ``max_model_len`` each, at most ``max_num_seqs`` of them) and the sampler
        on ``max_num_seqs`` rows, measured by ``probe`` against ``baseline`` (by default the
        snapshot taken before the weights loaded). Raises ValueError when nothing is left."""
        batch = self._dummy_prefill_batch(max_num_batched_tokens, max_num_seqs)
        blocks = sum(len(r.block_ids) for r in batch.requests)

        @torch.inference_mode()
        def step() -> None:
            hidden, _ = self._forward(batch)
            rows = torch.arange(max_num_seqs, device=hidden.device) % hidden.shape[0]
            logits = self.model.compute_logits(hidden[rows])
            # min_p and top_p without top_k keep the most full-vocabulary buffers alive in the
            # sampler; own generators keep the engine's seeded sampling stream untouched
            params = SamplingParams(temperature=1.0, min_p=0.01, top_p=0.9, seed=0)
            requests = []
            for i in range(max_num_seqs):
                request = Request(f"profile-sampler-{i}", [0], params)
                request.generator = torch.Generator().manual_seed(i)
                requests.append(request)
            self.sampler(logits, requests)

        if probe is None:
            probe, baseline = CudaMemoryProbe(self.device), baseline or self._memory_baseline
        profile = profile_memory(
            probe, lambda: self.allocate_kv_cache(blocks), step, self.release_kv_cache, baseline
        )
        return kv_cache_budget(profile, utilization)

    def _dummy_prefill_batch(self, num_tokens: int, max_num_seqs: int) -> ScheduledBatch:
        requests, lengths, next_block = [], [], 0
        while num_tokens > 0 and len(requests) < max_num_seqs:
            length = min(num_tokens, self.info.max_model_len)
            request = Request(f"profile-{len(requests)}", [0] * length, None)
            blocks = -(-length // self.block_size)
            request.block_ids = list(range(next_block, next_block + blocks))
            next_block += blocks
            requests.append(request)
            lengths.append(length)
            num_tokens -= length
        return ScheduledBatch(requests, lengths)

    def release_weights(self) -> None:
        """Drop the weights (sleep level 2); ``reload_weights`` reads them from disk again."""
        self.model = None
        self.run_model = None
        self.decode_graphs = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def reload_weights(self) -> None:
        self.model = build_model(
            self.info,
            self.device,
            self._load_format,
            False,
            self._seed,
            self._quantization,
            self._ignore_patterns,
        )
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.run_model = compile_forward(self.model, self._compilation, self.device)

    def capture_decode_graphs(self) -> None:
        """Capture the decode graphs over the allocated KV cache (after ``allocate_kv_cache``;
        again after waking up). A no-op, with the reason logged, where graphs are off."""
        self.decode_graphs = None
        if self._graph_settings is None or self.info.is_pooling:
            return
        backend = cuda_graph.select_graph_backend(self.device)  # module lookup: tests swap it
        if backend is None:
            return
        graphs = DecodeGraphs(
            self.run_model, self._graph_settings, self.block_size, self.device, backend
        )
        graphs.capture()
        self.decode_graphs = graphs

    # -- a step --------------------------------------------------------------------------------

    def _prepare(
        self, batch: ScheduledBatch
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu_seqlens = [0]
        seq_lens: list[int] = []
        size = self.block_size
        max_blocks = max((len(r.block_ids) for r in batch.requests), default=0)
        tables = np.zeros(
            (len(batch.requests), max_blocks), dtype=np.int32
        )  # rows padded with block 0
        for row, (request, num_new) in enumerate(
            zip(batch.requests, batch.num_new_tokens, strict=True)
        ):
            start = request.num_computed_tokens
            end = start + num_new
            blocks = request.block_ids
            tables[row, : len(blocks)] = blocks
            if num_new == 1:  # a decode row, the common case: no slices or ranges
                input_ids.append(request.token_ids[start])
                positions.append(start)
                slots.append(blocks[start // size] * size + start % size)
            else:
                input_ids.extend(request.token_ids[start:end])
                positions.extend(range(start, end))
                slots.extend(blocks[p // size] * size + p % size for p in range(start, end))
            cu_seqlens.append(cu_seqlens[-1] + num_new)
            seq_lens.append(end)
        device = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            block_tables=torch.from_numpy(tables).to(device),
            cu_seqlens_q=torch.tensor(cu_seqlens, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            calculate_kv_scales=self.calculate_kv_scales,
        )
        return (
            torch.tensor(input_ids, dtype=torch.long, device=device),
            torch.tensor(positions, dtype=torch.long, device=device),
            meta,
        )

    @torch.inference_mode()
    def _forward(self, batch: ScheduledBatch) -> tuple[torch.Tensor, AttentionMetadata]:
        input_ids, positions, meta = self._prepare(batch)
        hidden = (
            None
            if self.decode_graphs is None
            else self.decode_graphs.run(input_ids, positions, meta)
        )
        if hidden is None:  # not a decode batch a graph holds: eager (or compiled) forward
            set_attention_metadata(meta)
            try:
                hidden = self.run_model(input_ids, positions)
            finally:
                set_attention_metadata(None)
        if meta.calculate_kv_scales:
            self.calculate_kv_scales = False  # measured once, on the first batch
        return hidden, meta

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> StepOutput:
        hidden, meta = self._forward(batch)
        if self.info.is_pooling:
            pooled = self.model.pool(hidden, meta.cu_seqlens_q)
            return StepOutput(
                sampled=[None] * len(batch.requests),
                prompt_logprobs=[None] * len(batch.requests),
                pooled=list(pooled.float().cpu()),
            )
        # from the host's own counts: reading cu_seqlens_q back would wait for the forward to finish
        starts = [0, *itertools.accumulate(batch.num_new_tokens)]
        sample_rows: list[int] = []
        sampling: list[Request] = []
        prompt_rows: list[tuple[int, list[int], list[int]]] = []  # (batch index, rows, next tokens)
        for i, (request, num_new) in enumerate(
            zip(batch.requests, batch.num_new_tokens, strict=True)
        ):
            end = request.num_computed_tokens + num_new
            if end == request.num_tokens:
                sample_rows.append(starts[i + 1] - 1)
                sampling.append(request)
            params = request.sampling_params
            if (
                params.prompt_logprobs is not None
                and request.num_computed_tokens < request.num_prompt_tokens
            ):
                first = request.num_computed_tokens
                last = min(
                    end, request.num_prompt_tokens - 1
                )  # positions whose next token is a prompt token
                rows = list(range(starts[i], starts[i] + max(last - first, 0)))
                prompt_rows.append((i, rows, request.token_ids[first + 1 : last + 1]))
        output = StepOutput(
            sampled=[None] * len(batch.requests),
            prompt_logprobs=[None] * len(batch.requests),
            pooled=[None] * len(batch.requests),
        )
        if sampling:
            logits = self.model.compute_logits(hidden[sample_rows])
            tokens = self.sampler(logits, sampling)
            by_request = {id(r): t for r, t in zip(sampling, tokens, strict=True)}
            output.sampled = [by_request.get(id(r)) for r in batch.requests]
        for i, rows, next_tokens in prompt_rows:
            k = batch.requests[i].sampling_params.prompt_logprobs
            logits = self.model.compute_logits(hidden[rows]) if rows else hidden.new_zeros(0)
            output.prompt_logprobs[i] = prompt_logprobs(logits, next_tokens, k) if rows else []
        return output
