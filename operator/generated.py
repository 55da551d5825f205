"""The operator's checked-in generated files: path (from the repository root) -> content."""

from collections.abc import Callable

from infernetes.operator.crd import crd_yaml, dump_yaml
from infernetes.operator.peering import peering_crds


def peering_yaml() -> str:
    return dump_yaml(peering_crds())


GENERATED: dict[str, Callable[[], str]] = {
    "crds/inferenceservices.infernetes.io.yaml": crd_yaml,
    "crds/kopf-peerings.kopf.dev.yaml": peering_yaml,
}
