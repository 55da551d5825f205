"""`infernetes operator crd|rbac|render|run`: the Kubernetes side of infernetes.

Only the standard library is imported at module level; yaml, kopf and the kubernetes client are
imported inside the subcommands that need them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "operator",
        help="The InferenceService operator: print its CRD and RBAC, render manifests, run it.",
        description="The InferenceService operator: print its CRD and RBAC, render manifests, run it.",
    )
    commands = parser.add_subparsers(dest="operator_command", metavar="{crd,rbac,render,run}")
    parser.set_defaults(func=lambda args: _usage(parser))

    crd = commands.add_parser("crd", help="Print the CustomResourceDefinitions as YAML.")
    crd.add_argument(
        "--with-peering",
        action="store_true",
        help="Also print kopf's peering CRDs (for several operator replicas).",
    )
    crd.set_defaults(func=_crd)

    rbac = commands.add_parser(
        "rbac", help="Print the operator's ServiceAccount and least-privilege RBAC as YAML."
    )
    rbac.add_argument(
        "--namespace", default="infernetes-system", help="Namespace the operator runs in."
    )
    rbac.add_argument("--service-account", default="infernetes-operator")
    rbac.set_defaults(func=_rbac)

    render = commands.add_parser(
        "render",
        help="Print the objects the operator would create for InferenceService YAML (like helm template).",
    )
    render.add_argument(
        "-f", "--filename", required=True, help="InferenceService YAML file, or - for stdin."
    )
    render.add_argument(
        "-n", "--namespace", default=None, help="Namespace when the resource names none (default)."
    )
    render.add_argument(
        "--api-versions",
        action="append",
        default=[],
        metavar="GROUP/VERSION[/KIND]",
        help="Optional APIs the cluster serves, e.g. monitoring.coreos.com/v1 or keda.sh/v1alpha1 "
        "(comma-separated or repeated).",
    )
    render.add_argument(
        "--spare-gpus",
        action="append",
        default=[],
        metavar="RESOURCE=N",
        help="Most GPUs free on one node, e.g. nvidia.com/gpu=8 (decides rollout: Auto).",
    )
    render.set_defaults(func=_render)

    run = commands.add_parser(
        "run", help="Run the operator (kopf) against the current kubeconfig or in-cluster."
    )
    run.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="Watch only this namespace (repeatable); default all.",
    )
    run.add_argument(
        "--peering", default=None, help="kopf peering name, so several replicas take turns."
    )
    run.add_argument("--standalone", action="store_true", help="Run without peering.")
    run.add_argument(
        "--priority",
        type=int,
        default=None,
        help="Peering priority: the highest one works, the others wait (default: random, so replicas differ).",
    )
    run.add_argument(
        "--metrics-port", type=int, default=8080, help="Port of /metrics (0 turns it off)."
    )
    run.add_argument(
        "--health-port", type=int, default=8081, help="Port of /healthz (0 turns it off)."
    )
    run.add_argument(
        "--bind-address", default="0.0.0.0", help="Address of the metrics and health servers."
    )
    run.add_argument("--image", default=None, help="Image of the server when spec.image is unset.")
    run.add_argument("--verbose", action="store_true", help="Debug logging.")
    run.set_defaults(func=_run)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _crd(args: argparse.Namespace) -> int:
    from infernetes.operator.crd import build_crd, dump_yaml
    from infernetes.operator.peering import peering_crds

    documents = [build_crd()] + (peering_crds() if args.with_peering else [])
    sys.stdout.write(dump_yaml(documents))
    return 0


def _rbac(args: argparse.Namespace) -> int:
    from infernetes.operator.crd import dump_yaml
    from infernetes.operator.rbac import rbac_manifests

    sys.stdout.write(
        dump_yaml(rbac_manifests(namespace=args.namespace, service_account=args.service_account))
    )
    return 0


def _fail(message: str) -> int:
    print(f"infernetes operator render: error: {message}", file=sys.stderr)
    return 2


def _render(args: argparse.Namespace) -> int:
    import yaml

    from infernetes.operator.argv import EngineSpecError
    from infernetes.operator.crd import dump_yaml
    from infernetes.operator.facts import ClusterFacts
    from infernetes.operator.names import API_VERSION, KIND
    from infernetes.operator.render import plan

    try:
        text = (
            sys.stdin.read()
            if args.filename == "-"
            else Path(args.filename).read_text(encoding="utf-8")
        )
        documents = [doc for doc in yaml.safe_load_all(text) if doc]
    except OSError as exc:
        return _fail(f"-f {args.filename}: {exc.strerror}")
    except yaml.YAMLError as exc:
        return _fail(f"-f {args.filename}: not valid YAML: {exc}")
    try:
        entries = [item for value in args.api_versions for item in value.split(",")]
        spare = {}
        for item in args.spare_gpus:
            resource, sep, count = item.partition("=")
            if not sep or not count.isdigit():
                return _fail(
                    f"--spare-gpus: expected RESOURCE=N such as nvidia.com/gpu=8, got {item!r}"
                )
            spare[resource] = int(count)
        facts = ClusterFacts.from_api_versions(
            entries, spare_gpus=spare if args.spare_gpus else None
        )
    except ValueError as exc:
        return _fail(str(exc))
    output: list[dict] = []
    for doc in documents:
        if (
            not isinstance(doc, dict)
            or doc.get("kind") != KIND
            or doc.get("apiVersion") != API_VERSION
        ):
            return _fail(f"expected kind {KIND} with apiVersion {API_VERSION} in {args.filename}")
        metadata = doc.get("metadata") or {}
        if not metadata.get("name"):
            return _fail("metadata.name is required")
        spec = doc.get("spec") or {}
        if not spec.get("model"):
            return _fail(f"{metadata['name']}: spec.model is required")
        namespace = metadata.get("namespace") or args.namespace or "default"
        try:
            result = plan(spec, facts, name=metadata["name"], namespace=namespace)
            output.extend(result.manifests)
            for warning in result.warnings:
                print(f"warning: {metadata['name']}: {warning}", file=sys.stderr)
            if result.blocked:
                print(f"warning: {metadata['name']}: {': '.join(result.blocked)}", file=sys.stderr)
            if result.autoscaling and result.autoscaling[0] == "False":
                _, reason, message = result.autoscaling
                print(f"warning: {metadata['name']}: {reason}: {message}", file=sys.stderr)
            for refused in result.refused:
                print(
                    f"warning: {metadata['name']}: {refused}; kubectl apply will reject it",
                    file=sys.stderr,
                )
        except (EngineSpecError, KeyError, TypeError, ValueError) as exc:
            return _fail(f"{metadata['name']}: {exc}")
    sys.stdout.write(dump_yaml(output).split("\n", 1)[1])
    return 0


def _run(args: argparse.Namespace) -> int:
    from infernetes.operator.main import OperatorOptions, run_operator

    options = OperatorOptions(
        namespaces=tuple(args.namespace),
        peering=args.peering,
        standalone=args.standalone or args.peering is None,
        priority=args.priority,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        bind_address=args.bind_address,
        image=args.image,
        verbose=args.verbose,
    )
    return run_operator(options)
