"""Generated files of the operator that are not the InferenceService CRD itself."""

from infernetes.operator.crd import dump_yaml
from infernetes.operator.peering import peering_crds


def peering_yaml() -> str:
    return dump_yaml(peering_crds())
