"""CoreLoop: serves an EngineCore wherever it runs (a thread of the API process or a process of
its own, see ``core_client``): it takes commands, steps while there is work and emits messages
(``messages``). It never touches asyncio, so the same loop serves both places."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infernetes.runtime.engine.messages import (
    UTILITY_METHODS,
    AbortRequests,
    AddRequest,
    EngineCommand,
    EngineCoreRequest,
    EngineDead,
    EngineMessage,
    Shutdown,
    StepOutputs,
    UtilityCall,
    UtilityReply,
)
from infernetes.runtime.engine.stats import IterationStats, SchedulerStats

if TYPE_CHECKING:  # the API side imports this module; only the core needs the engine
    from infernetes.runtime.engine.engine_core import EngineCore

logger = logging.getLogger(__name__)

# While idle the loop wakes this often to see that its workers are still there.
HEALTH_CHECK_INTERVAL_S = 1.0
# Between the steps that only wait for another engine to pull blocks (its read ends without
# this engine's work): not a busy loop for up to VLLM_NIXL_ABORT_REQUEST_TIMEOUT.
HOLDING_POLL_INTERVAL_S = 0.01


class StatsBuffer:
    """A stat logger that keeps what the engine records until the loop ships it."""

    def __init__(self) -> None:
        self.pending: list[tuple[SchedulerStats, IterationStats]] = []

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats) -> None:
        self.pending.append((scheduler_stats, iteration_stats))

    def take(self) -> list[tuple[SchedulerStats, IterationStats]]:
        taken, self.pending = self.pending, []
        return taken


def portable_error(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a RuntimeError carrying its text."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


class CoreLoop:
    def __init__(
        self, engine: EngineCore, stats: StatsBuffer, emit: Callable[[EngineMessage], None]
    ) -> None:
        self.engine = engine
        self.stats = stats
        self.emit = emit
        self.pending_outputs: list[Any] = []

    def run(self, next_command: Callable[[float | None], EngineCommand | None]) -> None:
        """Serve commands until shutdown; ``next_command(timeout)`` returns None when none came
        within ``timeout`` seconds (``None``: wait as long as it takes)."""
        engine = self.engine
        while True:
            busy = engine.has_unfinished_requests() and not engine.is_sleeping
            wait = HOLDING_POLL_INTERVAL_S if engine.only_holds_sent_blocks else 0
            command = next_command(wait if busy else HEALTH_CHECK_INTERVAL_S)
            while command is not None:
                if not self.handle(command):
                    return
                command = next_command(0)
            self._flush()
            try:
                if engine.has_unfinished_requests() and not engine.is_sleeping:
                    self.pending_outputs.extend(engine.step())
                else:
                    engine.check_health()
            except BaseException as error:
                logger.exception("the engine loop failed")
                self.emit(EngineDead(portable_error(error)))
                return
            self._flush()

    def _flush(self) -> None:
        stats = self.stats.take()
        if self.pending_outputs or stats:
            outputs, self.pending_outputs = self.pending_outputs, []
            self.emit(StepOutputs(outputs, stats))

    def handle(self, command: EngineCommand) -> bool:
        """Run one command; False for shutdown."""
        if isinstance(command, Shutdown):
            return False
        call_id = command.call_id
        try:
            result = self._run(command)
        except Exception as error:
            if call_id is None:
                logger.exception("engine command %s failed", type(command).__name__)
            else:
                self.emit(UtilityReply(call_id, False, portable_error(error)))
            return True
        if call_id is not None:
            self.emit(UtilityReply(call_id, True, result))
        return True

    def _run(self, command: AddRequest | AbortRequests | UtilityCall) -> Any:
        match command:
            case AddRequest(request=request):
                if isinstance(request, bytes):
                    request = pickle.loads(request)
                if not isinstance(request, EngineCoreRequest):
                    raise TypeError(f"not an engine request: {type(request).__name__}")
                self.engine.add_request(request)
                return None
            case AbortRequests(request_ids=request_ids):
                self.pending_outputs.extend(self.engine.abort_requests(request_ids))
                self._flush()  # the final outputs go before the reply
                return None
            case UtilityCall(method=method, args=args) if method in UTILITY_METHODS:
                return getattr(self.engine, method)(*args)
        raise ValueError(f"unknown engine command {command!r}")
