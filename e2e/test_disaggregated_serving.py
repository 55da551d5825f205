"""Prefill/decode disaggregation on pods that serve (issue 35): an InferenceService with
spec.prefill (one prefill and one decode replica of a tiny model on the CPU) on a serving node.

The decode pod runs the real llm-d routing sidecar (cluster/pd-sidecar.sh builds its cmd/pd-sidecar
from the Go module proxy; the node's image map runs it for its image) in front of its engine. A
request carrying the header llm-d's picker sets (x-prefiller-host-port: the prefill pod) goes to
the prefill pod first, then to the decode engine, which reads the prompt's KV blocks over NIXL:
the greedy tokens are Hugging Face's, and the decode engine's vllm:prompt_tokens_by_source counts
the prompt as external_kv_transfer. Deleting the prefill pod while requests are in flight fails
none of them (a read that fails is recomputed). The API server also refuses the P/D rules' bad
specs. Two engines start on busy cores: minutes, so marked slow.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from host_picker import HostPicker, PickerUnavailable, build, rendered_picker_args
from infernetes.operator.disaggregation import ROLE_LABEL
from infernetes.operator.testing import (
    kubectl_get,
    running_operator,
    service_condition,
    temporary_namespace,
    wait_until,
)
from serving_nodes import (
    pod_ready,
    routing_sidecar_binary,
    serving_pods,
    serving_spec,
)

pytestmark = pytest.mark.slow

NAME = "pd"
_rng = random.Random(35)
# Longer than a few 16-token blocks: the decode engine reads whole blocks.
PROMPTS = [[_rng.randrange(5, 500) for _ in range(n)] for n in (70, 40, 55, 90)]
MAX_TOKENS = 8
STARTUP_TIMEOUT = 400
PREFILL_HEADER = "x-prefiller-host-port"  # what llm-d's prefill-header-handler sets


@pytest.fixture(scope="module")
def ns(cluster: Any, serving_nodes: list[str]) -> Iterator[str]:
    if routing_sidecar_binary() is None:
        pytest.skip("no Go toolchain to build llm-d's routing sidecar")
    with temporary_namespace(cluster, "e2e-pd") as name:
        yield name


def cpu_kernel_cache() -> Path:
    from infernetes.kernels.cpu import native

    for kernel in ("elementwise", "paged_decode"):
        native.load(kernel)  # built here now, if it was not
    return native.cache_dir()


def pd_spec(model: str, node: str) -> dict[str, Any]:
    return serving_spec(
        model,
        NAME,
        engine={
            "maxModelLen": 256,
            "maxNumSeqs": 4,
            # A small cache, as tests/server/test_server_disaggregation.py's: NIXL registers
            # the whole of it, and a CPU engine's default is millions of tokens.
            "numGpuBlocksOverride": 64,
        },
        cpu="1",
        # The CPU kernels this machine has built: a pod's fresh home would build them again
        # in its first step, which on two busy cores outlasts the engine's step watchdog.
        env=({"name": "INFERNETES_KERNEL_CACHE", "value": str(cpu_kernel_cache())},),
        prefill={"replicas": 1},
        # Pods on one serving node reach each other (across nodes they would need forwarding).
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            }
        },
        routing={},
    )


@pytest.fixture(scope="module")
def service(
    cluster: Any,
    ns: str,
    serving_nodes: list[str],
    extension_crds: None,
    model_claim: str,
    model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict]:
    spec = pd_spec(f"pvc://{model_claim}/{model_dir.name}", serving_nodes[0])
    with running_operator(cluster, ns, tmp_path_factory.mktemp("operator")):
        cluster.apply(
            {
                "apiVersion": "infernetes.io/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": NAME, "namespace": ns},
                "spec": spec,
            }
        )

        def both_ready() -> Any:
            resource = kubectl_get(cluster, ns, "infsvc", NAME)
            status = resource.get("status") or {}
            prefill = status.get("prefill") or {}
            ready = service_condition(cluster, ns, NAME, "Ready").get("status") == "True"
            return resource if ready and prefill.get("readyReplicas") == 1 else None

        try:
            resource = wait_until(both_ready, timeout=STARTUP_TIMEOUT, what=f"{NAME}'s roles Ready")
        except TimeoutError:
            print(cluster.kubectl("get", "pods", "-n", ns, "-o", "yaml", check=False).stdout)
            raise
        yield resource


def ready_role_pods(cluster: Any, ns: str, role: str) -> list[dict[str, Any]]:
    return [
        p
        for p in serving_pods(cluster, ns, NAME)
        if p["metadata"]["labels"].get(ROLE_LABEL) == role and pod_ready(p)
    ]


def role_pod(cluster: Any, ns: str, role: str) -> dict[str, Any]:
    (pod,) = ready_role_pods(cluster, ns, role)
    return pod


def complete(decode_ip: str, prompt: list[int], prefill: str | None) -> list[int]:
    headers = {PREFILL_HEADER: prefill} if prefill else {}
    response = httpx.post(
        f"http://{decode_ip}:8000/v1/completions",
        json={
            "model": NAME,
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "logprobs": 1,
            "ignore_eos": True,
            "return_tokens_as_token_ids": True,
        },
        headers=headers,
        timeout=180,
    )
    assert response.status_code == 200, response.text
    tokens = response.json()["choices"][0]["logprobs"]["tokens"]
    return [int(t.removeprefix("token_id:")) for t in tokens]


def prompt_tokens_by_source(decode_ip: str) -> dict[str, float]:
    text = httpx.get(f"http://{decode_ip}:8000/metrics", timeout=30).text
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:prompt_tokens_by_source_total{"):
            source = line.split('source="', 1)[1].split('"', 1)[0]
            found[source] = found.get(source, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def test_the_roles_run_as_rendered(cluster: Any, ns: str, service: dict) -> None:
    decode, prefill = role_pod(cluster, ns, "decode"), role_pod(cluster, ns, "prefill")
    assert [c["name"] for c in decode["spec"]["containers"]] == ["server", "routing-sidecar"]
    assert prefill["metadata"]["name"].startswith(f"{NAME}-prefill-")
    prefill_status = service["status"]["prefill"]
    conditions = {c["type"]: c["status"] for c in prefill_status["conditions"]}
    assert conditions["Ready"] == "True" and conditions["Degraded"] == "False"


def test_completions_through_the_pd_path_equal_transformers(
    cluster: Any, ns: str, service: dict, model_dir: Path
) -> None:
    from infernetes.runtime.testing import hf_greedy_tokens

    decode_ip = role_pod(cluster, ns, "decode")["status"]["podIP"]
    prefill_ip = role_pod(cluster, ns, "prefill")["status"]["podIP"]
    expected = [hf_greedy_tokens(model_dir, prompt, MAX_TOKENS) for prompt in PROMPTS]
    before = prompt_tokens_by_source(decode_ip)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(lambda p: complete(decode_ip, p, f"{prefill_ip}:8000"), PROMPTS))
    assert got == expected
    after = prompt_tokens_by_source(decode_ip)
    transferred = after.get("external_kv_transfer", 0) - before.get("external_kv_transfer", 0)
    computed = after.get("local_compute", 0) - before.get("local_compute", 0)
    hits = after.get("local_cache_hit", 0) - before.get("local_cache_hit", 0)
    # Every prompt came over NIXL (or from the decode engine's own cache) but its last token,
    # which the decode engine computes.
    assert transferred + hits == sum(len(p) - 1 for p in PROMPTS)
    assert transferred > 0 and computed == len(PROMPTS)
    # Without the picker's header the sidecar sends the request straight to its engine.
    assert complete(decode_ip, PROMPTS[0], None) == expected[0]


def test_deleting_the_prefill_pod_fails_no_request_in_flight(
    cluster: Any, ns: str, service: dict, model_dir: Path
) -> None:
    from infernetes.runtime.testing import hf_greedy_tokens

    decode_ip = role_pod(cluster, ns, "decode")["status"]["podIP"]
    prefill = role_pod(cluster, ns, "prefill")
    target = f"{prefill['status']['podIP']}:8000"
    prompts = [[(t + 7) % 500 + 5 for t in p] for p in PROMPTS]
    expected = [hf_greedy_tokens(model_dir, prompt, MAX_TOKENS) for prompt in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(complete, decode_ip, p, target) for p in prompts]
        cluster.kubectl("delete", "pod", prefill["metadata"]["name"], "-n", ns, "--wait=false")
        got = [future.result() for future in futures]
    assert got == expected
    # The Deployment replaces the pod and the role is Ready again.
    wait_until(
        lambda: (
            (kubectl_get(cluster, ns, "infsvc", NAME).get("status") or {})
            .get("prefill", {})
            .get("readyReplicas")
            == 1
            # none is Ready for a moment while the status still counts the deleted one
            and [p["metadata"]["name"] for p in ready_role_pods(cluster, ns, "prefill")]
            not in ([], [prefill["metadata"]["name"]])
        ),
        timeout=STARTUP_TIMEOUT,
        what="a new prefill pod Ready",
    )


@pytest.fixture(scope="module")
def picker(
    cluster: Any, ns: str, service: dict, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HostPicker]:
    """llm-d's inference scheduler (cluster/llmd-scheduler.sh) run on this machine with the
    command line the operator rendered: its prefill and decode profiles."""
    try:
        scheduler = build("llmd-scheduler.sh")
    except PickerUnavailable as exc:
        pytest.skip(f"llm-d's inference scheduler cannot be built here: {exc}")
    work = tmp_path_factory.mktemp("picker")
    running = HostPicker(
        scheduler,
        rendered_picker_args(cluster, ns, NAME),
        kubeconfig=cluster.kubeconfig,
        namespace=ns,
        log=work / "picker.log",
        env={"PYTHONPATH": str(scheduler.parent / "python")},
        header=PREFILL_HEADER,
    )
    yield running
    running.stop()


def test_the_picker_picks_a_decode_pod_and_names_a_prefill_pod(
    cluster: Any, ns: str, service: dict, picker: HostPicker
) -> None:
    decode_ip = role_pod(cluster, ns, "decode")["status"]["podIP"]
    prefill_ip = role_pod(cluster, ns, "prefill")["status"]["podIP"]
    body = {"model": NAME, "prompt": "the picker sends this prompt to " * 4, "max_tokens": 4}
    try:
        answer = wait_until(lambda: picker.pick(body), timeout=90, what="a pick")
    except TimeoutError:
        print(picker.log_tail())
        raise
    endpoint, prefill = answer.split(" ")
    assert (endpoint, prefill) == (f"{decode_ip}:8000", f"{prefill_ip}:8000")
    request = {**body, "temperature": 0, "ignore_eos": True}
    before = prompt_tokens_by_source(decode_ip)
    routed = httpx.post(
        f"http://{endpoint}/v1/completions",
        json=request,
        headers={PREFILL_HEADER: prefill},
        timeout=180,
    )
    assert routed.status_code == 200, routed.text
    transferred = prompt_tokens_by_source(decode_ip).get("external_kv_transfer", 0)
    assert transferred > before.get("external_kv_transfer", 0)
    # The same request without the P/D path: the same greedy text.
    plain = httpx.post(f"http://{endpoint}/v1/completions", json=request, timeout=180)
    assert routed.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"routing": None}, "spec.routing"),
        ({"engine": {"device": "auto"}}, "spec.engine.device"),
        (
            {"prefill": {"engine": {"tensorParallelSize": 2}}},
            "spec.prefill.engine.tensorParallelSize",
        ),
        ({"prefill": {"engine": {"dtype": "bfloat16"}}}, "spec.prefill.engine.dtype"),
        ({"kvCache": {"offload": {"sizeGiB": 1}}}, "spec.kvCache.offload"),
        (
            {"engine": {"device": "cpu", "kvTransferConfig": {"kv_connector": "NixlConnector"}}},
            "spec.engine.kvTransferConfig",
        ),
    ],
)
def test_the_api_server_refuses_what_pd_cannot_serve(
    cluster: Any, ns: str, change: dict[str, Any], field: str
) -> None:
    spec = {**pd_spec("org/model", "n"), **change}
    spec = {key: value for key, value in spec.items() if value is not None}
    manifest = {
        "apiVersion": "infernetes.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "refused", "namespace": ns},
        "spec": spec,
    }
    result = cluster.apply(manifest, check=False)
    assert result.returncode != 0
    assert field in result.stderr, result.stderr
