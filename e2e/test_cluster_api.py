"""The local control plane is a real API server: versions, fake GPU nodes, CRD schema admission,
server-side apply, garbage collection, service-account tokens and RBAC."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from kubernetes import client
from localcluster import CLUSTER_DIR, KubectlError, LocalCluster, wait_for


def _pinned_versions() -> dict[str, str]:
    lines = (CLUSTER_DIR / "versions.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_cluster_reports_the_pinned_kubernetes_version(cluster: LocalCluster) -> None:
    versions = cluster.kubectl_json("version")
    pinned = _pinned_versions()["KUBERNETES_VERSION"]
    assert versions["serverVersion"]["gitVersion"] == pinned
    assert versions["clientVersion"]["gitVersion"] == pinned
    assert versions["serverVersion"]["minor"] == pinned.split(".")[1]


def test_fake_nodes_are_ready_with_gpu_capacity_and_labels(cluster: LocalCluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in cluster.kubectl_json("get", "nodes")["items"]}
    assert set(cluster.nodes) <= set(nodes)
    for name in cluster.nodes:
        node = nodes[name]
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", node["status"]["conditions"]
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"


def _widget_crd(group: str) -> dict:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["replicas"],
                "properties": {
                    "replicas": {"type": "integer", "minimum": 1, "maximum": 10},
                    "mode": {"type": "string", "enum": ["fast", "careful"]},
                    "minReplicas": {"type": "integer"},
                },
                "x-kubernetes-validations": [
                    {
                        "rule": "!has(self.minReplicas) || self.minReplicas <= self.replicas",
                        "message": "minReplicas must not exceed replicas",
                    }
                ],
            }
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def test_crd_with_structural_schema_is_enforced_by_the_api_server(
    cluster: LocalCluster, namespace: str
) -> None:
    group = f"e2e{uuid.uuid4().hex[:6]}.infernetes.io"
    crd = _widget_crd(group)
    cluster.apply(crd)
    try:
        cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/widgets.{group}", "--timeout=60s"
        )

        def widget(name: str, spec: dict) -> dict:
            return {
                "apiVersion": f"{group}/v1",
                "kind": "Widget",
                "metadata": {"name": name},
                "spec": spec,
            }

        # The CRD's discovery may lag its Established condition by a moment.
        wait_for(
            lambda: (
                cluster.apply(
                    widget("good", {"replicas": 3, "mode": "fast"}),
                    namespace=namespace,
                    check=False,
                ).returncode
                == 0
            ),
            timeout=30,
            what="a valid Widget to be accepted",
        )
        stored = cluster.kubectl_json("get", f"widgets.{group}", "good", "-n", namespace)
        assert stored["spec"] == {"replicas": 3, "mode": "fast"}

        rejected = {
            "spec.replicas": {"replicas": 11},
            "spec.mode": {"replicas": 1, "mode": "reckless"},
            "minReplicas must not exceed replicas": {"replicas": 2, "minReplicas": 5},
        }
        for expected, spec in rejected.items():
            with pytest.raises(KubectlError) as error:
                cluster.apply(widget("bad", spec), namespace=namespace)
            assert "is invalid" in str(error.value)
            assert expected in str(error.value)
        missing = cluster.kubectl("get", f"widgets.{group}", "bad", "-n", namespace, check=False)
        assert missing.returncode != 0 and "NotFound" in missing.stderr
    finally:
        cluster.kubectl("delete", "crd", f"widgets.{group}", "--wait=false", check=False)


def test_server_side_apply_tracks_the_field_manager(cluster: LocalCluster, namespace: str) -> None:
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": namespace},
        "data": {"level": "info"},
    }
    cluster.apply(config_map, server_side=True, field_manager="infernetes")
    stored = cluster.kubectl_json(
        "get", "configmap", "settings", "-n", namespace, "--show-managed-fields"
    )
    managers = {(m["manager"], m["operation"]) for m in stored["metadata"]["managedFields"]}
    assert ("infernetes", "Apply") in managers

    # Another manager changing a field that "infernetes" owns is a conflict ...
    config_map["data"] = {"level": "debug"}
    with pytest.raises(KubectlError) as error:
        cluster.apply(config_map, server_side=True, field_manager="someone-else")
    assert "conflict" in str(error.value).lower()
    # ... until it forces, which moves ownership of the field.
    cluster.kubectl(
        "apply",
        "--server-side",
        "--field-manager=someone-else",
        "--force-conflicts",
        "-f",
        "-",
        input=json.dumps(config_map),
    )
    stored = cluster.kubectl_json(
        "get", "configmap", "settings", "-n", namespace, "--show-managed-fields"
    )
    assert stored["data"] == {"level": "debug"}
    owners = {
        m["manager"]
        for m in stored["metadata"]["managedFields"]
        if "f:level" in json.dumps(m.get("fieldsV1", {}))
    }
    assert owners == {"someone-else"}


def test_deleting_an_owner_garbage_collects_its_children(api_client, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    owner = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    reference = client.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
    )
    for i in range(2):
        core.create_namespaced_secret(
            namespace,
            client.V1Secret(
                metadata=client.V1ObjectMeta(name=f"child-{i}", owner_references=[reference]),
                string_data={"k": "v"},
            ),
        )
    unowned = core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="unowned"))
    )

    core.delete_namespaced_config_map("owner", namespace)

    wait_for(
        lambda: (
            not [
                s
                for s in core.list_namespaced_secret(namespace).items
                if s.metadata.name.startswith("child-")
            ]
        ),
        timeout=60,
        what="the garbage collector to delete the owned Secrets",
    )
    assert core.read_namespaced_secret("unowned", namespace).metadata.uid == unowned.metadata.uid


def test_service_account_tokens_authenticate_and_rbac_authorizes(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    token = cluster.kubectl("create", "token", "default", "-n", namespace).stdout.strip()
    # An empty kubeconfig: only the token may identify the caller, not the admin certificate.
    empty_kubeconfig = tmp_path / "kubeconfig"
    empty_kubeconfig.write_text("")
    as_service_account = [
        f"--kubeconfig={empty_kubeconfig}",
        f"--server={cluster.server}",
        f"--certificate-authority={cluster.ca_cert}",
        f"--token={token}",
    ]
    whoami = cluster.kubectl_json(*as_service_account, "auth", "whoami")
    assert whoami["status"]["userInfo"]["username"] == (
        f"system:serviceaccount:{namespace}:default"
    )
    # RBAC is on: the default service account may do nothing until a binding says so.
    can_list = cluster.kubectl(
        *as_service_account, "auth", "can-i", "list", "secrets", "-n", namespace, check=False
    )
    assert can_list.stdout.strip() == "no"
    cluster.kubectl(
        "create",
        "rolebinding",
        "view",
        "--clusterrole=view",
        f"--serviceaccount={namespace}:default",
        "-n",
        namespace,
    )
    wait_for(
        lambda: (
            cluster.kubectl(
                *as_service_account, "auth", "can-i", "list", "pods", "-n", namespace, check=False
            ).stdout.strip()
            == "yes"
        ),
        timeout=30,
        what="the RoleBinding to take effect",
    )


def _chart(directory: Path, kube_version: str) -> Path:
    chart = directory / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        f"apiVersion: v2\nname: probe\nversion: 0.1.0\nkubeVersion: '{kube_version}'\n"
    )
    (chart / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: probe\n"
        "data:\n  server: '{{ .Capabilities.KubeVersion.Version }}'\n"
    )
    return chart


def test_helm_sees_the_real_server_version(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    pinned = _pinned_versions()["KUBERNETES_VERSION"]
    minor = int(pinned.split(".")[1])
    fitting = _chart(tmp_path / "fits", f">=1.{minor}.0-0 <1.{minor + 1}.0-0")
    installed = cluster.helm("install", "probe", str(fitting), "-n", namespace, "--wait")
    assert "STATUS: deployed" in installed.stdout
    stored = cluster.kubectl_json("get", "configmap", "probe", "-n", namespace)
    assert stored["data"]["server"] == pinned

    too_new = _chart(tmp_path / "too-new", f">=1.{minor + 1}.0-0")
    refused = cluster.helm("install", "probe2", str(too_new), "-n", namespace, check=False)
    assert refused.returncode != 0
    assert "incompatible with Kubernetes" in refused.stderr
