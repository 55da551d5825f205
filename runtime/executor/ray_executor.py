"""The executor of one Ray actor per rank (``--distributed-executor-backend ray``).

Ray places the ranks: on GPUs a placement group of one bundle per rank (``VLLM_RAY_PER_WORKER_GPUS``
GPUs each, packed onto as few nodes as fit), so a Ray cluster that spans several nodes runs a model
across them with one ``serve``; on a CPU the actors share the host's cores. ``ray.init()`` joins
the cluster ``RAY_ADDRESS`` names or a local one started by ``ray start``, else starts a local one
for this engine (and stops it with the engine). Each actor joins torch.distributed (rank 0's node hosts the rendezvous) and then
answers the same ``Worker`` calls as an ``mp`` worker process; calls to an actor run in the order
they were sent, so pipeline steps may be in flight together as with ``mp``. Ray is an optional
extra (``pip install 'infernetes[ray]'``; the runtime image has it).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import ray
import torch
from infernetes.runtime.config import RuntimeConfig
from infernetes.runtime.executor.abstract import (
    RanksApartExecutor,
    WorkerDiedError,
    with_shared_seed,
)
from infernetes.runtime.logging_config import LoggingSettings, configure_logging
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from infernetes.schema.env import read_env

logger = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 120.0  # GPUs held by other jobs: say so instead of waiting for ever
HEALTH_TIMEOUT_S = 30.0


class RankActor:
    """One rank in a Ray worker process (made a Ray actor class by ``ray.remote`` below)."""

    def __init__(self, logging_settings: LoggingSettings, rank: int) -> None:
        configure_logging(logging_settings, tag=f"rank {rank} pid {os.getpid()}")
        self.rank = rank
        self.worker: Any = None

    def address(self) -> tuple[str, int]:
        """This node's address and a port free on it (rank 0's host the rendezvous)."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            return ray.util.get_node_ip_address(), sock.getsockname()[1]

    def start(self, config: RuntimeConfig, init_method: str) -> None:
        from infernetes.runtime.worker.worker import start_rank

        # Ray shows an actor only the GPUs it was given: its device is the first visible one.
        device = torch.device("cuda", 0) if config.device.device.type == "cuda" else None
        self.worker = start_rank(config, self.rank, init_method, device)

    def call(self, method: str, args: tuple[Any, ...]) -> Any:
        return getattr(self.worker, method)(*args)

    def pid(self) -> int:
        return os.getpid()


RemoteRankActor = ray.remote(RankActor)


class RayCall:
    """A call sent to every rank; ``result()`` gathers their replies."""

    def __init__(self, executor: RayExecutor, refs: list[ray.ObjectRef], pick: int | None) -> None:
        self.executor = executor
        self.refs = refs
        self.pick = pick  # the rank whose reply is the result; None: every rank's, in order

    def result(self) -> Any:
        replies = self.executor._gather(self.refs)
        return replies if self.pick is None else replies[self.pick]


class RayExecutor(RanksApartExecutor):
    def __init__(self, config: RuntimeConfig) -> None:
        super().__init__(config)
        if config.parallel.nnodes > 1:
            raise ValueError(
                "distributed_executor_backend='ray' places the ranks on the Ray cluster's nodes "
                "itself: run one serve without --nnodes"
            )
        config = with_shared_seed(config)
        self.owns_ray = not ray.is_initialized()  # a caller's own connection stays theirs
        if self.owns_ray:
            ray.init(include_dashboard=False, logging_level=logging.WARNING)
        world_size = config.parallel.world_size
        self.placement: PlacementGroup | None = None
        self.actors: list[Any] = []
        try:
            self.actors = [self._start_actor(config, rank) for rank in range(world_size)]
            host, port = ray.get(self.actors[0].address.remote())
            init_method = f"tcp://{host}:{port}"
            self._gather([actor.start.remote(config, init_method) for actor in self.actors])
        except BaseException:
            self.shutdown()
            raise
        logger.info(
            "Started %d Ray worker ranks (tensor parallel %d, pipeline parallel %d, on %s)",
            world_size,
            config.parallel.tensor_parallel_size,
            config.parallel.pipeline_parallel_size,
            config.device.device.type,
        )

    def _start_actor(self, config: RuntimeConfig, rank: int) -> Any:
        options: dict[str, Any] = {"num_cpus": 0}
        if config.device.device.type == "cuda":
            gpus = read_env("VLLM_RAY_PER_WORKER_GPUS")
            if self.placement is None:
                self.placement = self._reserve_gpus(config.parallel.world_size, gpus)
            options["num_gpus"] = gpus
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self.placement, placement_group_bundle_index=rank
            )
        else:
            # Ray would pin each actor to one OpenMP thread; the ranks share the cores instead.
            threads = max(1, (os.cpu_count() or 1) // config.parallel.world_size)
            options["runtime_env"] = {
                "env_vars": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads))}
            }
        return RemoteRankActor.options(**options).remote(LoggingSettings.from_env(), rank)

    @staticmethod
    def _reserve_gpus(world_size: int, gpus_per_rank: float) -> PlacementGroup:
        group = placement_group([{"GPU": gpus_per_rank}] * world_size, strategy="PACK")
        ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            remove_placement_group(group)
            available = ray.available_resources().get("GPU", 0)
            raise ValueError(
                f"the Ray cluster cannot place {world_size} ranks of {gpus_per_rank} GPU each "
                f"within {PLACEMENT_TIMEOUT_S:.0f} s ({available:g} GPU(s) available)"
            )
        return group

    def _send(self, method: str, args: tuple[Any, ...], pick: int | None = None) -> RayCall:
        return RayCall(self, [actor.call.remote(method, args) for actor in self.actors], pick)

    def _gather(self, refs: list[ray.ObjectRef]) -> list[Any]:
        """Every rank's reply, in rank order; the first failure or death raises at once (the
        other ranks may be waiting in a collective for the one that failed)."""
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            rank = rank_of[done[0]]
            try:
                results[rank] = ray.get(done[0])
            except RayActorError as error:
                raise WorkerDiedError(f"worker rank {rank} (a Ray actor) died: {error}") from None
            except RayTaskError as error:
                raise (error.cause or error) from None
        return [results[rank] for rank in range(len(refs))]

    def check_health(self) -> None:
        refs = [actor.pid.remote() for actor in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=HEALTH_TIMEOUT_S)
        if len(ready) < len(refs):
            late = [rank for rank, ref in enumerate(refs) if ref not in ready]
            raise WorkerDiedError(f"worker ranks {late} (Ray actors) did not answer in time")
        self._gather(refs)

    def abandon(self) -> None:
        """Ray's actors and its local cluster are not this process's children: stop them."""
        self.shutdown()

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        if self.placement is not None:
            remove_placement_group(self.placement)
            self.placement = None
        if self.owns_ray:
            ray.shutdown()
