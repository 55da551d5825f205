"""Running the operator: kopf with our settings, peering, health and metrics endpoints."""

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class OperatorOptions:
    namespaces: tuple[str, ...] = ()
    peering: str | None = None
    standalone: bool = True
    priority: int | None = None
    metrics_port: int = 8080
    health_port: int = 8081
    bind_address: str = "0.0.0.0"
    image: str | None = None
    otlp_traces_endpoint: str | None = None
    verbose: bool = False


def run_operator(options: OperatorOptions) -> int:
    """Run until SIGINT/SIGTERM; several replicas with the same peering name take turns."""
    import kopf
    from infernetes.operator import handlers  # noqa: F401  (importing it registers the handlers)

    kopf.configure(verbose=options.verbose, log_prefix=True)
    liveness = (
        f"http://{options.bind_address}:{options.health_port}/healthz"
        if options.health_port
        else None
    )
    kopf.run(
        clusterwide=not options.namespaces,
        namespaces=list(options.namespaces),
        standalone=options.standalone,
        peering_name=options.peering,
        # Replicas with equal priorities would all pause; a random one keeps them distinct.
        priority=options.priority if options.priority is not None else random.randint(1, 1_000_000),
        liveness_endpoint=liveness,
        memo=kopf.Memo(options=options),
    )
    return 0
