"""What counts as drift of a child (pure), and the GPU headroom left by promised surge pods."""

import copy

from infernetes.operator.drift import (
    DESIRED_HASH,
    differences,
    quantity_value,
    scaled_by_others,
    stale_fields,
    with_hash,
)
from infernetes.operator.facts import ClusterFacts
from infernetes.operator.gpus import spare_gpus
from infernetes.operator.render import render

SPEC = {"model": "m", "gpu": {"count": 2}, "engine": {"maxNumSeqs": 8}}


def applied(manifest: dict) -> dict:
    """What the API server hands back: our fields plus defaults, quantities as strings."""
    live = copy.deepcopy(with_hash(manifest))
    live["metadata"]["resourceVersion"] = "7"
    live["metadata"]["managedFields"] = [{"manager": "infernetes", "operation": "Apply"}]
    if live["kind"] == "Deployment":
        pod = live["spec"]["template"]["spec"]
        pod["dnsPolicy"] = "ClusterFirst"
        container = pod["containers"][0]
        container["resources"]["limits"]["nvidia.com/gpu"] = "2"
        container["env"].append({"name": "FROM_ANOTHER_MANAGER", "value": "x"})
        live["status"] = {"replicas": 1}
    return live


def manifests() -> list[dict]:
    return [with_hash(m) for m in render(SPEC, ClusterFacts(), name="llama", namespace="ns")]


def test_a_freshly_applied_child_is_not_stale() -> None:
    for manifest in manifests():
        assert stale_fields(manifest, applied(manifest)) == []


def test_missing_changed_render_and_edits_are_stale() -> None:
    deployment = manifests()[0]
    assert stale_fields(deployment, None) == ["missing"]
    newer = with_hash(
        render({**SPEC, "replicas": 2}, ClusterFacts(), name="llama", namespace="ns")[0]
    )
    assert stale_fields(newer, applied(deployment)) == ["render changed"]
    edited = applied(deployment)
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    edited["spec"]["replicas"] = 5
    assert stale_fields(deployment, edited) == [
        ".spec.replicas",
        ".spec.template.spec.containers[name=server].image",
    ]
    edited = applied(deployment)
    del edited["metadata"]["annotations"][DESIRED_HASH]
    assert stale_fields(deployment, edited) == ["render changed"]


def test_lists_of_named_items_match_by_name_and_others_as_wholes() -> None:
    desired = {"env": [{"name": "A", "value": "1"}], "args": ["--x", "--y"]}
    assert (
        differences(
            desired, {"env": [{"name": "B"}, {"name": "A", "value": "1"}], "args": ["--x", "--y"]}
        )
        == []
    )
    assert differences(desired, {"env": [{"name": "A", "value": "2"}], "args": ["--y", "--x"]}) == [
        ".env[name=A].value",
        ".args[0]",
        ".args[1]",
    ]
    assert differences({"tolerations": [{"key": "a"}]}, {"tolerations": []}) == [".tolerations"]


def test_zero_values_the_api_server_leaves_out_are_not_drift() -> None:
    # A write storm seen on the control plane: readOnly false never reads back.
    desired = {
        "volumes": [{"name": "c", "persistentVolumeClaim": {"claimName": "c", "readOnly": False}}]
    }
    live = {"volumes": [{"name": "c", "persistentVolumeClaim": {"claimName": "c"}}]}
    assert differences(desired, live) == []
    assert differences({"readOnly": True}, {}) == [".readOnly"]


def test_quantities_compare_by_value() -> None:
    assert quantity_value("2Gi") == 2 * 2**30
    assert quantity_value("500m") * 2 == 1
    assert quantity_value("http") is None
    assert differences({"cpu": "1"}, {"cpu": "1000m"}) == []
    assert differences({"gpu": 2}, {"gpu": "2"}) == []
    assert differences({"memory": "1Gi"}, {"memory": "1G"}) == [".memory"]
    assert differences({"flag": True}, {"flag": "True"}) == [".flag"]


def test_replicas_set_through_the_scale_subresource_belong_to_that_manager() -> None:
    live = applied(manifests()[0])
    assert not scaled_by_others(live)
    live["metadata"]["managedFields"].append(
        {
            "manager": "kube-controller-manager",
            "operation": "Update",
            "subresource": "scale",
            "fieldsV1": {"f:spec": {"f:replicas": {}}},
        }
    )
    assert scaled_by_others(live)
    edited = applied(manifests()[0])
    edited["metadata"]["managedFields"].append(
        {
            "manager": "kubectl-edit",
            "operation": "Update",
            "fieldsV1": {"f:spec": {"f:replicas": {}}},
        }
    )
    assert not scaled_by_others(edited)  # an edit of the whole object is drift, repaired


def test_promised_surge_pods_take_their_gpus_from_the_headroom() -> None:
    nodes = {"a": {"nvidia.com/gpu": 8}, "b": {"nvidia.com/gpu": 8}}
    used = {"a": [{"nvidia.com/gpu": 4}], "b": [{"nvidia.com/gpu": 4}]}
    assert spare_gpus(nodes, used) == {"nvidia.com/gpu": 4}
    assert spare_gpus(nodes, used, [{"nvidia.com/gpu": 4}]) == {"nvidia.com/gpu": 4}
    assert spare_gpus(nodes, used, [{"nvidia.com/gpu": 4}] * 2) == {"nvidia.com/gpu": 0}
