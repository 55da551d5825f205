"""Precise prefix-cache routing end to end (issue 39): an InferenceService of 3 replicas on
serving nodes with `routing.scorers` holding llm-d's precise-prefix-cache-scorer. Each pod
publishes its KV events to `<name>-epp:5557`, a name its hosts file resolves to its node's
address (podkubelet, cluster/README.md), where llm-d's inference scheduler
(cluster/llmd-scheduler.sh), run on this machine with the command line the operator rendered,
binds its indexer. Asked as Envoy asks (ext-proc), it sends a request that shares a long prefix
with an earlier one to the pod that served the earlier one (whose prefix-cache hits rise), and
elsewhere once that pod is deleted.

llm-d's scheduler tokenizes the prompt itself with the model's tokenizer (here the tiny model's
tokenizer.json, LOCAL_TOKENIZER_DIR) and without special tokens, so the requests ask the engine
for none either (`add_special_tokens: false`): the tiny model's tokenizer adds a BOS token.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from host_picker import (
    HostPicker,
    PickerUnavailable,
    build,
    local_tokenizers,
    rendered_picker_args,
    routed_service,
)
from infernetes.operator.picker_config import PRECISE
from infernetes.operator.testing import (
    temporary_namespace,
    wait_until,
)
from serving_nodes import pod_ready, serving_pods, serving_spec

NAME = "routed"
BLOCK_SIZE = 16
# Three engines starting on two busy cores.
STARTUP_TIMEOUT = 420
# Long shared prefixes, each its own from the first block on.
PREFIXES = [
    f"System prompt {topic}. "
    + " ".join(f"Rule {i}: answer questions about {topic} briefly and politely." for i in range(12))
    for topic in ("cats", "rivers", "engines")
]


@pytest.fixture(scope="module")
def ns(cluster: Any, serving_nodes: list[str]) -> Iterator[str]:
    with temporary_namespace(cluster, "e2e-precise") as name:
        yield name


@pytest.fixture(scope="module")
def scheduler() -> Path:
    try:
        return build("llmd-scheduler.sh")
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
    spec = serving_spec(
        f"pvc://{model_claim}/{model_dir.name}",
        NAME,
        engine={"maxModelLen": 512, "maxNumSeqs": 2, "blockSize": BLOCK_SIZE},
        replicas=3,
        routing={
            "scorers": [
                {"type": PRECISE, "weight": 2},
                {"type": "kv-cache-utilization-scorer", "weight": 1},
                {"type": "queue-scorer", "weight": 1},
            ]
        },
    )
    workdir = tmp_path_factory.mktemp("operator")
    with routed_service(cluster, ns, workdir, NAME, spec, STARTUP_TIMEOUT) as service:
        yield service


@pytest.fixture(scope="module")
def picker(
    cluster: Any,
    ns: str,
    service: dict,
    scheduler: Path,
    model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[HostPicker]:
    work = tmp_path_factory.mktemp("picker")
    running = HostPicker(
        scheduler,
        rendered_picker_args(cluster, ns, NAME),
        kubeconfig=cluster.kubeconfig,
        namespace=ns,
        log=work / "picker.log",
        env={
            "LOCAL_TOKENIZER_DIR": str(local_tokenizers(work / "tokenizers", {NAME: model_dir})),
            "PYTHONPATH": str(scheduler.parent / "python"),
        },
    )
    yield running
    if request.session.testsfailed:
        print(running.log_tail())
    running.stop()


def completion(prompt: str) -> dict[str, Any]:
    return {
        "model": NAME,
        "prompt": prompt,
        "max_tokens": 4,
        "temperature": 0,
        "add_special_tokens": False,
    }


def serve(endpoint: str, body: dict[str, Any]) -> None:
    response = httpx.post(f"http://{endpoint}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text


def engine_counter(endpoint: str, name: str) -> float:
    text = httpx.get(f"http://{endpoint}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{")
    )


def full_blocks(model_dir: Path, text: str) -> int:
    from transformers import AutoTokenizer

    tokens = AutoTokenizer.from_pretrained(str(model_dir)).encode(text, add_special_tokens=False)
    return len(tokens) // BLOCK_SIZE


def pod_at(cluster: Any, ns: str, endpoint: str) -> dict[str, Any] | None:
    ip = endpoint.rsplit(":", 1)[0]
    return next(
        (p for p in serving_pods(cluster, ns, NAME) if p["status"].get("podIP") == ip), None
    )


def test_a_shared_prefix_lands_on_the_pod_that_holds_it(
    cluster: Any, ns: str, picker: HostPicker, model_dir: Path
) -> None:
    pods = serving_pods(cluster, ns, NAME)
    assert len(pods) == 3 and all(pod_ready(p) for p in pods)
    # The picker is up once it answers with a pod of the pool.
    wait_until(
        lambda: picker.pick(completion("Hello")), timeout=120, what="the picker's first pick"
    )
    hits = "vllm:prefix_cache_hits_total"
    for prefix in PREFIXES:
        blocks = full_blocks(model_dir, prefix)
        assert blocks >= 8, blocks  # long enough for the prefix to outweigh every other score
        first = picker.pick(completion(prefix + " Question: what is first?"))
        assert first is not None and pod_at(cluster, ns, first), first
        admitted = picker.metric("kvcache_index_admissions_total")
        serve(first, completion(prefix + " Question: what is first?"))
        # The pod's KV events reach the picker's index: it has the prompt's blocks.
        wait_until(
            lambda expected=admitted + blocks: (
                picker.metric("kvcache_index_admissions_total") >= expected
            ),
            timeout=60,
            what="the first request's blocks in the picker's index",
        )
        before = engine_counter(first, hits)
        second = picker.pick(completion(prefix + " Question: and what is second?"))
        assert second == first
        serve(second, completion(prefix + " Question: and what is second?"))
        assert engine_counter(first, hits) >= before + (blocks - 1) * BLOCK_SIZE


def test_deleting_the_pod_that_holds_a_prefix_moves_its_traffic(
    cluster: Any, ns: str, picker: HostPicker
) -> None:
    prompt = PREFIXES[0] + " Question: who holds this?"
    holder = wait_until(
        lambda: picker.pick(completion(prompt)), timeout=120, what="a pick for the prefix"
    )
    serve(holder, completion(prompt))
    assert picker.pick(completion(prompt)) == holder
    pod = pod_at(cluster, ns, holder)
    assert pod is not None
    name = pod["metadata"]["name"]
    cluster.kubectl("delete", "pod", name, "-n", ns, "--timeout=120s")

    def moved() -> str | None:
        # Another pod of the pool (the replacement may reuse the address: it is another pod).
        endpoint = picker.pick(completion(prompt))
        other = pod_at(cluster, ns, endpoint) if endpoint else None
        return endpoint if other and other["metadata"]["name"] != name else None

    elsewhere = wait_until(moved, timeout=60, what="the picker to route elsewhere")
    serve(elsewhere, completion(prompt))
