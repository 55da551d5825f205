"""ModelRunner: turns a scheduled step into flat tensors, runs the model, samples.

It keeps each running request's state (``request_state.CachedRequestState``) and its row of the
block table (``input_batch.BlockTable``) across steps from what the ``SchedulerOutput`` says
changed. All tokens of the step are concatenated (``[T]`` input ids and positions); each new
token has a slot in the paged cache (``block * block_size + offset``); each request has a row in
the step's block table. Only rows that produce a token (a request whose computed tokens reach its
end) go through the LM head. The shapes are the ones a CUDA graph would capture for decode.

With a KV connector (``runtime/kv_transfer/``) a step starts its loads before the forward, each
attention layer waits for its own and saves its cache (the step's ``AttentionMetadata`` carries
the connector to the layers; only steps run through ``execute_model``), and the step waits for
the saves and reports what the connector finished.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from infernetes.runtime.config import RuntimeConfig
from infernetes.runtime.engine.model_runner_output import ModelRunnerOutput
from infernetes.runtime.engine.scheduler_output import (
    DRAFT_PLACEHOLDER,
    CachedRequestData,
    GrammarBitmask,
    NewRequestData,
    SchedulerOutput,
)
from infernetes.runtime.host_memory import release_free_memory
from infernetes.runtime.kv_transfer.base import KVConnectorOutput, KVConnectorRole
from infernetes.runtime.kv_transfer.registry import create_connector
from infernetes.runtime.lora.manager import LoRAManager
from infernetes.runtime.model_executor import cuda_graph, parallel
from infernetes.runtime.model_executor.compilation import compile_forward
from infernetes.runtime.model_executor.context import (
    AttentionMetadata,
    CrossAttentionBatch,
    set_attention_metadata,
)
from infernetes.runtime.model_executor.cpu_offload import offload_layers
from infernetes.runtime.model_executor.cuda_graph import DecodeGraphs
from infernetes.runtime.model_executor.layers.attention import Attention
from infernetes.runtime.model_executor.loader import build_model
from infernetes.runtime.model_executor.memory_profile import (
    CudaMemoryProbe,
    KVCacheBudget,
    MemoryProbe,
    MemorySnapshot,
    kv_cache_budget,
    memory_snapshot,
    profile_memory,
)
from infernetes.runtime.model_executor.models.interfaces import (
    ModelForward,
    ServableModel,
    SupportsInputsEmbeds,
    SupportsMultiModal,
)
from infernetes.runtime.model_executor.models.utils import IntermediateTensors
from infernetes.runtime.model_executor.sampler import Sampler, prompt_logprobs
from infernetes.runtime.multimodal.inputs import MultiModalFeature
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.runtime.spec_decode.draft_model import DraftModelProposer
from infernetes.runtime.spec_decode.ngram import NgramProposer
from infernetes.runtime.spec_decode.proposer import NoProposer, Proposer
from infernetes.runtime.spec_decode.verify import accepted, sampling_positions
from infernetes.runtime.worker.input_batch import (
    BlockTable,
    StepBuffers,
    image_spans,
    step_inputs,
)
from infernetes.runtime.worker.kv_cache_memory import zeroed
from infernetes.runtime.worker.logits_processor_batch import LogitsProcessorBatch
from infernetes.runtime.worker.mrope import prompt_layout, step_positions
from infernetes.runtime.worker.request_state import CachedRequestState
from infernetes.runtime.worker.weight_offload import HostCopy

logger = logging.getLogger(__name__)

KV_CACHE_DTYPES = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


class ModelRunner:
    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        self.info = info = config.model.info
        self.device = device = config.device.device
        self.block_size = config.cache.block_size
        # Device memory before the weights: what other processes hold is not this engine's
        self._memory_baseline = (
            memory_snapshot(CudaMemoryProbe(device)) if device.type == "cuda" else None
        )
        self.model: ServableModel | None = None
        self.run_model: ModelForward | None = None
        self.lora: LoRAManager | None = None  # with --enable-lora
        self.load_model(config.load.use_tqdm_on_load)
        self.decode_graphs: DecodeGraphs | None = None  # captured by capture_decode_graphs()
        self.kv_cache_dtype = KV_CACHE_DTYPES.get(config.cache.kv_cache_dtype, info.dtype)
        self.calculate_kv_scales = (
            config.cache.calculate_kv_scales and self.kv_cache_dtype in KV_CACHE_DTYPES.values()
        )
        self.sampler = Sampler(config.model.seed)
        self.logits_processors = (
            LogitsProcessorBatch.load(config.model.logits_processors, config, device)
            if config.model.logits_processors
            else None
        )
        self.num_blocks = 0
        self.host_weights: HostCopy | None = None  # sleep level 1's copy (GPU)
        self.requests: dict[str, CachedRequestState] = {}
        self.block_table = BlockTable(-(-info.max_model_len // self.block_size))
        self.proposer: Proposer = self._proposer()  # draft tokens for the next step
        self.step_buffers = StepBuffers(device, persistent=device.type != "cpu")
        self.kv_connector = create_connector(config, KVConnectorRole.WORKER, self.bytes_per_block)

    def _proposer(self) -> Proposer:
        spec = self.config.speculative
        if spec is None:
            return NoProposer()
        if spec.method == "ngram":
            return NgramProposer(spec)
        return DraftModelProposer(self.config, self.block_table, self.model)  # type: ignore[arg-type]  # every servable model is an nn.Module

    @property
    def cache_layers(self) -> list[Attention]:
        """Every attention layer with a paged cache: the target's, then its draft model's."""
        return self.attention_layers + getattr(self.proposer, "attention_layers", [])

    def load_model(self, use_tqdm: bool = False) -> None:
        """Build the model and read its weights (again after ``release_weights``)."""
        config = self.config
        start = time.perf_counter()
        allocated = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        self.model = build_model(
            self.info,
            self.device,
            config.load.load_format,
            use_tqdm,
            config.model.seed or 0,
            config.model.quantization,
            config.load.ignore_patterns,
        )
        # (the engine config leaves this 0 on a CPU, where the weights are in host memory already)
        self.offloaded = offload_layers(self.model, config.load.cpu_offload_bytes, self.device)  # type: ignore[arg-type]  # every servable model is an nn.Module
        self.attention_layers: list[Attention] = []
        for name, module in self.model.named_modules():
            if isinstance(module, Attention):
                module.layer_name = name
                self.attention_layers.append(module)
        if config.lora is not None:  # wraps the linear layers: before compiling the forward
            self.lora = LoRAManager(self.model, config.lora, self.info.dtype, self.device)  # type: ignore[arg-type]  # every servable model is an nn.Module
        if self.offloaded:  # their weights are copied in Python hooks, which compiling would skip
            logger.info("The forward is not compiled with --cpu-offload-gb: it runs eagerly")
            self.run_model = self.model
        else:
            self.run_model = compile_forward(self.model, config.compilation, self.device)
        # The stream's transient tensors (a GGUF file's blocks regrouped, dequantized tiles) are
        # freed into glibc's heap, which keeps them: 270 MB of a Qwen2.5-0.5B Q4_1 file's 351
        # stayed resident after loading until trimmed.
        release_free_memory()
        seconds = time.perf_counter() - start
        if self.device.type == "cuda":
            weights = torch.cuda.memory_allocated(self.device) - allocated
            logger.info("Model loading took %.4f GiB and %.2f seconds", weights / 2**30, seconds)
        else:
            logger.info("Model loading took %.2f seconds", seconds)

    # -- KV cache ------------------------------------------------------------------------------

    @property
    def bytes_per_block(self) -> int:
        element = torch.empty((), dtype=self.kv_cache_dtype).element_size()
        per_token = (
            sum(a.cache_tensors * a.num_kv_heads * a.head_dim for a in self.cache_layers) * element
        )
        return per_token * self.block_size

    def cross_attention_bytes_per_request(self) -> int:
        """What an encoder-decoder model keeps of each running request beside the paged cache:
        every decoder layer's keys and values of the encoder's frames (0 for other models)."""
        measure = getattr(self.model, "cross_attention_bytes", None)
        return 0 if measure is None else int(measure())

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Give every attention layer its ``[num_blocks, block_size, Hkv, D]`` key and value caches.

        Zeroed, not ``torch.empty``: attention reads whole blocks and masks the unused slots, and a
        masked NaN from uninitialised memory would still poison the result (0 * NaN).
        """
        self.num_blocks = num_blocks
        fp8 = self.kv_cache_dtype in KV_CACHE_DTYPES.values()
        for layer in self.cache_layers:
            shape = (num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim)
            layer.k_cache = zeroed(shape, self.kv_cache_dtype, self.device)
            # a latent-attention layer's values are its keys' latent: one tensor serves both
            layer.v_cache = (
                layer.k_cache
                if layer.cache_tensors == 1
                else zeroed(shape, self.kv_cache_dtype, self.device)
            )
            if fp8:  # the checkpoint's scales, else 1.0 (vLLM's fallback) or measured ones
                layer.k_scale = self._scale(layer.checkpoint_k_scale)
                layer.v_scale = self._scale(layer.checkpoint_v_scale)
        unscaled = [a for a in self.cache_layers if a.checkpoint_k_scale is None]
        if fp8 and unscaled and not self.config.cache.calculate_kv_scales:
            logger.warning(
                "--kv-cache-dtype %s: the checkpoint carries no k_scale/v_scale for %d attention "
                "layers, which use scale 1.0 and may lose accuracy (--calculate-kv-scales "
                "measures them from the first batch)",
                self.config.cache.kv_cache_dtype,
                len(unscaled),
            )

    def register_kv_caches(self) -> None:
        """Hand the allocated caches to the KV connector, by layer name."""
        if self.kv_connector is not None:
            self.kv_connector.register_kv_caches(
                {a.layer_name: (a.k_cache, a.v_cache) for a in self.cache_layers}
            )

    def _scale(self, value: float | None) -> torch.Tensor:
        return torch.tensor(value or 1.0, dtype=torch.float32, device=self.device)

    def release_kv_cache(self) -> None:
        self.decode_graphs = None  # they hold the old caches' addresses
        for layer in self.cache_layers:
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
        states, lengths = self._dummy_prefill(max_num_batched_tokens, max_num_seqs)
        blocks = sum(int(self.block_table.num_blocks[r.row]) for r in states)
        model = self.model
        assert model is not None

        @torch.inference_mode()
        def step() -> None:
            # Each stage alone: a later one starts from zeros instead of its predecessor's output.
            hidden, _ = self._forward(
                states, lengths, self._intermediate(sum(lengths), receive=False)
            )
            if not isinstance(hidden, torch.Tensor):
                return  # not the last pipeline stage: no logits here
            rows = torch.arange(max_num_seqs, device=hidden.device) % hidden.shape[0]
            logits = model.compute_logits(hidden[rows])
            # min_p and top_p without top_k keep the most full-vocabulary buffers alive in the
            # sampler; own generators keep the engine's seeded sampling stream untouched
            params = SamplingParams(temperature=1.0, min_p=0.01, top_p=0.9, seed=0)
            requests = [
                CachedRequestState(
                    f"profile-sampler-{i}",
                    [0],
                    1,
                    params,
                    None,
                    -1,
                    0,
                    torch.Generator().manual_seed(i),
                )
                for i in range(max_num_seqs)
            ]
            self.sampler(logits, requests)

        if probe is None:
            probe, baseline = CudaMemoryProbe(self.device), baseline or self._memory_baseline
        try:
            profile = profile_memory(
                probe,
                lambda: self.allocate_kv_cache(blocks),
                step,
                self.release_kv_cache,
                baseline,
            )
        finally:
            for state in states:
                self.block_table.remove(state.row)
        return kv_cache_budget(profile, utilization)

    def _dummy_prefill(
        self, num_tokens: int, max_num_seqs: int
    ) -> tuple[list[CachedRequestState], list[int]]:
        """Prompts of ``num_tokens`` in all, each given its own blocks in the block table (the
        caller removes their rows)."""
        states: list[CachedRequestState] = []
        lengths: list[int] = []
        next_block = 0
        while num_tokens > 0 and len(states) < max_num_seqs:
            length = min(num_tokens, self.info.max_model_len)
            blocks = -(-length // self.block_size)
            block_ids = list(range(next_block, next_block + blocks))
            states.append(
                CachedRequestState(
                    f"profile-{len(states)}",
                    [0] * length,
                    length,
                    None,
                    None,
                    self.block_table.add(block_ids),
                    0,
                )
            )
            next_block += blocks
            lengths.append(length)
            num_tokens -= length
        if getattr(self.model, "is_encoder_decoder", False):  # each with 30 s of silence
            config = self.info.hf_config
            silence = np.zeros((config.num_mel_bins, 2 * config.max_source_positions), np.float32)
            for state, length in zip(states, lengths, strict=True):
                state.mm_features = [
                    MultiModalFeature("audio", 0, length, "profile", {"input_features": silence})
                ]
        return states, lengths

    def offload_weights(self) -> int:
        """Sleep level 1: the weights to host memory (bytes moved). On a CPU they are in host
        memory already and stay where they are."""
        if self.device.type == "cpu" or self.model is None:
            return 0
        self.decode_graphs = None
        self.host_weights = HostCopy(self.model, self.device)  # type: ignore[arg-type]  # every servable model is an nn.Module
        torch.cuda.empty_cache()
        return self.host_weights.bytes

    def restore_weights(self) -> None:
        """Wake from level 1: the weights back where they were, bit for bit; from level 2, read
        from the checkpoint again."""
        if self.model is None:
            self.load_model()
        elif self.host_weights is not None:
            self.host_weights.restore()
        self.host_weights = None

    def release_weights(self) -> None:
        """Drop the weights (sleep level 2); ``load_model`` reads them from disk again."""
        self.model = None
        self.run_model = None
        self.decode_graphs = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def capture_decode_graphs(self) -> None:
        """Capture the decode graphs over the allocated KV cache (after ``allocate_kv_cache``;
        again after waking up). A no-op, with the reason logged, where graphs are off."""
        self.decode_graphs = None
        settings = self.config.decode_graphs
        if settings is None or self.info.is_pooling:
            return
        if parallel.state().pp_size > 1:
            logger.info("CUDA graphs are not captured across pipeline stages; decode runs eagerly")
            return
        if getattr(self.model, "eager_only", False):
            logger.info("CUDA graphs are not captured for this model; decode runs eagerly")
            return
        backend = cuda_graph.select_graph_backend(self.device)  # module lookup: tests swap it
        if backend is None:
            return
        assert self.run_model is not None
        lora = None if self.lora is None else self.lora.batch
        graphs = DecodeGraphs(self.run_model, settings, self.block_size, self.device, backend, lora)
        graphs.capture()
        self.decode_graphs = graphs

    # -- a step --------------------------------------------------------------------------------

    def _update_states(
        self, scheduler_output: SchedulerOutput
    ) -> tuple[list[CachedRequestState], list[int]]:
        """Bring the request states up to this step; the batch's states, in order, and the
        tokens each computes (fewer than scheduled where draft slots stay empty)."""
        for request_id in scheduler_output.finished_req_ids:
            finished = self.requests.pop(request_id, None)
            if finished is not None:
                self.block_table.remove(finished.row)
        batch = []
        num_scheduled = list(scheduler_output.num_scheduled_tokens)
        for i, data in enumerate(scheduler_output.scheduled_reqs):
            if isinstance(data, NewRequestData):
                state = CachedRequestState.from_new(data, self.block_table.add(data.block_ids))
                merge = getattr(self.model, "mrope_merge_size", None)
                if merge and state.mm_features:  # laid out once, from the whole prompt
                    state.mrope_layout = prompt_layout(
                        state.num_prompt_tokens,
                        state.mm_features,
                        merge,
                        getattr(self.model, "mrope_tokens_per_second", None),
                    )
                self.requests[data.request_id] = state
            else:
                state = self._update_cached(data)
                num_scheduled[i] -= len(data.spec_token_ids) - state.num_drafts
            batch.append(state)
        return batch, num_scheduled

    def _update_cached(self, data: CachedRequestData) -> CachedRequestState:
        state = self.requests[data.request_id]
        if data.resumed_from_preemption:
            self.block_table.set(state.row, data.new_block_ids)
            # encoded again as its chunks reach them (the scheduler's encoder budget counts so)
            state.encoder_outputs.clear()
            if data.num_tokens is not None:
                state.drop_discarded_tokens(data.num_tokens)
        elif data.new_block_ids:
            self.block_table.append(state.row, data.new_block_ids)
        if data.new_token_ids:  # a stage before the last learns what the last one sampled
            start = max(data.num_computed_tokens, state.num_prompt_tokens)
            state.token_ids[start : start + len(data.new_token_ids)] = data.new_token_ids
        if data.resumed_from_preemption or not self.config.scheduler.async_scheduling:
            state.num_computed_tokens = data.num_computed_tokens
        # (async: its own count, advanced after each step; the scheduler's counts every draft of
        # a step in flight as kept)
        drafts = data.spec_token_ids
        if drafts and drafts[0] == DRAFT_PLACEHOLDER:  # scheduled before its proposer ran
            drafts = state.next_drafts[: len(drafts)]
        state.next_drafts = []
        if drafts:  # computed after its last token this step, then verified
            state.add_drafts(drafts)
        return state

    def _prepare(
        self,
        batch: Sequence[CachedRequestState],
        num_scheduled: Sequence[int],
        with_connector: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        inputs = step_inputs(batch, num_scheduled, self.block_table, self.block_size)
        if getattr(self.model, "mrope_merge_size", None):  # M-RoPE: [3, T] rope positions
            inputs.positions = step_positions(
                inputs.positions,
                [request.mrope_layout for request in batch],
                [request.num_computed_tokens for request in batch],
                num_scheduled,
            )
        input_ids, positions, slots, cu_seqlens, seq_lens, tables = self.step_buffers.stage(inputs)
        meta = AttentionMetadata(
            slot_mapping=slots,
            block_tables=tables,
            cu_seqlens_q=cu_seqlens,
            seq_lens=seq_lens,
            calculate_kv_scales=self.calculate_kv_scales,
            kv_connector=self.kv_connector if with_connector else None,
        )
        if getattr(self.model, "bidirectional_image_attention", False):
            meta.image_spans = image_spans(batch, num_scheduled)
        if getattr(self.model, "is_encoder_decoder", False):
            meta.cross_attention = self._cross_attention(batch, num_scheduled)
        return input_ids, positions, meta

    def _cross_attention(
        self, batch: Sequence[CachedRequestState], num_scheduled: Sequence[int]
    ) -> CrossAttentionBatch:
        """An encoder-decoder step's cross-attention inputs: each request's audio encoded once,
        at its first step (the step's new ones together), its keys and values kept with the
        request for its later steps (a preemption keeps them too)."""
        pending = [request for request in batch if request.cross_keys_values is None]
        # at most as many clips at once as the memory profile's dummy step encodes
        limits = self.config.scheduler
        at_once = min(
            -(-limits.max_num_batched_tokens // self.info.max_model_len), limits.max_num_seqs
        )
        model: Any = self.model
        for start in range(0, len(pending), at_once):
            group = pending[start : start + at_once]
            features = []
            for request in group:
                [audio] = request.mm_features  # the input processor gives each request one
                features.append(torch.from_numpy(audio.data["input_features"]))
            encoded = model.encode(torch.stack(features).to(self.device))
            for request, keys_values in zip(group, encoded, strict=True):
                request.cross_keys_values = keys_values
        keys_values = [request.cross_keys_values for request in batch]
        assert all(kv is not None for kv in keys_values)  # each encoded above if not before
        return CrossAttentionBatch(list(num_scheduled), keys_values)

    def _intermediate(self, num_tokens: int, receive: bool) -> IntermediateTensors | None:
        """What this pipeline stage starts from: None on the first stage, else the previous
        stage's hidden states (``receive``), or zeros of their shape for a dummy run."""
        if parallel.state().is_first_stage:
            return None
        names = self.model.intermediate_names  # type: ignore[union-attr]
        shape = (num_tokens, self.info.hf_config.get_text_config().hidden_size)
        if receive:
            tensors = parallel.recv_from_previous_stage(
                len(names), shape, self.info.dtype, self.device
            )
        else:
            tensors = [torch.zeros(shape, dtype=self.info.dtype, device=self.device) for _ in names]
        return dict(zip(names, tensors, strict=True))

    def _inputs_embeds(
        self,
        batch: Sequence[CachedRequestState],
        num_scheduled: Sequence[int],
        input_ids: torch.Tensor,
    ) -> torch.Tensor | None:
        """The step's input embeddings when a prompt given as embeddings, or an image's
        placeholders, have rows in it: each such chunk takes its slice of the tensor (an image's
        encoder output, cut where the chunk cuts it), every other row the embedding of its token
        id (tokens sampled after the prompt too). None when every row is a token: the model
        embeds them itself (an encoder-decoder model's audio goes to its cross-attention)."""
        if getattr(self.model, "is_encoder_decoder", False):
            return None
        self._encode_images(batch, num_scheduled)
        chunks: list[tuple[int, torch.Tensor]] = []  # (first row in the step, embeddings)
        row = 0
        for request, num_new in zip(batch, num_scheduled, strict=True):
            first = request.num_computed_tokens
            if request.prompt_embeds is not None and first < request.num_prompt_tokens:
                last = min(first + num_new, request.num_prompt_tokens)
                chunks.append((row, request.prompt_embeds[first:last]))
            for feature in request.mm_features:
                start, end = max(first, feature.offset), min(first + num_new, feature.end)
                if start < end:
                    encoded = request.encoder_outputs[feature.identifier]
                    rows = encoded[start - feature.offset : end - feature.offset]
                    chunks.append((row + start - first, rows))
            ahead = {f.identifier for f in request.mm_features if f.end > first + num_new}
            for identifier in set(request.encoder_outputs) - ahead:  # no later chunk reads it
                del request.encoder_outputs[identifier]
            row += num_new
        if not chunks:
            return None
        model: SupportsInputsEmbeds = self.model  # type: ignore[assignment]  # only such models are sent embeddings
        embeds = model.embed_input_ids(input_ids)
        for row, chunk in chunks:
            # a prompt's embeddings fill a token's; a model's rows may hold more (Qwen3-VL's
            # DeepStack rows after an image token's embedding, zero for other tokens)
            width = chunk.shape[-1]
            embeds[row : row + len(chunk), :width] = chunk.to(embeds.device, embeds.dtype)
        return embeds

    def _encode_images(
        self, batch: Sequence[CachedRequestState], num_scheduled: Sequence[int]
    ) -> None:
        """Run the vision encoder once over the images this step reaches that are not encoded
        yet (all of the step's together, one call per input shape; an image a prompt repeats,
        once)."""
        pending: dict[tuple, list[tuple[CachedRequestState, MultiModalFeature]]] = {}
        for request, num_new in zip(batch, num_scheduled, strict=True):
            first = request.num_computed_tokens
            reached = {
                feature.identifier: feature
                for feature in request.mm_features
                if feature.offset < first + num_new and first < feature.end
            }
            for identifier, feature in reached.items():
                if identifier not in request.encoder_outputs:
                    shapes = tuple((k, v.shape) for k, v in sorted(feature.data.items()))
                    pending.setdefault((feature.modality, shapes), []).append((request, feature))
        model: SupportsMultiModal = self.model  # type: ignore[assignment]  # only such models are sent images
        for (modality, _), items in pending.items():
            stacked = {
                name: torch.stack([torch.from_numpy(f.data[name]) for _, f in items]).to(
                    self.device
                )
                for name in items[0][1].data
            }
            encoded = model.embed_multimodal(modality, stacked)
            for (request, feature), output in zip(items, encoded, strict=True):
                if len(output) != feature.length:
                    raise ValueError(
                        f"the encoder made {len(output)} rows of an image with {feature.length} "
                        "placeholder tokens"
                    )
                request.encoder_outputs[feature.identifier] = output

    @torch.inference_mode()
    def _forward(
        self,
        batch: Sequence[CachedRequestState],
        num_scheduled: Sequence[int],
        intermediate: IntermediateTensors | None = None,
        with_connector: bool = False,
    ) -> tuple[torch.Tensor | IntermediateTensors, AttentionMetadata]:
        input_ids, positions, meta = self._prepare(batch, num_scheduled, with_connector)
        lora_indices = None
        if self.lora is not None:
            self.lora.prepare([r.lora_request for r in batch], num_scheduled)
            lora_indices = self.lora.batch.indices
        inputs_embeds = None
        if intermediate is None:  # the first pipeline stage embeds
            inputs_embeds = self._inputs_embeds(batch, num_scheduled, input_ids)
        hidden = (
            None
            if self.decode_graphs is None or inputs_embeds is not None
            else self.decode_graphs.run(input_ids, positions, meta, lora_indices)
        )
        if hidden is None:  # not a decode batch a graph holds: eager (or compiled) forward
            assert self.run_model is not None
            set_attention_metadata(meta)
            try:
                if inputs_embeds is not None:
                    hidden = self.run_model(input_ids, positions, inputs_embeds=inputs_embeds)  # type: ignore[call-arg]  # models/interfaces.SupportsInputsEmbeds
                elif intermediate is None:
                    hidden = self.run_model(input_ids, positions)
                else:  # a later pipeline stage: the models take its input third
                    hidden = self.run_model(input_ids, positions, intermediate)  # type: ignore[call-arg]
            finally:
                set_attention_metadata(None)
        if meta.calculate_kv_scales:
            self.calculate_kv_scales = False  # measured once, on the first batch
        return hidden, meta

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        connector = self.kv_connector
        if connector is None:
            return self._execute(scheduler_output)
        assert scheduler_output.kv_connector_metadata is not None  # built for every step
        connector.start_load_kv(scheduler_output.kv_connector_metadata)
        output = self._execute(scheduler_output)
        connector.wait_for_save()
        output.kv_connector_output = KVConnectorOutput(
            *connector.get_finished(scheduler_output.finished_req_ids),
            failed_recving=connector.get_failed_recving(),
            transfers=connector.get_kv_connector_stats(),
        )
        return output

    @torch.inference_mode()
    def _execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        batch, num_scheduled = self._update_states(scheduler_output)
        output = ModelRunnerOutput.empty(len(batch))
        if batch:
            self._run_step(batch, num_scheduled, scheduler_output, output)
        for request, num_new in zip(batch, num_scheduled, strict=True):
            request.advance(num_new)
        return output

    def _run_step(
        self,
        batch: Sequence[CachedRequestState],
        num_scheduled: Sequence[int],
        scheduler_output: SchedulerOutput,
        output: ModelRunnerOutput,
    ) -> None:
        """Compute the step, sample and verify, propose the next drafts, into ``output``."""
        assert self.model is not None
        started = time.perf_counter()
        hidden, meta = self._forward(
            batch,
            num_scheduled,
            self._intermediate(sum(num_scheduled), receive=True),
            with_connector=True,
        )
        if scheduler_output.time_forward:  # waits for the device: asked for, it costs overlap
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            output.forward_time = time.perf_counter() - started
        if not isinstance(hidden, torch.Tensor):  # a pipeline stage before the last
            parallel.send_to_next_stage([hidden[name] for name in self.model.intermediate_names])  # type: ignore[attr-defined]
            for request in batch:  # the last stage returns what it kept of them
                request.drop_drafts()
            return
        if self.info.is_pooling:
            output.pooled = list(self.model.pool(hidden, meta.cu_seqlens_q).float().cpu())
            return
        # from the host's own counts: reading cu_seqlens_q back would wait for the forward to finish
        starts = [0, *itertools.accumulate(num_scheduled)]
        sample_rows: list[int] = []
        sampling: list[int] = []  # batch indices of the requests that sample
        # (index, rows, next tokens, k) of the requests that want prompt logprobs
        prompt_rows: list[tuple[int, list[int], list[int], int]] = []
        for i, (request, num_new) in enumerate(zip(batch, num_scheduled, strict=True)):
            end = request.num_computed_tokens + num_new
            if end == request.num_tokens:  # its last token, and each draft, predict one
                sample_rows.extend(range(starts[i + 1] - 1 - request.num_drafts, starts[i + 1]))
                sampling.append(i)
            params = request.sampling_params
            assert params is not None
            if (
                params.prompt_logprobs is not None
                and request.num_computed_tokens < request.num_prompt_tokens
            ):
                first = request.num_computed_tokens
                # positions whose next token is a prompt token
                last = min(end, request.num_prompt_tokens - 1)
                rows = list(range(starts[i], starts[i] + max(last - first, 0)))
                next_tokens = request.token_ids[first + 1 : last + 1]
                prompt_rows.append((i, rows, next_tokens, params.prompt_logprobs))
        if sampling:
            logits = self.model.compute_logits(hidden[sample_rows])
            self._sample(batch, sampling, logits, scheduler_output.grammar_bitmask, output)
        for i, rows, next_tokens, k in prompt_rows:
            logits = self.model.compute_logits(hidden[rows]) if rows else hidden.new_zeros(0)
            output.prompt_logprobs[i] = prompt_logprobs(logits, next_tokens, k) if rows else []
        # after every step, not only those that sample: a draft model computes each prompt chunk
        proposed = self.proposer.propose(batch, num_scheduled, sampling, hidden)
        for i, drafts in zip(sampling, proposed, strict=True):
            output.draft_token_ids[i] = batch[i].next_drafts = drafts

    def _sample(
        self,
        batch: Sequence[CachedRequestState],
        sampling: Sequence[int],
        logits: torch.Tensor,
        grammar: GrammarBitmask | None,
        output: ModelRunnerOutput,
    ) -> None:
        """Sample each row of ``logits`` (a request's position, and one per draft), keep what
        verifies and append it to the request (the next step's input).
        ``grammar`` masks the constrained requests' rows, one mask for each."""
        requests = [batch[i] for i in sampling]
        if self.config.scheduler.async_scheduling:
            for request in requests:  # a preemption may discard this step's draw
                request.keep_generator_state()
        positions = [p for request in requests for p in sampling_positions(request)]
        if grammar is not None:  # the batch index of each of the sampler's rows
            rows = [
                i for i, r in zip(sampling, requests, strict=True) for _ in range(r.num_drafts + 1)
            ]
            grammar = grammar.of_rows(rows)
        samples = iter(self.sampler(logits, positions, grammar, self.logits_processors))
        for i, request in zip(sampling, requests, strict=True):
            drafts = request.drop_drafts()
            output.num_drafts[i] = len(drafts)
            tokens = accepted([next(samples) for _ in range(len(drafts) + 1)], drafts)
            output.sampled[i] = tokens
            request.token_ids.extend(token.token_id for token in tokens)
            if request.error is not None:
                output.errors[request.request_id] = str(request.error)
