"""Fixtures for tests against a real local Kubernetes control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok; see cluster/localcluster.py).

Fixtures available to every test under e2e/:

- ``cluster`` (session): a running ``localcluster.LocalCluster`` with
    ``kubeconfig`` (Path of an admin kubeconfig), ``server`` (API URL), ``bin_dir`` (kubectl,
    helm, kwok, ...), ``nodes`` (fake GPU node names, each 8 x ``nvidia.com/gpu``),
    ``env`` (os.environ + KUBECONFIG + bin_dir on PATH: pass it to an operator subprocess),
    ``kubectl(*args, input=None, check=True) -> CompletedProcess[str]`` (raises
    ``KubectlError`` with stderr when ``check``), ``kubectl_json(*args)``,
    ``apply(manifests, namespace=None, server_side=False, field_manager=None)`` (YAML text,
    a dict or a list of dicts), ``helm(*args, ...)``, ``api_client()`` (a new
    ``kubernetes.client.ApiClient``), ``log_tails(lines=60)``.
  It reuses a cluster started by ``make cluster`` (state in ``.cluster/``) when one built from
  the pinned versions is running, so repeated runs during development need no start-up;
  otherwise (CI, or with
  ``INFERNETES_E2E_FRESH_CLUSTER=1``) it builds the binaries if they are not cached, starts a
  private cluster in a temporary directory and stops it at the end of the session. Tests must
  therefore not depend on a pristine cluster: use the ``namespace`` fixture and unique names.
- ``api_client`` (session): one ``kubernetes.client.ApiClient`` for ``cluster``.
- ``namespace`` (function): a new namespace whose ``default`` ServiceAccount exists (pods can be
  created in it at once); deleted after the test.
- ``serving_nodes`` (session): names of 2 nodes whose pods really run (podkubelet processes,
  ``cluster/serving_nodes.py``), labelled and tainted ``infernetes.io/serving-node=true``
  (``SERVING_NODE_LABEL``): a pod lands there only when it selects and tolerates that. Skips
  where this machine cannot run them (not root, no ``ip netns``, no Go toolchain).
- ``extension_crds`` (module): the Gateway API Inference Extension's CRDs (from its Go module),
  applied before a module's operator starts and removed after it: spec.routing renders the
  InferencePool and its picker at once, and the picker needs the InferenceObjective CRD.
- ``keda_crds`` (module): KEDA's CRDs (from its Go module), applied before a module's operator
  starts (it renders ScaledObjects only when the API serves them) and removed after it.
- ``keda`` (module): KEDA's operator and metrics API server running against ``cluster``
  (``cluster/keda_controller.py``; built by ``cluster/keda.sh`` if not cached), the
  external-metrics APIService served through the aggregation layer. Skips without a Go
  toolchain.
- ``model_dir`` (module): a tiny random Llama; ``model_claim`` (module): a claim ``models`` in
  the module's own ``ns`` fixture bound to a hostPath volume of its parent, so that pods on
  serving nodes get it as ``pvc://models/<model_dir.name>``.

``from localcluster import wait_for`` gives the polling helper
(``wait_for(condition, timeout=..., what=...)`` returns the first truthy value).

When a test fails, the tail of every component's log is added to its report (full logs are in
the cluster's ``logs/`` directory, whose path the report shows).
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "cluster"))

from keda_controller import Keda, KedaUnavailable  # found through the sys.path entry above
from localcluster import (
    DEFAULT_STATE_DIR,
    LocalCluster,
    build_binaries,
    cached_bin_dir,
    wait_for,
)
from serving_nodes import ServingNodesUnavailable
from serving_nodes import model_claim as serving_model_claim

_active_cluster: LocalCluster | None = None
_cluster_summary: str | None = None  # which cluster the session used, for the terminal summary


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    global _active_cluster, _cluster_summary
    if os.environ.get("INFERNETES_E2E_FRESH_CLUSTER") != "1":
        shared = LocalCluster(DEFAULT_STATE_DIR)
        # Only one built from the pinned versions: a stale one would test old binaries.
        if shared.running() and shared.bin_dir == cached_bin_dir():
            _active_cluster = shared
            _cluster_summary = f"reused the running `make cluster` ({shared.kubeconfig})"
            yield shared
            _active_cluster = None
            return
    private = LocalCluster(tmp_path_factory.mktemp("cluster"), build_binaries())
    seconds = private.start()
    _active_cluster = private
    _cluster_summary = f"started a private cluster in {seconds:.1f} s (logs: {private.logs_dir})"
    try:
        yield private
    finally:
        _active_cluster = None
        # pytest keeps its last temporary directories: the logs named in failure reports stay.
        private.stop(keep_logs=True)


@pytest.fixture(scope="session")
def api_client(cluster: LocalCluster) -> Iterator[Any]:
    client = cluster.api_client()
    yield client
    client.close()


@pytest.fixture(scope="session")
def serving_nodes(cluster: LocalCluster) -> Iterator[list[str]]:
    try:
        names = cluster.start_serving_nodes(2)
    except ServingNodesUnavailable as exc:
        pytest.skip(f"no serving nodes: {exc}")
    try:
        yield names
    finally:
        cluster.stop_serving_nodes()


@pytest.fixture(scope="module")
def extension_crds(cluster: Any) -> Iterator[None]:
    """The Inference Extension's CRDs, before the operator starts: spec.routing renders the
    InferencePool and its picker at once. The picker also watches InferenceObjectives
    (inference.networking.x-k8s.io): without that CRD it does not start."""
    from infernetes.operator.testing import apply_crds, go_module_crds, remove_crds

    found = go_module_crds(
        "sigs.k8s.io/gateway-api-inference-extension",
        "INFERENCE_EXTENSION_VERSION",
        "config/crd/bases/*.yaml",
    )
    apply_crds(cluster, found)
    yield
    remove_crds(cluster, found, wait=False)


@pytest.fixture(scope="module")
def keda_crds(cluster: Any) -> Iterator[None]:
    from infernetes.operator.testing import apply_crds, go_module_crds, remove_crds

    found = go_module_crds("github.com/kedacore/keda/v2", "KEDA_VERSION", "config/crd/bases/*.yaml")
    apply_crds(cluster, found)
    yield
    remove_crds(cluster, found, wait=False)


@pytest.fixture(scope="module")
def keda(cluster: Any, keda_crds: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keda]:
    try:
        running = Keda(cluster, tmp_path_factory.mktemp("keda"))
    except KedaUnavailable as exc:
        pytest.skip(str(exc))
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from infernetes.runtime.testing import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="module")
def model_claim(cluster: Any, ns: str, model_dir: Path) -> Iterator[str]:
    """A claim named `models` in the module's `ns` (a fixture each module defines), bound to a
    hostPath volume holding the model's parent directory: `pvc://models/<model_dir.name>`."""
    with serving_model_claim(cluster, ns, model_dir) as claim:
        yield claim


@pytest.fixture
def namespace(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"e2e-{slug}-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", name)
    wait_for(
        lambda: (
            cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
            == 0
        ),
        timeout=60,
        what=f"the default service account in {name}",
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and _active_cluster is not None:
        report.sections.append(("local cluster logs", _active_cluster.log_tails()))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _cluster_summary:
        terminalreporter.write_line(f"local control plane: {_cluster_summary}")
