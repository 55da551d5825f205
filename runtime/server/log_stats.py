"""The periodic stats line in the server log (off with --disable-log-stats), like vLLM's:

``Avg prompt throughput: 12.0 tokens/s, Avg generation throughput: 40.1 tokens/s, Running: 3
reqs, Waiting: 0 reqs, GPU KV cache usage: 4.2%, Prefix cache hit rate: 50.0%``

(", MM cache hit rate: 25.0%" follows once the multimodal processor cache has been looked up.)

("CPU KV cache usage" when the engine runs on the CPU.) With several data-parallel engine cores
the line sums their running and waiting requests and averages their KV-cache usage. With
speculative decoding, vLLM's second line follows when the window verified drafts:

``SpecDecoding metrics: Mean acceptance length: 2.40, Accepted throughput: ... tokens/s, Drafted
throughput: ... tokens/s, Accepted: 14 tokens, Drafted: 30 tokens, Per-position acceptance rate:
0.800, 0.600, 0.000, Avg Draft acceptance rate: 46.7%``
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infernetes.runtime.engine.stats import IterationStats, SchedulerStats

logger = logging.getLogger("infernetes.runtime.server.stats")

LOG_INTERVAL_S = 10.0


class LoggingStatLogger:
    def __init__(self, interval_s: float = LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._reset(time.monotonic())
        # The last snapshot of each engine core, by its index.
        self.snapshots: dict[int, tuple[int, int, float]] = {}
        self.prefix_queries = 0
        self.prefix_hits = 0
        # the multimodal processor cache's lookups; its hit rate is shown once there are some
        self.mm_cache_queries = 0
        self.mm_cache_hits = 0
        self.cache_label = "GPU"  # set to the engine's device once it has loaded

    def _reset(self, now: float) -> None:
        self.window_start = now
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted_per_pos: list[int] = []

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        if scheduler_stats is not None:
            self.snapshots[scheduler_stats.engine_index] = (
                scheduler_stats.num_running_reqs,
                scheduler_stats.num_waiting_reqs,
                scheduler_stats.kv_cache_usage,
            )
            prefix = scheduler_stats.prefix_cache_stats
            self.prefix_queries += prefix.queries
            self.prefix_hits += prefix.hits
        if iteration_stats is not None:
            self.prompt_tokens += iteration_stats.num_prompt_tokens
            self.generation_tokens += iteration_stats.num_generation_tokens
            self.drafts += iteration_stats.num_drafts
            self.draft_tokens += iteration_stats.num_draft_tokens
            if iteration_stats.mm_cache_stats is not None:
                self.mm_cache_queries += iteration_stats.mm_cache_stats.queries
                self.mm_cache_hits += iteration_stats.mm_cache_stats.hits
            per_pos = iteration_stats.num_accepted_tokens_per_pos
            self.accepted_per_pos.extend([0] * (len(per_pos) - len(self.accepted_per_pos)))
            for position, accepted in enumerate(per_pos):
                self.accepted_per_pos[position] += accepted
        now = time.monotonic()
        if now - self.window_start >= self.interval_s:
            logger.info(self.line(now))
            if self.drafts:
                logger.info(self.spec_decode_line(now))
            self._reset(now)

    @property
    def running(self) -> int:
        return sum(running for running, _, _ in self.snapshots.values())

    @property
    def waiting(self) -> int:
        return sum(waiting for _, waiting, _ in self.snapshots.values())

    @property
    def kv_usage(self) -> float:
        usages = [usage for _, _, usage in self.snapshots.values()]
        return sum(usages) / len(usages) if usages else 0.0

    def line(self, now: float) -> str:
        elapsed = max(now - self.window_start, 1e-9)
        hit_rate = self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0
        line = (
            f"Avg prompt throughput: {self.prompt_tokens / elapsed:.1f} tokens/s, "
            f"Avg generation throughput: {self.generation_tokens / elapsed:.1f} tokens/s, "
            f"Running: {self.running} reqs, Waiting: {self.waiting} reqs, "
            f"{self.cache_label} KV cache usage: {self.kv_usage * 100:.1f}%, "
            f"Prefix cache hit rate: {hit_rate * 100:.1f}%"
        )
        if self.mm_cache_queries:
            line += f", MM cache hit rate: {self.mm_cache_hits / self.mm_cache_queries * 100:.1f}%"
        return line

    def spec_decode_line(self, now: float) -> str:
        """vLLM's SpecDecoding line for the window (mean acceptance length counts the bonus
        token, as vLLM's does)."""
        elapsed = max(now - self.window_start, 1e-9)
        accepted = sum(self.accepted_per_pos)
        drafts = max(self.drafts, 1)
        rates = ", ".join(f"{count / drafts:.3f}" for count in self.accepted_per_pos)
        rate = accepted / self.draft_tokens * 100 if self.draft_tokens else float("nan")
        return (
            f"SpecDecoding metrics: Mean acceptance length: {1 + accepted / drafts:.2f}, "
            f"Accepted throughput: {accepted / elapsed:.2f} tokens/s, "
            f"Drafted throughput: {self.draft_tokens / elapsed:.2f} tokens/s, "
            f"Accepted: {accepted} tokens, Drafted: {self.draft_tokens} tokens, "
            f"Per-position acceptance rate: {rates}, Avg Draft acceptance rate: {rate:.1f}%"
        )
