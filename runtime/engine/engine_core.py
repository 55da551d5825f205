"""EngineCore: the scheduler and the executor, stepping together.

``step() = scheduler.schedule() -> executor.execute_model() -> scheduler.update_from_output()``,
then the output processor turns the requests that changed into RequestOutputs. Requests come in
prepared by the client's input processor (tokenized and checked, off this loop); the core checks
what needs its state (request ids, adapters) and fans ``n`` out. Unlike vLLM V1, whose
client detokenizes, this core detokenizes itself: a stop string then ends its request in the
step that produced it, with no round trip. Structured output is compiled here as well, once per
request, and a step carries only its constrained rows' bitmask (``structured_output.py``). It is
synchronous and never touches asyncio; it runs under the offline ``LLMEngine`` or under
``core_loop.CoreLoop`` (a thread or its own process).

Under pipeline parallelism a step is sent without waiting for it, up to one per stage (vLLM V1's
batch queue): while the last stage computes one step, the first already computes the next, made
of other requests; a step's output is taken when the queue is full or nothing else can be
scheduled.

Under ``--async-scheduling`` the same queue holds two steps, of the same requests: the next step
is scheduled (and the last one's tokens turned into outputs) while the workers run this one; the
scheduler counts each token not seen yet as a placeholder and the worker feeds it from its own
state (``scheduler.py``).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from infernetes.runtime.config import RuntimeConfig
from infernetes.runtime.engine.block_manager import BlockManager
from infernetes.runtime.engine.engine_config import resolve_config
from infernetes.runtime.engine.input_processor import InputSettings
from infernetes.runtime.engine.messages import EngineCoreRequest, EngineInfo, ModelFacts
from infernetes.runtime.engine.model_runner_output import ModelRunnerOutput
from infernetes.runtime.engine.output_processor import OutputProcessor
from infernetes.runtime.engine.request import RequestStatus
from infernetes.runtime.engine.scheduler import Scheduler
from infernetes.runtime.engine.scheduler_output import SchedulerOutput
from infernetes.runtime.engine.stats import IterationStats, StatLogger
from infernetes.runtime.engine.structured_output import StructuredOutputManager
from infernetes.runtime.executor.abstract import PendingOutput, select_executor
from infernetes.runtime.kv_events.publisher import create_publisher
from infernetes.runtime.kv_transfer.base import KVConnectorRole
from infernetes.runtime.kv_transfer.registry import create_connector
from infernetes.runtime.lora.adapter import LoRAAdapterError
from infernetes.runtime.lora.request import LoRARequest
from infernetes.runtime.model_executor.loader import model_class_of
from infernetes.runtime.model_executor.memory_profile import (
    GiB,
    kv_cache_num_blocks,
    log_kv_cache_capacity,
)
from infernetes.runtime.model_executor.models.interfaces import (
    is_encoder_decoder,
    supports_inputs_embeds,
    supports_multimodal,
)
from infernetes.runtime.model_executor.sliding_window import window_of_every_layer
from infernetes.runtime.multimodal.audio import AudioProcessor
from infernetes.runtime.multimodal.audio_language import AudioLanguageProcessor
from infernetes.runtime.multimodal.processor import MultiModalProcessor
from infernetes.runtime.outputs import PoolingRequestOutput, RequestOutput
from infernetes.runtime.spec_decode.config import lookahead_tokens
from infernetes.runtime.worker.worker import SLEEP_TAGS, Worker

from infernetes.schema.config import ServeConfig
from infernetes.schema.rules import structured_outputs_backend

logger = logging.getLogger(__name__)

EngineOutput = RequestOutput | PoolingRequestOutput


class EngineCore:
    def __init__(
        self,
        serve_config: ServeConfig,
        stat_loggers: Sequence[StatLogger] = (),
        data_parallel_rank: int = 0,
    ) -> None:
        self.config: RuntimeConfig
        self.config, self.tokenizer = resolve_config(
            serve_config, data_parallel_rank=data_parallel_rank
        )
        model = self.config.model
        self.executor = select_executor(self.config)(self.config)
        start = time.perf_counter()
        try:
            self.num_blocks = self._initialize_kv_cache()
            # --kv-events-config: what the prefix cache gains and loses, published each step
            self.kv_event_publisher = create_publisher(
                self.config.kv_events, self.config.parallel.data_parallel_rank
            )
        except BaseException:
            self.executor.shutdown()
            raise
        logger.info(
            "init engine (profile, create kv cache, warmup model) took %.2f seconds",
            time.perf_counter() - start,
        )
        cache, spec = self.config.cache, self.config.speculative
        self.block_manager = BlockManager(
            self.num_blocks,
            cache.block_size,
            cache.enable_prefix_caching,
            cache.prefix_caching_hash_algo,
            window_of_every_layer(model.info.hf_config),
            event_sink=self.kv_event_publisher,
            hash_without_caching=self.config.kv_transfer is not None,
        )
        self.scheduler = Scheduler(
            self.config.scheduler,
            self.block_manager,
            pipelined=self.config.parallel.pipeline_parallel_size > 1,
            connector=create_connector(
                self.config, KVConnectorRole.SCHEDULER, self.executor.kv_cache_block_bytes()
            ),
            whole_images=getattr(
                model_class_of(model.info), "bidirectional_image_attention", False
            ),
            num_lookahead_tokens=lookahead_tokens(self.config.speculative),
            num_spec_tokens=spec.num_speculative_tokens if spec else 0,
            spec_disable_batch_size=spec.disable_by_batch_size if spec else None,
        )
        # Steps sent and not yet taken back (pipeline parallelism, async scheduling), oldest first.
        self.batch_queue: deque[tuple[SchedulerOutput, PendingOutput]] = deque()
        # Outputs of steps taken back out of turn (before sleeping), given with the next step's.
        self.held_outputs: list[EngineOutput] = []
        structured = serve_config.structured_outputs_config or {}
        self.structured_output = StructuredOutputManager(
            self.tokenizer,
            model.vocab_size,
            structured_outputs_backend(structured, serve_config.guided_decoding_backend),
            fallback=not structured.get(
                "disable_fallback", serve_config.guided_decoding_disable_fallback
            ),
        )
        self._arrivals = itertools.count()  # the order requests were admitted in
        self.output_processor = OutputProcessor(self.tokenizer)
        self.stat_loggers = list(stat_loggers)
        detailed = set(serve_config.collect_detailed_traces or ())
        self.time_forward = bool(detailed & {"model", "all"})
        self.time_execute = bool(detailed & {"worker", "all"})
        self.sleep_level = 0
        self.sleep_mode = bool(serve_config.enable_sleep_mode)
        self.asleep: set[str] = set()  # the SLEEP_TAGS still asleep
        self.loras: dict[int, LoRARequest] = {}  # adapters the workers have read and checked

    def info(self) -> EngineInfo:
        model = self.config.model
        return EngineInfo(
            tokenizer=self.tokenizer,
            model_config=ModelFacts.of(model.info.hf_config),
            device=self.config.device.device.type,
            inputs=InputSettings.of(
                self.config, supports_inputs_embeds(model_class_of(model.info))
            ),
            mm_processor=self._multimodal_processor(),
        )

    def _multimodal_processor(
        self,
    ) -> MultiModalProcessor | AudioProcessor | AudioLanguageProcessor | None:
        """A vision-language model's processor, for the API side (None for a text model, or
        with --skip-tokenizer-init: its processor tokenizes)."""
        model = self.config.model
        cls = model_class_of(model.info)
        if self.tokenizer is not None and is_encoder_decoder(cls):
            return AudioProcessor.load(
                model.info.path,
                self.tokenizer,
                dict(model.limit_mm_per_prompt),
                model.mm_processor_kwargs,
            )
        if self.tokenizer is None or not supports_multimodal(cls):
            return None
        if "audio" in getattr(cls, "modalities", ()):  # an audio-language model (Qwen2-Audio)
            return AudioLanguageProcessor.load(
                model.info.path, dict(model.limit_mm_per_prompt), model.mm_processor_kwargs
            )
        return MultiModalProcessor.load(
            model.info.path,
            cls.image_input_shape(model.info.hf_config),  # type: ignore[attr-defined]  # models/interfaces.SupportsMultiModal
            dict(model.limit_mm_per_prompt),
            model.mm_processor_kwargs,
            int(model.mm_processor_cache_gb * GiB),
            processor_class=cls.processor_class(model.info.hf_config),  # type: ignore[attr-defined]  # models/interfaces.SupportsMultiModal
            one_item_per_image=getattr(cls, "one_item_per_image", False),
        )

    # -- KV cache ------------------------------------------------------------------------------

    def _initialize_kv_cache(self) -> int:
        config, cache = self.config, self.config.cache
        max_model_len = config.model.max_model_len
        if config.model.is_pooling:
            # Encoders keep no KV cache; blocks only count tokens for the scheduler.
            return config.scheduler.max_num_seqs * -(-max_model_len // cache.block_size)
        available = 0
        if not cache.num_gpu_blocks_override:  # the override needs no profiling
            available = self.executor.determine_available_memory()
        num_blocks = kv_cache_num_blocks(
            available,
            self.executor.kv_cache_block_bytes(),
            cache.block_size,
            max_model_len,
            cache.num_gpu_blocks_override,
        )
        self.executor.initialize_cache(num_blocks)
        device = "GPU" if config.device.device.type == "cuda" else "CPU"
        log_kv_cache_capacity(device, num_blocks, cache.block_size, max_model_len)
        return num_blocks

    # -- requests ------------------------------------------------------------------------------

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a request the input processor prepared; raises ValueError naming the problem
        (nothing is queued)."""
        if request.request_id in self.output_processor.parents:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        lora_request = request.lora_request
        if lora_request is not None and lora_request.lora_int_id not in self.loras:
            self.add_lora(lora_request)
        params = request.params
        constraint = None if params is None else params.structured_outputs
        # compiled once per request (a bad one is the error); each sequence advances a copy
        grammar = None if constraint is None else self.structured_output.compile(constraint)
        eos_token_id = self.config.model.eos_token_id
        parent = self.output_processor.add(request, eos_token_id, next(self._arrivals))
        for child in parent.children:
            if grammar is not None:
                child.grammar = grammar if child is parent.children[0] else grammar.copy()
            self.scheduler.add_request(child)

    def abort_requests(self, request_ids: str | Sequence[str]) -> list[EngineOutput]:
        """Abort requests at any point; their blocks are freed now. Returns their final outputs."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        outputs = []
        for request_id in request_ids:
            parent = self.output_processor.pop(request_id)
            if parent is None:
                continue
            for child in parent.children:
                self.scheduler.finish_request(child, RequestStatus.FINISHED_ABORTED)
            output = self.output_processor.build(parent, force_final=True)
            if output is not None:
                outputs.append(output)
        finished = self.scheduler.take_finished_stats()
        if finished:
            # Report now: the engine may go idle, and the gauges must show the freed blocks.
            self._record_stats(IterationStats(finished_requests=finished))
        return outputs

    @property
    def only_holds_sent_blocks(self) -> bool:
        """Every request ended; some keep their blocks for another engine to pull (a
        disaggregated prefill's): steps only let the workers report the pulls."""
        scheduler = self.scheduler
        return (
            bool(scheduler.sending)
            and not scheduler.has_unfinished()
            and not self.output_processor.has_unfinished()
            and not self.held_outputs
            and not self.batch_queue
        )

    def has_unfinished_requests(self) -> bool:
        # A step still in flight is taken back even when all its requests have ended since.
        return (
            self.output_processor.has_unfinished()
            or bool(self.held_outputs)
            or bool(self.batch_queue)
            or self.scheduler.awaits_kv_transfer  # steps let the workers report the transfers
        )

    # -- a step --------------------------------------------------------------------------------

    def step(self) -> list[EngineOutput]:
        outputs = self._step()
        self._publish_kv_events()  # what the step recorded after its scheduling (connectors')
        return outputs

    def _step(self) -> list[EngineOutput]:
        if self.sleep_level:
            return []
        held, self.held_outputs = self.held_outputs, []
        if self.executor.max_concurrent_batches > 1:
            return held + self._step_with_batch_queue()
        scheduler_output = self._schedule()
        if not self._has_work(scheduler_output):
            self._record_idle_step()
            return held
        started = time.perf_counter()
        model_output = self.executor.execute_model(scheduler_output)
        self._charge_step_times(scheduler_output, model_output, time.perf_counter() - started)
        return held + self._finish_step(scheduler_output, model_output)

    def _step_with_batch_queue(self) -> list[EngineOutput]:
        queue = self.batch_queue
        scheduled = False
        if len(queue) < self.executor.max_concurrent_batches:
            scheduler_output = self._schedule()
            if self._has_work(scheduler_output):
                scheduler_output.submitted = time.perf_counter()
                queue.append((scheduler_output, self.executor.submit_model(scheduler_output)))
                scheduled = True
        if not queue:
            self._record_idle_step()
            return []
        if scheduled and len(queue) < self.executor.max_concurrent_batches:
            return []  # fill the pipeline before waiting on it
        scheduler_output, pending = queue.popleft()
        model_output = pending.result()
        seconds = time.perf_counter() - scheduler_output.submitted  # includes the wait in line
        self._charge_step_times(scheduler_output, model_output, seconds)
        return self._finish_step(scheduler_output, model_output)

    def _has_work(self, scheduler_output: SchedulerOutput) -> bool:
        """Whether the step goes to the workers: tokens to compute, or transfers to report."""
        return bool(scheduler_output) or self.scheduler.awaits_kv_transfer

    def _schedule(self) -> SchedulerOutput:
        """The scheduler's next step, with the masks of its structured-output rows."""
        scheduler_output = self.scheduler.schedule()
        # The blocks this step caches are published now, before the forward that fills them,
        # as vLLM's scheduler does: a router learns of a prompt's prefix one prefill sooner.
        self._publish_kv_events()
        scheduler_output.time_forward = self.time_forward
        if scheduler_output:
            scheduler_output.grammar_bitmask = self.structured_output.grammar_bitmask(
                scheduler_output, self.scheduler.requests
            )
        return scheduler_output

    def _charge_step_times(
        self, scheduler_output: SchedulerOutput, model_output: ModelRunnerOutput, seconds: float
    ) -> None:
        """Each request of the step is charged the step's executor and forward seconds (a
        request's trace sums its steps'; --collect-detailed-traces)."""
        if not (self.time_execute or self.time_forward):
            return
        requests = self.scheduler.requests
        for request_id in scheduler_output.request_ids:
            request = requests.get(request_id)
            if request is not None:
                request.times.model_execute += seconds
                request.times.model_forward += model_output.forward_time

    def _finish_step(
        self, scheduler_output: SchedulerOutput, model_output: ModelRunnerOutput
    ) -> list[EngineOutput]:
        updated, iteration = self.scheduler.update_from_output(scheduler_output, model_output)
        if model_output.kv_connector_output is not None:
            self.scheduler.finish_kv_transfers(model_output.kv_connector_output)
        outputs = self.output_processor.process(updated)
        self._record_stats(iteration)
        return outputs

    def _record_idle_step(self) -> None:
        self._record_stats(IterationStats(finished_requests=self.scheduler.take_finished_stats()))

    def _record_stats(self, iteration: IterationStats) -> None:
        usage = 0.0 if self.config.model.is_pooling else self.block_manager.usage
        stats = self.scheduler.make_stats(usage)
        stats.engine_index = self.config.parallel.data_parallel_rank
        if self.kv_event_publisher is not None:
            stats.kv_events_dropped = self.kv_event_publisher.take_dropped()
        for stat_logger in self.stat_loggers:
            try:
                stat_logger.record(stats, iteration)
            except Exception:  # a broken logger must not stop generation
                logger.exception("stat logger %r failed", stat_logger)

    # -- LoRA adapters -------------------------------------------------------------------------

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Have every worker read and check the adapter (a ValueError names what is wrong)."""
        if self.config.lora is None:
            raise ValueError(
                f"LoRA adapter {lora_request.lora_name!r} requested, but the engine runs without "
                "--enable-lora"
            )
        for problem in self.executor.collective_rpc("add_lora", (lora_request,)):
            if problem is not None:
                raise LoRAAdapterError(problem)
        self.loras[lora_request.lora_int_id] = lora_request
        return True

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget an adapter; requests already running with it finish with it."""
        if self.loras.pop(lora_int_id, None) is None:
            return False
        if not any(
            r.lora_request is not None and r.lora_request.lora_int_id == lora_int_id
            for r in self.scheduler.requests.values()
        ):
            self.executor.collective_rpc("remove_lora", (lora_int_id,))
        return True

    def list_loras(self) -> set[int]:
        return set(self.loras)

    # -- maintenance ---------------------------------------------------------------------------

    def _publish_kv_events(self) -> None:
        if self.kv_event_publisher is not None:
            connector = self.scheduler.connector
            for event in connector.take_events() if connector is not None else ():
                self.kv_event_publisher.record(event)
            self.kv_event_publisher.flush()

    def reset_prefix_cache(self) -> bool:
        reset = self.block_manager.reset_prefix_cache()
        self._publish_kv_events()  # AllBlocksCleared, without waiting for a step
        return reset

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep (with --enable-sleep-mode): the KV cache is freed and the weights move
        to host memory (level 1) or are dropped (level 2); running requests are preempted and
        recompute after ``wake_up``."""
        if not self.sleep_mode:
            raise ValueError("sleep mode is off: start the engine with --enable-sleep-mode")
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if self.sleep_level:
            return
        self._drop_state()
        self.executor.collective_rpc("sleep", (level,))
        self.sleep_level = level
        self.asleep = set(SLEEP_TAGS)

    def wake_up(self, tags: Sequence[str] | None = None) -> bool:
        """Bring back what ``tags`` name (``weights``, ``kv_cache``; all by default): an RL
        trainer wakes the weights, updates them, then wakes the cache. Steps run again once
        nothing sleeps. Returns whether something still sleeps."""
        wanted = set(SLEEP_TAGS if tags is None else tags)
        unknown = wanted - set(SLEEP_TAGS)
        if unknown:
            raise ValueError(f"tags must be among {', '.join(SLEEP_TAGS)}; got {sorted(unknown)}")
        if "kv_cache" in wanted and "weights" in self.asleep - wanted:
            raise ValueError("wake the weights before the KV cache (tags=weights first)")
        waking = [tag for tag in SLEEP_TAGS if tag in wanted & self.asleep]
        if waking:
            self.executor.collective_rpc("wake_up", (self.num_blocks, waking))
            self.asleep -= set(waking)
            if not self.asleep:
                self.sleep_level = 0
        return self.is_sleeping

    def reload_weights(self) -> None:
        """Read the weights from the checkpoint again (an RL trainer's update); what was
        computed with the old ones (running requests, the prefix cache) is recomputed."""
        if self.sleep_level:
            raise ValueError("the engine is asleep: wake it up before reloading its weights")
        self._drop_state()
        self.executor.collective_rpc("reload_weights")

    def collective_rpc(
        self, method: str, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> list[Any]:
        """``Worker.<method>(*args, **kwargs)`` on every rank, their results in rank order (vLLM's
        collective_rpc, which RL frameworks drive; the server's dev-mode route)."""
        if method.startswith("_") or not callable(getattr(Worker, method, None)):
            raise ValueError(f"the workers have no method {method!r}")
        return self.executor.collective_rpc("call", (method, tuple(args), dict(kwargs or {})))

    def _drop_state(self) -> None:
        """Running requests preempted (they recompute) and the prefix cache emptied."""
        while self.batch_queue:  # the steps in flight end before their requests are preempted
            scheduler_output, pending = self.batch_queue.popleft()
            self.held_outputs += self._finish_step(scheduler_output, pending.result())
        self.scheduler.preempt_all()
        self.block_manager.reset_prefix_cache()
        self._publish_kv_events()  # AllBlocksCleared, without waiting for a step

    @property
    def is_sleeping(self) -> bool:
        return self.sleep_level > 0

    def check_health(self) -> None:
        """Raise when the workers cannot go on (one has died)."""
        self.executor.check_health()

    def shutdown(self) -> None:
        if self.kv_event_publisher is not None:
            self.kv_event_publisher.shutdown()
        self.executor.shutdown()
