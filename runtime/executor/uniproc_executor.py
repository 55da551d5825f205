"""The executor of one worker in this process (one rank: ``--tensor-parallel-size 1``).

Under ``--async-scheduling`` the worker runs on a thread of its own, which takes every call in
order: ``submit_model`` returns at once, so the engine core schedules the next step (and turns
the last one's tokens into outputs) while this one runs. Torch releases the GIL in its kernels,
and on a GPU the thread waits for the device (the sampled ids' copy to the host) without holding
it, so the core's host work overlaps the device's. The worker keeps the tokens it samples in its
own request states, so a step needs nothing back from the core before the next one starts.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from infernetes.runtime.config import RuntimeConfig
from infernetes.runtime.engine.model_runner_output import ModelRunnerOutput
from infernetes.runtime.engine.scheduler_output import SchedulerOutput
from infernetes.runtime.executor.abstract import Executor, PendingOutput
from infernetes.runtime.worker.worker import Worker


class UniProcExecutor(Executor):
    def __init__(self, config: RuntimeConfig) -> None:
        super().__init__(config)
        self.driver_worker = Worker(config, rank=0)
        self.step_thread: ThreadPoolExecutor | None = None
        if config.scheduler.async_scheduling:
            self.step_thread = ThreadPoolExecutor(
                1,
                thread_name_prefix="infernetes-worker",
                initializer=_use_device,
                initargs=(self.driver_worker.device,),
            )

    @property
    def max_concurrent_batches(self) -> int:
        """Async scheduling: the step running and the next one, scheduled meanwhile."""
        return 2 if self.step_thread is not None else 1

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        call = getattr(self.driver_worker, method)
        if self.step_thread is None:
            return [call(*args)]
        return [self.step_thread.submit(call, *args).result()]  # after the steps sent before it

    def submit_model(self, scheduler_output: SchedulerOutput) -> PendingOutput:
        if self.step_thread is None:
            return super().submit_model(scheduler_output)
        return self.step_thread.submit(self._execute, scheduler_output)

    def _execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        output = self.driver_worker.execute_model(scheduler_output)
        assert output is not None  # the only rank returns its output
        return output

    def check_health(self) -> None:
        pass  # the worker lives and dies with this process

    def shutdown(self) -> None:
        if self.step_thread is not None:
            self.step_thread.shutdown(wait=True, cancel_futures=True)


def _use_device(device: torch.device) -> None:
    """The worker thread computes on the worker's device (the current CUDA device is per thread)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
