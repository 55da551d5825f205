"""Executor: the engine core's one handle on its workers, whatever their number and place.

The core calls ``execute_model``, ``determine_available_memory``, ``initialize_cache`` and, for
anything else, ``collective_rpc(method, args)``, which runs a ``Worker`` method on every rank and
returns their answers in rank order. ``UniProcExecutor`` holds one worker in this process; an
executor with one worker process per rank implements ``collective_rpc`` and inherits the rest.
Under pipeline parallelism ``submit_model`` sends a step without waiting for it, so that up to
``max_concurrent_batches`` steps are in flight, one per stage; under async scheduling two (the
step running and the next, scheduled meanwhile).
"""

from __future__ import annotations

import dataclasses
import secrets
from abc import ABC, abstractmethod
from typing import Any, Protocol

from infernetes.runtime.config import RuntimeConfig
from infernetes.runtime.engine.model_runner_output import ModelRunnerOutput
from infernetes.runtime.engine.scheduler_output import SchedulerOutput


class WorkerDiedError(RuntimeError):
    """A worker exited, or a remote rank disconnected, while the engine needed it."""


class PendingOutput(Protocol):
    """A step sent to the workers; ``result()`` waits for its output."""

    def result(self) -> ModelRunnerOutput: ...


class Ready:
    """A step that has already run."""

    def __init__(self, output: ModelRunnerOutput) -> None:
        self.output = output

    def result(self) -> ModelRunnerOutput:
        return self.output


class Executor(ABC):
    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config

    @property
    def max_concurrent_batches(self) -> int:
        """Steps that may be in flight at once: one per pipeline stage where they run apart, two
        under async scheduling."""
        return 1

    @abstractmethod
    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """Call ``Worker.<method>(*args)`` on every rank; their results, in rank order."""

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step; every rank takes part, the first rank's output is the step's."""
        return self.collective_rpc("execute_model", (scheduler_output,))[0]

    def submit_model(self, scheduler_output: SchedulerOutput) -> PendingOutput:
        """Send one step without waiting for it (where ``max_concurrent_batches`` > 1)."""
        return Ready(self.execute_model(scheduler_output))

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache on the most constrained rank (every rank holds the same blocks)."""
        return min(self.collective_rpc("determine_available_memory"))

    def kv_cache_block_bytes(self) -> int:
        return max(self.collective_rpc("kv_cache_block_bytes"))

    def initialize_cache(self, num_blocks: int) -> None:
        self.collective_rpc("initialize_cache", (num_blocks,))

    @abstractmethod
    def check_health(self) -> None:
        """Raise when a worker has gone (the engine core then dies with it)."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the workers; nothing runs after it."""

    def abandon(self) -> None:
        """The engine core is leaving without a shutdown (its API process vanished): stop only
        what would outlive its process. Worker processes follow their parent on their own."""
        return  # nothing outlives the engine core's process here


class Call(Protocol):
    """A call sent to every rank; ``result()`` waits for the reply it picks (or all of them)."""

    def result(self) -> Any: ...


class RanksApartExecutor(Executor):
    """Ranks in processes of their own (``mp``'s workers, Ray's actors), each taking its calls in
    the order they were sent: a call is sent to all at once and its replies read later, so steps
    may be in flight together."""

    @property
    def max_concurrent_batches(self) -> int:
        """One step per pipeline stage; under async scheduling (one stage) the step running and
        the next, which each rank takes up as soon as it has sent the first one's output."""
        if self.config.scheduler.async_scheduling:
            return 2
        return self.config.parallel.pipeline_parallel_size

    @abstractmethod
    def _send(self, method: str, args: tuple[Any, ...], pick: int | None = None) -> Call:
        """Send ``Worker.<method>(*args)`` to every rank; the reply of rank ``pick`` is the
        result (None: every rank's, in rank order)."""

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return self._send(method, args).result()

    def submit_model(self, scheduler_output: SchedulerOutput) -> PendingOutput:
        return self._send("execute_model", (scheduler_output,), self.config.parallel.output_rank)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.submit_model(scheduler_output).result()


def with_shared_seed(config: RuntimeConfig) -> RuntimeConfig:
    """Every rank samples each step (the same logits) and must draw the same numbers: without
    ``--seed`` the ranks get one drawn here."""
    if config.model.seed is not None:
        return config
    return dataclasses.replace(
        config, model=dataclasses.replace(config.model, seed=secrets.randbits(63))
    )


def select_executor(config: RuntimeConfig) -> type[Executor]:
    """The executor ``--distributed-executor-backend`` names (``uni``, ``mp`` or ``ray``)."""
    if config.parallel.distributed_executor_backend == "mp":
        from infernetes.runtime.executor.multiproc_executor import MultiprocExecutor

        return MultiprocExecutor
    if config.parallel.distributed_executor_backend == "ray":
        from infernetes.runtime.executor.ray_executor import RayExecutor

        return RayExecutor
    from infernetes.runtime.executor.uniproc_executor import UniProcExecutor

    return UniProcExecutor
