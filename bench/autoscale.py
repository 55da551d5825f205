"""A load that ramps up and down against an InferenceService KEDA scales on a TTFT target, on
the local control plane with pods that serve (cluster/README.md).

KEDA's operator and metrics API server (cluster/keda.sh, run by cluster/keda_controller.py) and
Debian's Prometheus scraping the pods (cluster/host_prometheus.py) run on this machine; the
service is a tiny random Llama with `autoscaling.latency.ttftSeconds` (`--ttft`, p90 over
`--window` s), `minReplicas: 1`, `maxReplicas` (`--max-replicas`) and the scale-down window
equal to the latency window. The load is cluster/streaming_load.py's: streamed completions of
`--output-tokens` tokens, each client sending one after another to the Service's ready
endpoints, never retrying. `--levels` clients for `--phase-seconds` each (a ramp up and down),
then none until the service is back at its minimum (at most `--settle` s).

Reported: replicas over time (the autoscaler's `spec.replicas` and the ready pods, sampled every
`--sample` s, with Prometheus's p90 TTFT as KEDA reads it), per phase the TTFT p50/p90 the
clients measured, requests sent/completed/lost (the target: 0 lost), and the lost requests.

    sudo .venv/bin/python -m bench autoscale [--levels 1,4,12,4,1] [--phase-seconds 60]

Needs root (network namespaces), Go (KEDA's build) and Debian's prometheus; reuses a running
`make cluster` built from this checkout, else starts one.
The figures measured, with their commands: bench/results/autoscale.md.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))

from host_prometheus import HostPrometheus
from keda_controller import Keda
from serving_nodes import model_claim, serving_spec
from streaming_load import LoadReport, StreamingLoad

from bench._cluster import local_cluster

NAME = "autoscaled"
STARTUP_TIMEOUT = 600  # an engine loading on two busy cores


@dataclass
class Sample:
    second: float  # since the load began
    desired: int  # spec.replicas, the autoscaler's choice
    ready: int
    ttft_p90: float | None  # what KEDA's trigger reads


def service_spec(claim: str, model_dir: Path, prometheus: str, args: argparse.Namespace) -> dict:
    return serving_spec(
        f"pvc://{claim}/{model_dir.name}",
        NAME,
        engine={"maxNumSeqs": args.max_num_seqs},
        cpu="100m",
        memory="512Mi",
        monitoring={"mode": "annotations"},
        autoscaling={
            "minReplicas": 1,
            "maxReplicas": args.max_replicas,
            "latency": {"ttftSeconds": args.ttft, "windowSeconds": args.window},
            "scaleDownStabilizationSeconds": args.window,
            "keda": {"prometheusServerAddress": prometheus},
        },
    )


def replicas(cluster: Any, ns: str) -> tuple[int, int]:
    """(spec.replicas of the InferenceService, ready pods of its Deployment)."""
    from infernetes.operator.testing import kubectl_get

    service = kubectl_get(cluster, ns, "infsvc", NAME) or {}
    deployment = kubectl_get(cluster, ns, "deployment", NAME) or {}
    ready = (deployment.get("status") or {}).get("readyReplicas") or 0
    return (service.get("spec") or {}).get("replicas", 0), ready


class Sampler:
    """Samples replicas and the TTFT p90 KEDA reads every `interval` s, in a thread."""

    def __init__(self, cluster: Any, ns: str, prometheus: HostPrometheus, interval: float) -> None:
        from infernetes.operator.render.autoscaling import TTFT_METRIC, latency_promql

        self.cluster, self.ns, self.prometheus, self.interval = cluster, ns, prometheus, interval
        self.query = ""
        self.samples: list[Sample] = []
        self.began = time.monotonic()
        self._latency_promql = lambda window: latency_promql(
            TTFT_METRIC, {"windowSeconds": window}, model_name=NAME, namespace=ns
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, window: int) -> None:
        self.query = self._latency_promql(window)
        self.began = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):  # a slow answer skips one sample
                desired, ready = replicas(self.cluster, self.ns)
                ttft = self.prometheus.value(self.query)
                self.samples.append(Sample(time.monotonic() - self.began, desired, ready, ttft))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def quantile(values: list[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def run(cluster: Any, work: Path, args: argparse.Namespace) -> None:
    from infernetes.operator.testing import (
        apply_crds,
        go_module_crds,
        running_operator,
        service_condition,
        temporary_namespace,
        wait_until,
    )
    from infernetes.runtime.testing import make_tiny_llama

    model_dir = make_tiny_llama(work / "models" / "tiny-llama")
    apply_crds(
        cluster,
        go_module_crds("github.com/kedacore/keda/v2", "KEDA_VERSION", "config/crd/bases/*.yaml"),
    )
    keda = Keda(cluster, work)
    keda.start()
    api_client = cluster.api_client()
    try:
        with (
            temporary_namespace(cluster, "bench-autoscale") as ns,
            model_claim(cluster, ns, model_dir) as claim,
            HostPrometheus(cluster, work, namespaces=[ns]) as prometheus,
            running_operator(cluster, ns, work / "operator"),
        ):
            cluster.apply(
                {
                    "apiVersion": "infernetes.io/v1alpha1",
                    "kind": "InferenceService",
                    "metadata": {"name": NAME, "namespace": ns},
                    "spec": service_spec(claim, model_dir, prometheus.url, args),
                }
            )
            wait_until(
                lambda: service_condition(cluster, ns, NAME, "Ready").get("status") == "True",
                timeout=STARTUP_TIMEOUT,
                what=f"{NAME} Ready",
            )
            ramp(cluster, ns, prometheus, api_client, args)
    finally:
        api_client.close()
        keda.stop()


def ramp(
    cluster: Any, ns: str, prometheus: HostPrometheus, api_client: Any, args: argparse.Namespace
) -> None:
    levels = [int(level) for level in args.levels.split(",")]
    load = StreamingLoad(
        api_client, ns, NAME, NAME, concurrency=max(levels), max_tokens=args.output_tokens
    )
    sampler = Sampler(cluster, ns, prometheus, args.sample)
    load.active = 0
    load.start()
    sampler.start(args.window)
    phases: list[tuple[int, float, float, int]] = []  # (level, start, end, lost before it)
    try:
        for level in levels:
            start, lost = time.monotonic(), len(load.report.lost)
            load.active = level
            time.sleep(args.phase_seconds)
            phases.append((level, start, time.monotonic(), lost))
        load.active = 0
        settle = time.monotonic()
        while time.monotonic() - settle < args.settle and replicas(cluster, ns) != (1, 1):
            time.sleep(args.sample)
        phases.append((0, settle, time.monotonic(), len(load.report.lost)))
    finally:
        sampler.stop()
        report = load.stop()
    print_report(report, phases, sampler, args)


def print_report(
    report: LoadReport,
    phases: list[tuple[int, float, float, int]],
    sampler: Sampler,
    args: argparse.Namespace,
) -> None:
    print(
        f"TTFT target p90 {args.ttft} s over {args.window} s; 1..{args.max_replicas} replicas; "
        f"max-num-seqs {args.max_num_seqs}; {args.output_tokens} output tokens per request"
    )
    print(
        "\n| phase | clients | seconds | completed | lost | TTFT p50 s | TTFT p90 s | ready replicas |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for index, (level, start, end, lost_before) in enumerate(phases):
        ttfts = [ttft for sent, ttft in report.first_tokens if start <= sent < end]
        lost = (phases[index + 1][3] if index + 1 < len(phases) else len(report.lost)) - lost_before
        seen = [s.ready for s in sampler.samples if start <= sampler.began + s.second < end]
        ready = f"{min(seen)}..{max(seen)}" if seen else "-"
        p50 = f"{quantile(ttfts, 50):.3f}" if ttfts else "-"
        p90 = f"{quantile(ttfts, 90):.3f}" if ttfts else "-"
        print(
            f"| {index + 1} | {level} | {end - start:.0f} | {len(ttfts)} | {lost} | {p50} | {p90} "
            f"| {ready} |"
        )
    print(
        f"\nrequests sent {report.completed + len(report.lost)}, completed {report.completed}, "
        f"lost {len(report.lost)}"
    )
    print("\nreplicas over time (s since the load began: desired/ready, KEDA's TTFT p90 s):")
    last = None
    for sample in sampler.samples:
        if (sample.desired, sample.ready) != last:
            ttft = "-" if sample.ttft_p90 is None else f"{sample.ttft_p90:.3f}"
            print(f"  {sample.second:6.0f} s: {sample.desired}/{sample.ready} (p90 {ttft})")
            last = (sample.desired, sample.ready)
    for line in report.lost[:40]:
        print(f"lost: {line}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench autoscale", description=__doc__)
    parser.add_argument("--levels", default="1,4,12,4,1", help="clients in each phase")
    parser.add_argument("--phase-seconds", type=float, default=60)
    parser.add_argument("--settle", type=float, default=300, help="most seconds to wait for 1")
    parser.add_argument("--ttft", type=float, default=1.0, help="the p90 TTFT target, seconds")
    parser.add_argument("--window", type=int, default=30, help="latency window, seconds (>= 30)")
    parser.add_argument("--max-replicas", type=int, default=3)
    parser.add_argument("--max-num-seqs", type=int, default=2)
    parser.add_argument("--output-tokens", type=int, default=12)
    parser.add_argument("--sample", type=float, default=5, help="seconds between samples")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-autoscale-"))
    (work / "operator").mkdir()
    with local_cluster() as cluster:
        cluster.start_serving_nodes(2)
        try:
            run(cluster, work, args)
        finally:
            cluster.stop_serving_nodes()
    return 0
