"""A traffic split on pods that serve (issue 38, item 3): an InferenceService with a LoRA adapter
and `routing.splits` 90 to itself and 10 to the adapter, on serving nodes. The operator renders
an InferenceModelRewrite of its pool; the Inference Extension's picker (cluster/epp.sh, run on
this machine with the command line the operator rendered) reads it and rewrites each request's
`model`. Asked as Envoy asks (ext-proc, `epp-pick --with-body`), each of 200 requests goes where
the picker sends it with the body it forwards, and the `model` of each response says which side
served it: the split must land within 80/20 and 97/3 (a 90/10 draw over 200 stays there but for
a chance under 1e-4).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from host_picker import HostPicker, PickerUnavailable, build, rendered_picker_args, routed_service
from infernetes.operator.testing import kubectl_get, temporary_namespace, wait_until
from serving_nodes import serving_spec

NAME = "split"
ADAPTER = "canary"
REQUESTS = 200
# One engine starting on two busy cores.
STARTUP_TIMEOUT = 300


@pytest.fixture(scope="module")
def ns(cluster: Any, serving_nodes: list[str]) -> Iterator[str]:
    with temporary_namespace(cluster, "e2e-split") as name:
        yield name


@pytest.fixture(scope="module")
def picker_binary() -> Path:
    try:
        return build("epp.sh")
    except PickerUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def service(
    cluster: Any,
    ns: str,
    extension_crds: None,
    model_claim: str,
    model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict]:
    from infernetes.runtime.testing import make_tiny_lora

    # The adapter beside the model, in the claim that is also the pods' model cache.
    make_tiny_lora(model_dir, model_dir.parent / "canary-lora")
    spec = serving_spec(
        f"pvc://{model_claim}/{model_dir.name}",
        NAME,
        engine={"maxNumSeqs": 4},
        replicas=1,
        modelCache={"claimName": model_claim, "readOnly": True},
        lora={"adapters": [{"name": ADAPTER, "source": "cache://canary-lora"}]},
        routing={"splits": [{"target": NAME, "weight": 90}, {"target": ADAPTER, "weight": 10}]},
    )
    workdir = tmp_path_factory.mktemp("operator")
    with routed_service(cluster, ns, workdir, NAME, spec, STARTUP_TIMEOUT) as service:
        yield service


@pytest.fixture(scope="module")
def picker(
    cluster: Any,
    ns: str,
    service: dict,
    picker_binary: Path,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[HostPicker]:
    running = HostPicker(
        picker_binary,
        rendered_picker_args(cluster, ns, NAME),
        kubeconfig=cluster.kubeconfig,
        namespace=ns,
        log=tmp_path_factory.mktemp("picker") / "picker.log",
    )
    yield running
    if request.session.testsfailed:
        print(running.log_tail())
    running.stop()


def completion(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": "Hello there", "max_tokens": 1, "temperature": 0}


def test_status_shows_the_split_the_picker_is_given(cluster: Any, ns: str, service: dict) -> None:
    assert service["status"]["trafficSplit"] == [
        {"target": NAME, "model": NAME, "weight": 90, "percent": 90},
        {"target": ADAPTER, "model": ADAPTER, "weight": 10, "percent": 10},
    ]
    rewrite = kubectl_get(cluster, ns, "inferencemodelrewrite", NAME)
    assert rewrite["spec"]["rules"][0]["targets"] == [
        {"modelRewrite": NAME, "weight": 90},
        {"modelRewrite": ADAPTER, "weight": 10},
    ]
    routing = next(c for c in service["status"]["conditions"] if c["type"] == "Routing")
    assert f"splits the requests for {NAME}: {NAME} 90%, {ADAPTER} 10%" in routing["message"]


def test_a_90_10_split_over_200_requests_lands_within_80_20_and_97_3(
    picker: HostPicker,
) -> None:
    wait_until(lambda: picker.pick(completion(NAME)), timeout=120, what="the picker's first pick")
    decisions_before = picker.metric("inference_extension_model_rewrite_decisions_total")
    served: Counter[str] = Counter()
    for _ in range(REQUESTS):
        routed = picker.route(completion(NAME))
        assert "endpoint" in routed, routed
        response = httpx.post(
            f"http://{routed['endpoint']}/v1/completions",
            content=routed["body"],
            headers={"content-type": "application/json"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        served[response.json()["model"]] += 1
    assert set(served) <= {NAME, ADAPTER}, served
    assert 0.80 * REQUESTS <= served[NAME] <= 0.97 * REQUESTS, served
    print(f"served by {NAME}: {served[NAME]}, by {ADAPTER}: {served[ADAPTER]} of {REQUESTS}")
    # The picker drew every one (its own count of rewrites).
    decisions = picker.metric("inference_extension_model_rewrite_decisions_total")
    assert decisions - decisions_before >= REQUESTS
