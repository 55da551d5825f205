"""EngineCore: the loop that owns one LLMEngine, wherever it runs (a thread of the API process
or a process of its own, see ``core_client``).

It takes commands, steps while there is work and emits messages; it never touches asyncio, so the
same loop serves both places. Commands are tuples ``(op, call_id, args)``:

- ``("add", call_id, (request_id, prompt, params, priority))``: queue a request (``args`` may be
  the pickled tuple, so a request that cannot be unpickled fails alone, as a reply);
- ``("abort", call_id | None, request_ids)``: abort; the final outputs go out as a step message;
- ``("call", call_id, (method, args))``: one of ``MAINTENANCE_METHODS``;
- ``("shutdown", None, None)``: leave the loop.

Messages out: ``("step", outputs, stats)`` with the outputs that changed and the
``(SchedulerStats, IterationStats)`` pairs recorded since the last message (stat loggers run on
the receiving side); ``("reply", call_id, ok, value)`` answers a command that has a call id;
``("dead", error)`` once a step raised (the loop then returns).
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from typing import Any

from infernetes.runtime.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

MAINTENANCE_METHODS = frozenset({"reset_prefix_cache", "sleep", "wake_up"})

Command = tuple[str, int | None, Any]
Message = tuple


class StatsBuffer:
    """A stat logger that keeps what the engine records until the core ships it."""

    def __init__(self) -> None:
        self.pending: list[tuple[Any, Any]] = []

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        self.pending.append((scheduler_stats, iteration_stats))

    def take(self) -> list[tuple[Any, Any]]:
        taken, self.pending = self.pending, []
        return taken


def engine_info(engine: LLMEngine) -> dict[str, Any]:
    """What the API side needs to know about the loaded engine (all picklable)."""
    return {
        "tokenizer": engine.tokenizer,
        "max_model_len": engine.max_model_len,
        "model_config": engine.model_config,
        "config": engine.config,
        "is_pooling": engine.is_pooling,
        "device": engine.settings.device.type,
        "default_sampling_params": dict(engine.default_sampling_params),
    }


def portable_error(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a RuntimeError carrying its text."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


class EngineCore:
    def __init__(
        self, engine: LLMEngine, stats: StatsBuffer, emit: Callable[[Message], None]
    ) -> None:
        self.engine = engine
        self.stats = stats
        self.emit = emit
        self.pending_outputs: list[Any] = []

    def run(self, next_command: Callable[[float | None], Command | None]) -> None:
        """Serve commands until shutdown; ``next_command(timeout)`` returns None when none came
        within ``timeout`` seconds (``None``: wait as long as it takes)."""
        engine = self.engine
        while True:
            busy = engine.has_unfinished_requests() and not engine.is_sleeping
            command = next_command(0 if busy else None)
            while command is not None:
                if not self.handle(command):
                    return
                command = next_command(0)
            self._flush()
            if engine.has_unfinished_requests() and not engine.is_sleeping:
                try:
                    outputs = engine.step()
                except BaseException as error:
                    logger.exception("the engine loop failed")
                    self.emit(("dead", portable_error(error)))
                    return
                self.pending_outputs.extend(outputs)
                self._flush()

    def _flush(self) -> None:
        stats = self.stats.take()
        if self.pending_outputs or stats:
            outputs, self.pending_outputs = self.pending_outputs, []
            self.emit(("step", outputs, stats))

    def handle(self, command: Command) -> bool:
        """Run one command; False for shutdown."""
        op, call_id, args = command
        if op == "shutdown":
            return False
        try:
            if op == "add":
                request_id, prompt, params, priority = (
                    pickle.loads(args) if isinstance(args, bytes) else args
                )
                result = self.engine.add_request(request_id, prompt, params, priority=priority)
            elif op == "abort":
                self.pending_outputs.extend(self.engine.abort_request(args))
                self._flush()  # the final outputs go before the reply
                result = None
            elif op == "call" and args[0] in MAINTENANCE_METHODS:
                method, method_args = args
                result = getattr(self.engine, method)(*method_args)
            else:
                raise ValueError(f"unknown engine command {op!r}")
        except Exception as error:
            if call_id is None:
                logger.exception("engine command %r failed", op)
            else:
                self.emit(("reply", call_id, False, portable_error(error)))
            return True
        if call_id is not None:
            self.emit(("reply", call_id, True, result))
        return True
