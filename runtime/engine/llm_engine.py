"""LLMEngine: the synchronous engine core. ``add_request`` validates and queues; each ``step``
schedules a batch, runs the model, appends tokens, detokenizes, checks stop conditions, frees the
blocks of finished requests and returns the outputs that changed, plus the step's statistics."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any

import torch
from infernetes.kernels.backend import select_backend
from infernetes.runtime.engine.block_manager import BlockManager
from infernetes.runtime.engine.engine_config import EngineSettings, resolve_settings
from infernetes.runtime.engine.output_builder import OutputBuilder, ParentRequest
from infernetes.runtime.engine.request import Request, RequestStatus
from infernetes.runtime.engine.scheduler import Scheduler
from infernetes.runtime.engine.stats import FinishedRequestStats, IterationStats, SchedulerStats
from infernetes.runtime.model_executor.compilation import parse_compilation_config
from infernetes.runtime.model_executor.cuda_graph import decode_graph_settings
from infernetes.runtime.model_executor.memory_profile import (
    log_kv_cache_budget,
    log_kv_cache_capacity,
)
from infernetes.runtime.model_executor.model_runner import ModelRunner, StepOutput
from infernetes.runtime.outputs import PoolingRequestOutput, RequestOutput
from infernetes.runtime.sampling_params import SamplingParams
from infernetes.runtime.tokenization.detokenizer import IncrementalDetokenizer

logger = logging.getLogger(__name__)

Prompt = str | Sequence[int]


class LLMEngine:
    def __init__(self, config: Any, stat_loggers: Sequence[Any] = ()) -> None:
        self.config = config
        self.settings: EngineSettings = resolve_settings(config)
        select_backend(config.attention_backend)  # the ops of this process follow the flag
        s = self.settings
        self.model_config = s.info.hf_config
        self.max_model_len = s.info.max_model_len
        self.tokenizer = s.tokenizer
        self.is_pooling = s.info.is_pooling
        self.default_sampling_params: dict[str, Any] = dict(s.default_sampling_params)
        compilation = parse_compilation_config(config.compilation_config)
        self.runner = ModelRunner(
            s.info,
            s.device,
            s.block_size,
            kv_cache_dtype=config.kv_cache_dtype,
            load_format=config.load_format,
            ignore_patterns=config.ignore_patterns,
            use_tqdm_on_load=config.use_tqdm_on_load,
            seed=config.seed,
            calculate_kv_scales=config.calculate_kv_scales,
            quantization=config.quantization,
            compilation=compilation,
            decode_graphs=decode_graph_settings(
                config, compilation, s.limits.max_num_seqs, s.info.max_model_len
            ),
        )
        self.num_blocks = self._size_kv_cache()
        self.runner.capture_decode_graphs()
        self.block_manager = BlockManager(
            self.num_blocks, s.block_size, s.enable_prefix_caching, config.prefix_caching_hash_algo
        )
        self.scheduler = Scheduler(s.limits, self.block_manager)
        self.stat_loggers = list(stat_loggers)
        self.parents: dict[str, ParentRequest] = {}
        self.outputs = OutputBuilder(self.tokenizer)
        self._arrivals = itertools.count()
        self._finished_stats: list[FinishedRequestStats] = []
        self.sleep_level = 0
        self.last_scheduler_stats = SchedulerStats()
        self.last_iteration_stats = IterationStats()

    @classmethod
    def from_config(cls, config: Any, stat_loggers: Sequence[Any] = ()) -> LLMEngine:
        return cls(config, stat_loggers)

    # -- KV cache ------------------------------------------------------------------------------

    def _size_kv_cache(self) -> int:
        s, config, runner = self.settings, self.config, self.runner
        if self.is_pooling:
            # Encoders keep no KV cache; blocks only count tokens for the scheduler.
            return s.limits.max_num_seqs * -(-self.max_model_len // s.block_size)
        if config.num_gpu_blocks_override:
            num_blocks = config.num_gpu_blocks_override
        elif config.kv_cache_memory_bytes:
            num_blocks = config.kv_cache_memory_bytes // runner.bytes_per_block
        elif s.device.type == "cpu":
            num_blocks = (s.cpu_kv_cache_gib << 30) // runner.bytes_per_block
        else:
            budget = runner.profile_kv_cache_budget(
                s.limits.max_num_batched_tokens,
                s.limits.max_num_seqs,
                config.gpu_memory_utilization,
            )
            log_kv_cache_budget(budget)
            num_blocks = budget.kv_bytes // runner.bytes_per_block
        capacity = num_blocks * s.block_size
        if capacity < self.max_model_len:
            raise ValueError(
                f"The model's max seq len ({self.max_model_len}) is larger than the maximum number of "
                f"tokens that can be stored in KV cache ({capacity}). Try increasing the KV cache "
                "(--gpu-memory-utilization, --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, "
                "--num-gpu-blocks-override) or decreasing --max-model-len."
            )
        runner.allocate_kv_cache(num_blocks)
        log_kv_cache_capacity(
            "GPU" if s.device.type == "cuda" else "CPU",
            num_blocks,
            s.block_size,
            self.max_model_len,
        )
        return num_blocks

    # -- requests ------------------------------------------------------------------------------

    def get_default_sampling_params(self) -> SamplingParams:
        return SamplingParams(**self.default_sampling_params)

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(
                    "a text prompt needs a tokenizer; the engine runs with --skip-tokenizer-init"
                )
            return prompt, list(self.tokenizer(prompt).input_ids)
        ids = list(prompt)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("prompt_token_ids must be a list of integers")
        return None, ids

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("The prompt cannot be empty.")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(
                f"Token id {bad[0]} is out of vocabulary (the vocabulary size is {vocab})."
            )
        if len(ids) > self.max_model_len:
            raise ValueError(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model length "
                f"of {self.max_model_len}."
            )

    def _check_params(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        cap = self.config.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > cap:
                raise ValueError(
                    f"Requested {name} of {value}, which is greater than the maximum allowed "
                    f"(--max-logprobs): {cap}."
                )
        vocab = self.model_config.vocab_size
        for name, ids in (
            ("logit_bias", list(params.logit_bias or {})),
            ("allowed_token_ids", params.allowed_token_ids or []),
            ("stop_token_ids", params.stop_token_ids or []),
        ):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(
                    f"{name} contains token id {bad[0]}, outside the vocabulary [0, {vocab})."
                )
        params = params.clone()
        if params.max_tokens is None:
            params.max_tokens = self.max_model_len - prompt_len
            if params.max_tokens < 1:
                raise ValueError(
                    f"The prompt (length {prompt_len}) leaves no room to generate within the "
                    f"maximum model length of {self.max_model_len}."
                )
        elif prompt_len + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {prompt_len + params.max_tokens} tokens ({prompt_len} in the prompt, "
                f"{params.max_tokens} in the completion). Please reduce the length of the prompt "
                "or max_tokens."
            )
        if (
            params.stop or params.logprobs is not None or params.detokenize
        ) and self.tokenizer is None:
            params.detokenize = False
            if params.stop:
                raise ValueError(
                    "stop strings need a tokenizer; the engine runs with --skip-tokenizer-init"
                )
        if not params.ignore_eos:
            params.all_stop_token_ids |= self.settings.extra_eos_token_ids
        return params

    def add_request(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> None:
        """Validate and queue a request; raises ValueError naming the problem (nothing is queued)."""
        if request_id in self.parents:
            raise ValueError(f"request id {request_id!r} is already in use")
        if self.settings.limits.policy != "priority" and priority != 0:
            raise ValueError("priority is only allowed with --scheduling-policy priority")
        text, ids = self._tokenize(prompt)
        self._check_prompt(ids)
        if self.is_pooling:
            children = [
                Request(
                    request_id,
                    ids,
                    None,
                    prompt=text,
                    pooling=True,
                    arrival_order=next(self._arrivals),
                    priority=priority,
                )
            ]
            parent = ParentRequest(request_id, text, ids, None, children)
        else:
            if params is None:
                params = self.get_default_sampling_params()
            if not isinstance(params, SamplingParams):
                raise TypeError(
                    f"sampling params must be a SamplingParams, got {type(params).__name__}"
                )
            params = self._check_params(params, len(ids))
            children = []
            for index in range(params.n):
                child_params = params if params.n == 1 else params.clone()
                child_id = request_id if params.n == 1 else f"{index}_{request_id}"
                if index > 0:
                    child_params.prompt_logprobs = None  # reported once, from the first child
                    if params.seed is not None:
                        child_params.seed = params.seed + index
                child = Request(
                    child_id,
                    ids,
                    child_params,
                    prompt=text,
                    eos_token_id=self.settings.eos_token_id,
                    priority=priority,
                    arrival_order=next(self._arrivals),
                    parent_id=request_id,
                    index=index,
                )
                if child_params.seed is not None:
                    child.generator = torch.Generator().manual_seed(child_params.seed)
                if self.tokenizer is not None and child_params.detokenize:
                    child.detokenizer = IncrementalDetokenizer(
                        self.tokenizer,
                        ids,
                        child_params.stop,
                        child_params.include_stop_str_in_output,
                        child_params.skip_special_tokens,
                        child_params.spaces_between_special_tokens,
                    )
                if child_params.logprobs is not None:
                    child.logprobs = []
                if child_params.prompt_logprobs is not None:
                    child.prompt_logprobs = [None]
                children.append(child)
            parent = ParentRequest(request_id, text, ids, params, children)
        if arrival_time is not None:
            for child in children:
                child.times.arrival_wall = arrival_time
        self.parents[request_id] = parent
        for child in children:
            self.scheduler.add_request(child)

    def abort_request(
        self, request_ids: str | Sequence[str]
    ) -> list[RequestOutput | PoolingRequestOutput]:
        """Abort requests at any point; their blocks are freed now. Returns their final outputs."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        outputs = []
        for request_id in request_ids:
            parent = self.parents.pop(request_id, None)
            if parent is None:
                continue
            for child in parent.children:
                if not child.is_finished:
                    self.scheduler.finish_request(child, RequestStatus.FINISHED_ABORTED)
                    self._finished_stats.append(self._finished_request_stats(child))
            outputs.append(self.outputs.build(parent, force_final=True))
        if self._finished_stats:
            # Report now: the engine may go idle, and the gauges must show the freed blocks.
            iteration = IterationStats(finished_requests=self._finished_stats)
            self._finished_stats = []
            self._record_stats(iteration)
        return [o for o in outputs if o is not None]

    def has_unfinished_requests(self) -> bool:
        return bool(self.parents)

    def get_num_unfinished_requests(self) -> int:
        return len(self.parents)

    # -- a step --------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput | PoolingRequestOutput]:
        if self.sleep_level:
            return []
        batch = self.scheduler.schedule()
        iteration = IterationStats()
        iteration.num_preempted_reqs = len(batch.preempted)
        touched: dict[str, ParentRequest] = {}
        if batch:
            result = self.runner.execute(batch)
            self.scheduler.update_after_step(batch)
            self._process(batch, result, iteration, touched)
        outputs = []
        for parent in touched.values():
            output = self.outputs.build(parent)
            if output is not None:
                outputs.append(output)
            if parent.finished:
                self.parents.pop(parent.request_id, None)
        iteration.finished_requests, self._finished_stats = self._finished_stats, []
        self._record_stats(iteration)
        return outputs

    def _process(
        self,
        batch,
        result: StepOutput,
        iteration: IterationStats,
        touched: dict[str, ParentRequest],
    ) -> None:
        now = time.monotonic()
        for i, request in enumerate(batch.requests):
            if request.status != RequestStatus.RUNNING:
                continue
            parent = self.parents.get(request.parent_id)
            chunk_logprobs = result.prompt_logprobs[i]
            if chunk_logprobs is not None and request.prompt_logprobs is not None:
                request.prompt_logprobs.extend(self.outputs.logprob_dict(t) for t in chunk_logprobs)
            if request.pooling:
                if result.pooled[i] is not None:
                    request.pooled = result.pooled[i]
                    request.times.first_token = request.times.last_token = now
                    iteration.num_prompt_tokens += request.num_prompt_tokens
                    iteration.time_to_first_tokens_iter.append(now - request.times.arrival)
                    self.scheduler.finish_request(request, RequestStatus.FINISHED_STOPPED)
                    self._finished_stats.append(self._finished_request_stats(request))
                    touched[parent.request_id] = parent
                continue
            sampled = result.sampled[i]
            if sampled is None:
                continue  # a prefill chunk that does not reach the end of the prompt
            self._append_token(request, sampled, now, iteration)
            touched[parent.request_id] = parent

    def _append_token(
        self, request: Request, sampled, now: float, iteration: IterationStats
    ) -> None:
        params = request.sampling_params
        request.append_token(sampled.token_id)
        iteration.num_generation_tokens += 1
        times = request.times
        if times.first_token is None:
            times.first_token = now
            iteration.num_prompt_tokens += request.num_prompt_tokens
            iteration.time_to_first_tokens_iter.append(now - times.arrival)
            if request.index == 0:
                iteration.n_params_iter.append(params.n)
        else:
            iteration.inter_token_latencies_iter.append(now - times.last_token)
        times.last_token = now
        if sampled.logprobs is not None:
            request.cumulative_logprob += sampled.logprobs.logprob
            request.logprobs.append(self.outputs.logprob_dict(sampled.logprobs))
        if request.error is not None:
            # Its logits processor raised: end this request alone; the batch goes on.
            request.stop_reason = f"error: {request.error}"
            self.scheduler.finish_request(request, RequestStatus.FINISHED_ABORTED)
            self._finished_stats.append(self._finished_request_stats(request))
            return
        status, stop_reason = self._check_stop(request, sampled.token_id)
        stopped_by_token = status == RequestStatus.FINISHED_STOPPED
        if request.detokenizer is not None and not (
            stopped_by_token and not params.include_stop_str_in_output
        ):
            new_text = request.detokenizer.add_token(sampled.token_id)
            if request.num_output_tokens > params.min_tokens:
                stop = request.detokenizer.find_stop(len(new_text))
                if stop is not None:
                    status, stop_reason = RequestStatus.FINISHED_STOPPED, stop
        if status is not None:
            request.stop_reason = stop_reason
            self.scheduler.finish_request(request, status)
            self._finished_stats.append(self._finished_request_stats(request))

    def _check_stop(self, request: Request, token_id: int) -> tuple[RequestStatus | None, Any]:
        params = request.sampling_params
        if (
            request.num_output_tokens >= params.max_tokens
            or request.num_tokens >= self.max_model_len
        ):
            return RequestStatus.FINISHED_LENGTH, None
        if request.num_output_tokens < params.min_tokens:
            return None, None
        if not params.ignore_eos and token_id == request.eos_token_id:
            return RequestStatus.FINISHED_STOPPED, None
        if token_id in params.all_stop_token_ids:
            reason = token_id if token_id in (params.stop_token_ids or ()) else None
            return RequestStatus.FINISHED_STOPPED, reason
        return None, None

    # -- stats ---------------------------------------------------------------------------------

    def _finished_request_stats(self, request: Request) -> FinishedRequestStats:
        t = request.times
        end = t.finished or time.monotonic()
        scheduled = t.scheduled or end
        first = t.first_token or end
        last = t.last_token or end
        params = request.sampling_params
        num_out = request.num_output_tokens
        return FinishedRequestStats(
            request_id=request.request_id,
            finish_reason=request.status.finish_reason or "abort",
            e2e_latency=end - t.arrival,
            num_prompt_tokens=request.num_prompt_tokens,
            num_generation_tokens=num_out,
            max_tokens_param=params.max_tokens if params else None,
            queued_time=scheduled - (t.queued or t.arrival),
            prefill_time=first - scheduled,
            inference_time=last - scheduled,
            decode_time=last - first,
            mean_time_per_output_token=(last - first) / (num_out - 1) if num_out > 1 else 0.0,
            n_param=params.n if params else 1,
            num_cached_tokens=max(request.num_cached_tokens, 0),
        )

    def _record_stats(self, iteration: IterationStats) -> None:
        scheduler = self.scheduler
        stats = SchedulerStats(
            num_running_reqs=scheduler.num_running,
            num_waiting_reqs=scheduler.num_waiting,
            kv_cache_usage=0.0 if self.is_pooling else self.block_manager.usage,
            prefix_cache_stats=scheduler.prefix_cache_stats.take(),
            num_preemptions=scheduler.num_preemptions_step,
            num_kv_cache_blocks=self.num_blocks,
            block_size=self.settings.block_size,
        )
        self.last_scheduler_stats, self.last_iteration_stats = stats, iteration
        for stat_logger in self.stat_loggers:
            try:
                stat_logger.record(stats, iteration)
            except Exception:  # a broken logger must not stop generation
                logger.exception("stat logger %r failed", stat_logger)

    # -- maintenance ---------------------------------------------------------------------------

    def reset_prefix_cache(self) -> bool:
        done = self.block_manager.reset_prefix_cache()
        if done:
            self.scheduler.prefix_cache_stats.reset = True
        return done

    def sleep(self, level: int = 1) -> None:
        """Free the KV cache (level 1) and the weights too (level 2); running requests are
        preempted and recompute after ``wake_up``."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if self.sleep_level:
            return
        self.scheduler.preempt_all()
        self.block_manager.reset_prefix_cache()
        if not self.is_pooling:
            self.runner.release_kv_cache()
        if level == 2:
            self.runner.release_weights()
        self.sleep_level = level

    def wake_up(self) -> None:
        if not self.sleep_level:
            return
        if self.sleep_level == 2:
            self.runner.reload_weights()
        if not self.is_pooling:
            self.runner.allocate_kv_cache(self.num_blocks)
            self.runner.capture_decode_graphs()  # the old graphs went with the old cache
        self.sleep_level = 0

    @property
    def is_sleeping(self) -> bool:
        return self.sleep_level > 0
