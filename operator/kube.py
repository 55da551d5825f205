"""A thin layer over the kubernetes client: raw REST calls by path (any kind, any content type).

The operator touches a handful of kinds, some of them optional CRDs (ServiceMonitor), so it speaks
REST paths rather than one generated class per kind.
"""

import datetime
import json
from collections.abc import Awaitable, Callable
from typing import Any

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT = 30

# Runs a blocking call (`request`, `apply.apply` ...) in the reconciler's API threads.
Call = Callable[..., Awaitable[Any]]


class KubeError(Exception):
    """An API call failed; `status` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


def make_client() -> Any:
    """An ApiClient for the in-cluster service account, else the current kubeconfig."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = 64  # the reconciler's API threads
    return client.ApiClient(configuration)


def request(
    api: Any,
    method: str,
    path: str,
    *,
    query: list[tuple[str, str]] | None = None,
    body: Any = None,
    content_type: str | None = None,
) -> Any:
    """One REST call; the decoded JSON response (None for an empty body)."""
    from urllib3.exceptions import HTTPError

    headers = {"Accept": "application/json"}
    if body is not None:
        # The client serialises dict bodies as JSON for JSON and YAML content types alike.
        headers["Content-Type"] = content_type or "application/json"
    _, url, headers, _, _ = api.param_serialize(
        method=method,
        resource_path=path,
        query_params=query or [],
        header_params=headers,
        auth_settings=["BearerToken"],
    )
    try:
        response = api.call_api(
            method, url, header_params=headers, body=body, _request_timeout=REQUEST_TIMEOUT
        )
        data = response.read()
    except HTTPError as exc:
        raise KubeError(0, f"{method} {path}: {exc}") from exc
    except Exception as exc:  # the client wraps transport errors in its own types
        if type(exc).__name__ == "ApiException":
            raise KubeError(
                getattr(exc, "status", 0) or 0, _message(getattr(exc, "body", "") or str(exc))
            ) from exc
        raise
    if not 200 <= response.status < 300:
        raise KubeError(response.status, _message(data))
    return json.loads(data) if data else None


def _message(data: Any) -> str:
    """The `message` of a Kubernetes Status body, else the raw text."""
    text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
    try:
        return json.loads(text).get("message") or text
    except (ValueError, AttributeError):
        return text


def now() -> str:
    """The time as the API server writes it (RFC 3339, UTC, whole seconds)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
