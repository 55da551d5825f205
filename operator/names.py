"""Names shared by the CRD, the renderer and the handlers."""

GROUP = "infernetes.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ["infsvc"]
CRD_NAME = f"{PLURAL}.{GROUP}"

FIELD_MANAGER = "infernetes"
# The image the operator runs when spec.image is not set; the chart pins the same tag.
DEFAULT_IMAGE = "ghcr.io/infernetes/infernetes:0.1.0"
CONTAINER_NAME = "server"
# The uid the runtime image runs as (Containerfile: USER); the pods run as it, and as its gid.
RUNTIME_UID = 1001
# The server always listens on this port inside the pod; spec.service.port is the Service's.
SERVER_PORT = 8000
PORT_NAME = "http"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "infernetes"
# With spec.prefill: the InferenceService whose pool (and picker) both roles' pods belong to.
LABEL_POOL = "infernetes.io/pool"
# The app name of the prefill role's pods, so that the decode Deployment's selector (the one
# server's, immutable) does not select them.
PREFILL_APP = "infernetes-prefill"


def selector_labels(name: str) -> dict[str, str]:
    """The labels that select one InferenceService's pods (immutable in a Deployment)."""
    return {LABEL_NAME: "infernetes", LABEL_INSTANCE: name}


def role_selector_labels(name: str, *, prefill: bool) -> dict[str, str]:
    """The labels that select one role's pods: the prefill role's differ in their app name, the
    decode role's are the one server's, so adding a prefill role leaves the decode Deployment
    as it was."""
    if prefill:
        return {**selector_labels(name), LABEL_NAME: PREFILL_APP}
    return selector_labels(name)


def common_labels(name: str) -> dict[str, str]:
    """The labels every child object carries; the handlers watch children by them."""
    return {**selector_labels(name), LABEL_COMPONENT: "inference", LABEL_MANAGED_BY: MANAGED_BY}
