"""The scheduler, controllers and kwok together: GPU requests are scheduled onto the fake nodes'
`nvidia.com/gpu` capacity, and a request no node can satisfy stays Pending with an event."""

from __future__ import annotations

from localcluster import LocalCluster, wait_for


def _gpu_deployment(name: str, gpus: int, replicas: int) -> dict:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "containers": [
                        {
                            "name": "server",
                            "image": "registry.invalid/infernetes:test",
                            "resources": {
                                "requests": {"nvidia.com/gpu": str(gpus), "cpu": "1"},
                                "limits": {"nvidia.com/gpu": str(gpus)},
                            },
                        }
                    ],
                },
            },
        },
    }


def test_gpu_deployment_becomes_available_on_fake_nodes(
    cluster: LocalCluster, namespace: str
) -> None:
    cluster.apply(_gpu_deployment("two-gpus", gpus=2, replicas=2), namespace=namespace)
    cluster.kubectl(
        "wait", "--for=condition=Available", "deployment/two-gpus", "-n", namespace, "--timeout=90s"
    )

    pods = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", "app=two-gpus")["items"]
    assert len(pods) == 2
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"] in cluster.nodes
        ready = [c for c in pod["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True"
    deployment = cluster.kubectl_json("get", "deployment", "two-gpus", "-n", namespace)
    assert deployment["status"]["availableReplicas"] == 2


def test_more_gpus_than_any_node_has_stays_pending_with_an_event(
    cluster: LocalCluster, namespace: str
) -> None:
    cluster.apply(_gpu_deployment("sixteen-gpus", gpus=16, replicas=1), namespace=namespace)

    def failed_scheduling_event() -> dict | None:
        events = cluster.kubectl_json(
            "get", "events", "-n", namespace, "--field-selector", "reason=FailedScheduling"
        )["items"]
        return events[0] if events else None

    event = wait_for(failed_scheduling_event, timeout=60, what="a FailedScheduling event")
    assert event["involvedObject"]["kind"] == "Pod"
    assert "Insufficient nvidia.com/gpu" in event["message"]

    pod = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", "app=sixteen-gpus")["items"][0]
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")
    scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    deployment = cluster.kubectl_json("get", "deployment", "sixteen-gpus", "-n", namespace)
    assert not deployment["status"].get("availableReplicas")
