"""The executor of one worker in this process (one rank: ``--tensor-parallel-size 1``)."""

from __future__ import annotations

from typing import Any

from infernetes.runtime.config import RuntimeConfig
from infernetes.runtime.executor.abstract import Executor
from infernetes.runtime.worker.worker import Worker


class UniProcExecutor(Executor):
    def __init__(self, config: RuntimeConfig) -> None:
        super().__init__(config)
        self.driver_worker = Worker(config, rank=0)

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return [getattr(self.driver_worker, method)(*args)]

    def check_health(self) -> None:
        pass  # the worker lives and dies with this process

    def shutdown(self) -> None:
        pass  # nothing runs outside this process
