"""200 InferenceServices created at once on a private local control plane.

Reports, for the operator: p50/p99 from create to its Deployment existing, the time until every
resource is Ready, the Deployments created more than once (a second uid under one name), the
operator's API writes per resource (its infernetes_operator_api_writes_total, by kind and verb)
and its peak RSS. Baseline, measured in the same run on the same
cluster: the same 200 Deployments (rendered by `render`, so the same pods) created directly, with
no operator; ratios compare the two.

    .venv/bin/python -m bench operator_scale [--count 200] [--nodes 4]

Measured with 200 at once: create -> Deployment p99 about 1.2 s.
"""

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "cluster"))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


class DeploymentWatcher:
    """Records when each Deployment of a namespace first appears and first becomes Available."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        from kubernetes import client, watch

        self.apps = client.AppsV1Api(api_client)
        self.namespace = namespace
        self.created: dict[str, float] = {}
        self.available: dict[str, float] = {}
        self.uids: dict[str, set[str]] = {}
        self._watch = watch.Watch()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped:
            try:
                self._stream()
            except Exception:  # a dropped watch (namespace deleted, server timeout): watch again
                time.sleep(0.2)

    def _stream(self) -> None:
        # Plain JSON (deserialize=False): the client's model classes take milliseconds per
        # event, and a backlog of them would be counted as the operator's latency.
        for event in self._watch.stream(
            self.apps.list_namespaced_deployment,
            self.namespace,
            timeout_seconds=3600,
            deserialize=False,
        ):
            now = time.monotonic()
            deployment = event["object"]
            name = deployment["metadata"]["name"]
            self.created.setdefault(name, now)
            self.uids.setdefault(name, set()).add(deployment["metadata"]["uid"])
            conditions = (deployment.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Available" and c["status"] == "True" for c in conditions):
                self.available.setdefault(name, now)

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()


def create_all(
    api_client: Any, namespace: str, bodies: list[dict], create: Any
) -> dict[str, float]:
    """Create every body from 8 threads at once; returns name -> monotonic time of the create."""
    from concurrent.futures import ThreadPoolExecutor

    stamps: dict[str, float] = {}

    def one(body: dict) -> None:
        create(namespace, body)
        stamps[body["metadata"]["name"]] = time.monotonic()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, bodies))
    return stamps


def api_writes(metrics: str) -> dict[tuple[str, str], float]:
    """infernetes_operator_api_writes_total by (kind, verb), from the operator's /metrics."""
    writes = {}
    for line in metrics.splitlines():
        if line.startswith("infernetes_operator_api_writes_total{"):
            labels, value = line.rsplit(" ", 1)
            fields = dict(
                item.split("=", 1) for item in labels[labels.index("{") + 1 : -1].split(",")
            )
            writes[(fields["kind"].strip('"'), fields["verb"].strip('"'))] = float(value)
    return writes


def wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench operator_scale")
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=4, help="fake nodes (110 pods each)")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)

    from infernetes.operator.facts import ClusterFacts
    from infernetes.operator.render import render
    from infernetes.operator.testing import (
        OperatorProcess,
        install_crds,
        service_account_kubeconfig,
    )
    from kubernetes import client
    from localcluster import LocalCluster, build_binaries

    workdir = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    cluster = LocalCluster(workdir / "cluster", build_binaries())
    print(f"starting a private cluster with {args.nodes} nodes in {workdir}", flush=True)
    cluster.start(nodes=args.nodes)
    operator = None
    try:
        api_client = cluster.api_client()
        install_crds(cluster.kubectl)
        names = [f"m-{i:03d}" for i in range(args.count)]
        spec = {"model": "tiny/model", "engine": {"device": "cpu"}, "monitoring": {"mode": "none"}}

        # Baseline: the same Deployments, created directly.
        cluster.kubectl("create", "namespace", "baseline")
        apps = client.AppsV1Api(api_client)
        watcher = DeploymentWatcher(api_client, "baseline")
        bodies = [
            render(spec, ClusterFacts(), name=name, namespace="baseline")[0] for name in names
        ]
        started = time.monotonic()
        create_all(
            api_client,
            "baseline",
            bodies,
            lambda ns, body: apps.create_namespaced_deployment(ns, body),
        )
        baseline_creates = time.monotonic() - started
        wait(
            lambda: len(watcher.available) == args.count,
            args.timeout,
            "baseline Deployments available",
        )
        baseline_all = time.monotonic() - started
        watcher.stop()
        cluster.kubectl("delete", "namespace", "baseline", "--wait=true", timeout=args.timeout)

        # The operator.
        cluster.kubectl("create", "namespace", "bench")
        kubeconfig = service_account_kubeconfig(
            cluster.kubectl, namespace="bench", path=workdir / "operator.kubeconfig"
        )
        operator = OperatorProcess(
            kubeconfig=kubeconfig,
            log_path=workdir / "operator.log",
            namespaces=["bench"],
            env=cluster.env,
        ).start()
        idle_rss = operator.peak_rss_bytes()
        custom = client.CustomObjectsApi(api_client)
        watcher = DeploymentWatcher(api_client, "bench")
        resources = [
            {
                "apiVersion": "infernetes.io/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": n},
                "spec": spec,
            }
            for n in names
        ]
        started = time.monotonic()
        created = create_all(
            api_client,
            "bench",
            resources,
            lambda ns, body: custom.create_namespaced_custom_object(
                "infernetes.io", "v1alpha1", ns, "inferenceservices", body
            ),
        )
        wait(
            lambda: len(watcher.created) == args.count,
            args.timeout,
            "Deployments created by the operator",
        )
        latencies = [watcher.created[name] - created[name] for name in names]

        def all_ready() -> bool:
            items = custom.list_namespaced_custom_object(
                "infernetes.io", "v1alpha1", "bench", "inferenceservices"
            )["items"]
            ready = sum(
                any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in (i.get("status") or {}).get("conditions", [])
                )
                for i in items
            )
            return ready == args.count

        wait(all_ready, args.timeout, "every InferenceService Ready")
        operator_all = time.monotonic() - started
        peak_rss = operator.peak_rss_bytes()
        writes = api_writes(operator.metrics())
        twice = sorted(name for name, uids in watcher.uids.items() if len(uids) > 1)
        watcher.stop()
    finally:
        if operator is not None:
            operator.stop()
        cluster.stop()

    print(f"resources: {args.count} on {args.nodes} fake nodes")
    print(
        f"create -> Deployment exists: p50 {statistics.median(latencies):.2f}s  p99 {percentile(latencies, 0.99):.2f}s"
    )
    print(f"all Ready (operator):        {operator_all:.1f}s")
    print(f"all Available (baseline, Deployments created directly): {baseline_all:.1f}s")
    print(
        f"baseline: the API server took {baseline_creates:.1f}s to accept the {args.count} creates"
    )
    print(f"ratio operator / baseline time to all ready: {operator_all / baseline_all:.2f}x")
    print(f"Deployments created more than once: {len(twice)} {' '.join(twice)}".rstrip())
    per_object = sum(writes.values()) / args.count
    detail = ", ".join(
        f"{kind} {verb} {n / args.count:.2f}" for (kind, verb), n in sorted(writes.items())
    )
    print(f"operator API writes per resource: {per_object:.2f} ({detail})")
    print(
        f"operator peak RSS: {peak_rss / 2**20:.0f} MiB (idle after start-up {idle_rss / 2**20:.0f} MiB)"
    )
    print(f"operator log: {workdir / 'operator.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
