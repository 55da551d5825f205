"""A load that ramps up and down against an InferenceService KEDA scales on a TTFT target, on
the local control plane with pods that serve (cluster/README.md).

KEDA's operator and metrics API server (cluster/keda.sh, run by cluster/keda_controller.py) and
Debian's Prometheus scraping the pods (cluster/host_prometheus.py) run on this machine; the
service is a tiny random Llama with `autoscaling.latency.ttftSeconds` (`--ttft`, p90 over
`--window` s), `minReplicas: 0`, `maxReplicas` (`--max-replicas`) and the scale-down window
equal to the latency window, and `spec.routing`, whose endpoint picker holds a request while
there is no replica (its flow control) and counts it for KEDA's activation trigger.

The service starts at zero replicas. The first request goes through the picker (run on this
machine with the rendered command line, cluster/host_picker.py, scraped by Prometheus): it waits
there while KEDA brings a replica up, then streams from it; its time to first token is the
"first token from zero". Then the ramp: cluster/streaming_load.py's load, streamed completions
of `--output-tokens` tokens, each client sending one after another to the Service's ready
endpoints, never retrying. `--levels` clients for `--phase-seconds` each (a ramp up and down),
then none until the service is back at zero (at most `--settle` s).

Reported: the first token from zero (and how long the picker held that request), replicas over
time (the autoscaler's `spec.replicas` and the ready pods, sampled every `--sample` s, with
Prometheus's p90 TTFT as KEDA reads it), per phase the TTFT p50/p90 the clients measured,
requests sent/completed/lost (the target: 0 lost, the first request included), and the lost
requests.

    sudo .venv/bin/python -m bench autoscale [--levels 1,4,12,4,1] [--phase-seconds 60]

Needs root (network namespaces), Go (KEDA's and the picker's builds) and Debian's prometheus;
reuses a running `make cluster` built from this checkout, else starts one.
The figures measured, with their commands: bench/results/autoscale.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))

import httpx
from host_picker import HostPicker, build, rendered_picker_args
from host_prometheus import HostPrometheus
from keda_controller import Keda
from serving_nodes import model_claim, serving_spec
from streaming_load import (
    LoadReport,
    StreamingLoad,
    completion_body,
    ready_addresses,
    stream_completion,
)

from bench._cluster import local_cluster

NAME = "autoscaled"
STARTUP_TIMEOUT = 600  # an engine loading on two busy cores
# How long the picker holds the first request: KEDA's activation, then that engine's start.
HOLD_SECONDS = STARTUP_TIMEOUT + 120
# A queue target is what minReplicas 0 requires (the engines' queue activates a service at zero
# as the picker's held requests do); this one is above what the ramp's clients can queue, so the
# TTFT target alone scales between 1 and maxReplicas.
QUEUE_TARGET = 100
# How long a picker started on a busy machine may take to answer at all.
PICKER_START_SECONDS = 120


@dataclass
class Sample:
    second: float  # since the first request
    desired: int  # spec.replicas, the autoscaler's choice
    ready: int
    ttft_p90: float | None  # what KEDA's trigger reads


@dataclass
class FromZero:
    """The first request, sent while the service had no replica."""

    held: float  # seconds from sending it to the picker naming a pod
    first_token: float  # seconds from sending it to its first token (0 when it was lost)
    problem: str  # '' when it streamed to the end, else what went wrong


def service_spec(claim: str, model_dir: Path, prometheus: str, args: argparse.Namespace) -> dict:
    return serving_spec(
        f"pvc://{claim}/{model_dir.name}",
        NAME,
        engine={"maxNumSeqs": args.max_num_seqs},
        cpu="100m",
        memory="512Mi",
        replicas=0,
        monitoring={"mode": "annotations"},
        routing={"flowControl": {"holdSeconds": HOLD_SECONDS, "maxHeldRequests": 8}},
        autoscaling={
            "minReplicas": 0,
            "maxReplicas": args.max_replicas,
            "targetQueuedRequests": QUEUE_TARGET,
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
    from infernetes.operator.render.picker_metrics import PICKER_SERIES_LABEL
    from infernetes.operator.testing import (
        apply_crds,
        go_module_crds,
        running_operator,
        temporary_namespace,
    )
    from infernetes.runtime.testing import make_tiny_llama

    model_dir = make_tiny_llama(work / "models" / "tiny-llama")
    picker_binary = build("epp.sh")
    apply_crds(
        cluster,
        go_module_crds("github.com/kedacore/keda/v2", "KEDA_VERSION", "config/crd/bases/*.yaml")
        + go_module_crds(
            "sigs.k8s.io/gateway-api-inference-extension",
            "INFERENCE_EXTENSION_VERSION",
            "config/crd/bases/*.yaml",
        ),
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
            picker = HostPicker(
                picker_binary,
                picker_args(cluster, ns),
                kubeconfig=cluster.kubeconfig,
                namespace=ns,
                log=work / "picker.log",
                answer_within=HOLD_SECONDS + 60,
            )
            try:
                # The labels the picker's pod and its ServiceMonitor would give its series:
                # KEDA's activation trigger reads the requests it holds.
                prometheus.add_host_target(
                    f"127.0.0.1:{picker.metrics_port}", {"namespace": ns, PICKER_SERIES_LABEL: NAME}
                )
                sampler = Sampler(cluster, ns, prometheus, args.sample)
                sampler.start(args.window)
                # Each line once, as soon as it is known: the report follows the ramp.
                print(settings_line(args), flush=True)
                from_zero = first_request_from_zero(picker, args.output_tokens)
                print(f"\n{from_zero_line(from_zero)}", flush=True)
                report, phases = ramp(cluster, ns, api_client, args)
                sampler.stop()
            except BaseException:
                print(picker.log_tail())
                raise
            finally:
                picker.stop()
            print_report(report, phases, sampler, from_zero)
    finally:
        api_client.close()
        keda.stop()


def picker_args(cluster: Any, ns: str) -> list[str]:
    """The rendered picker's arguments, once it holds requests HOLD_SECONDS."""
    from infernetes.operator.testing import kubectl_get, wait_until

    def rendered() -> list[str] | None:
        if kubectl_get(cluster, ns, "deployment", f"{NAME}-epp") is None:
            return None
        args = rendered_picker_args(cluster, ns, NAME)
        held = any(f"defaultRequestTTL: {HOLD_SECONDS}s" in arg for arg in args)
        return args if held else None

    return wait_until(rendered, timeout=120, what="the picker rendered to hold requests")


def first_request_from_zero(picker: HostPicker, output_tokens: int) -> FromZero:
    """Sends one streamed completion through the picker while the service has no replica: the
    picker holds it until KEDA has brought one up and it is ready, then it streams from there.
    A picker not answering yet (still starting) is asked again; the clock starts at the
    request it answered."""
    body = completion_body(NAME, "Hello there", output_tokens)
    deadline = time.monotonic() + PICKER_START_SECONDS
    while True:
        sent = time.monotonic()
        routed = picker.route(body)
        if "endpoint" in routed:
            break
        if routed["error"].startswith("the picker refused"):
            return FromZero(time.monotonic() - sent, 0.0, routed["error"])
        if time.monotonic() > deadline:
            raise RuntimeError(f"the picker did not answer: {routed['error']}")
        time.sleep(0.5)
    held = time.monotonic() - sent

    async def stream() -> tuple[str, float]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=10)) as http:
            return await stream_completion(
                http, routed["endpoint"], json.loads(routed["body"]), sent
            )

    problem, first_token = asyncio.run(stream())
    return FromZero(held, first_token, problem)


def ramp(
    cluster: Any, ns: str, api_client: Any, args: argparse.Namespace
) -> tuple[LoadReport, list[tuple[int, float, float, int]]]:
    """The load's phases, then none until the service is back at zero: the report and, per
    phase, (clients, start, end, requests lost before it)."""
    from infernetes.operator.testing import wait_until

    levels = [int(level) for level in args.levels.split(",")]
    # The picker saw the new pod ready from the pod itself; the Service's EndpointSlice, which
    # the load balances over, follows when the endpoint controller gets to it.
    wait_until(
        lambda: ready_addresses(api_client, ns, NAME),
        timeout=120,
        what="the woken replica in the Service's endpoints",
    )
    load = StreamingLoad(
        api_client, ns, NAME, NAME, concurrency=max(levels), max_tokens=args.output_tokens
    )
    load.active = 0
    load.start()
    phases: list[tuple[int, float, float, int]] = []
    try:
        for level in levels:
            start, lost = time.monotonic(), len(load.report.lost)
            load.active = level
            time.sleep(args.phase_seconds)
            phases.append((level, start, time.monotonic(), lost))
        load.active = 0
        settle = time.monotonic()
        while time.monotonic() - settle < args.settle and replicas(cluster, ns) != (0, 0):
            time.sleep(args.sample)
        phases.append((0, settle, time.monotonic(), len(load.report.lost)))
    finally:
        report = load.stop()
    return report, phases


def settings_line(args: argparse.Namespace) -> str:
    return (
        f"TTFT target p90 {args.ttft} s over {args.window} s; 0..{args.max_replicas} replicas; "
        f"max-num-seqs {args.max_num_seqs}; {args.output_tokens} output tokens per request"
    )


def from_zero_line(from_zero: FromZero) -> str:
    if from_zero.problem:
        return f"first request at zero replicas: lost after {from_zero.held:.1f} s"
    return (
        f"first request at zero replicas: first token after {from_zero.first_token:.1f} s "
        f"(held {from_zero.held:.1f} s in the picker while a replica came up)"
    )


def print_report(
    report: LoadReport,
    phases: list[tuple[int, float, float, int]],
    sampler: Sampler,
    from_zero: FromZero,
) -> None:
    """What the ramp gave; the settings and the first request's line came before it."""
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
    completed = report.completed + (0 if from_zero.problem else 1)
    lost = len(report.lost) + (1 if from_zero.problem else 0)
    print(
        f"\nrequests sent {completed + lost} (the first one included), completed {completed}, "
        f"lost {lost}"
    )
    print("\nreplicas over time (s since the first request: desired/ready, KEDA's TTFT p90 s):")
    last = None
    for sample in sampler.samples:
        if (sample.desired, sample.ready) != last:
            ttft = "-" if sample.ttft_p90 is None else f"{sample.ttft_p90:.3f}"
            print(f"  {sample.second:6.0f} s: {sample.desired}/{sample.ready} (p90 {ttft})")
            last = (sample.desired, sample.ready)
    if from_zero.problem:
        print(f"lost: the first request: {from_zero.problem}")
    for line in report.lost[:40]:
        print(f"lost: {line}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench autoscale", description=__doc__)
    parser.add_argument("--levels", default="1,4,12,4,1", help="clients in each phase")
    parser.add_argument("--phase-seconds", type=float, default=60)
    parser.add_argument("--settle", type=float, default=300, help="most seconds to wait for 0")
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
