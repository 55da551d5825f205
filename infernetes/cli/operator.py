"""`infernetes operator crd|rbac|render|run`: the Kubernetes side of infernetes.

Only the standard library is imported at module level; yaml, kopf and the kubernetes client are
imported inside the subcommands that need them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infernetes.operator.facts import ClusterFacts
    from infernetes.operator.render import Plan


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "operator",
        help="The InferenceService operator: print its CRD and RBAC, render manifests, run it.",
        description="The InferenceService operator: print its CRD and RBAC, render manifests, run it.",
    )
    commands = parser.add_subparsers(dest="operator_command", metavar="{crd,rbac,render,run}")
    parser.set_defaults(func=lambda args: _usage(parser))
    _add_crd(commands)
    _add_rbac(commands)
    _add_render(commands)
    _add_run(commands)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _add_crd(commands: Any) -> None:
    crd = commands.add_parser("crd", help="Print the CustomResourceDefinitions as YAML.")
    crd.add_argument(
        "--with-peering",
        action="store_true",
        help="Also print kopf's peering CRDs (for several operator replicas).",
    )
    crd.set_defaults(func=_crd)


def _crd(args: argparse.Namespace) -> int:
    from infernetes.operator.crd import build_crd, dump_yaml
    from infernetes.operator.peering import peering_crds

    documents = [build_crd()] + (peering_crds() if args.with_peering else [])
    sys.stdout.write(dump_yaml(documents))
    return 0


def _add_rbac(commands: Any) -> None:
    rbac = commands.add_parser(
        "rbac", help="Print the operator's ServiceAccount and least-privilege RBAC as YAML."
    )
    rbac.add_argument(
        "--namespace", default="infernetes-system", help="Namespace the operator runs in."
    )
    rbac.add_argument("--service-account", default="infernetes-operator")
    rbac.set_defaults(func=_rbac)


def _rbac(args: argparse.Namespace) -> int:
    from infernetes.operator.crd import dump_yaml
    from infernetes.operator.rbac import rbac_manifests

    sys.stdout.write(
        dump_yaml(rbac_manifests(namespace=args.namespace, service_account=args.service_account))
    )
    return 0


def _add_render(commands: Any) -> None:
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


class _RenderError(Exception):
    """Why render stops; _render prints it once, as argparse prints a usage error."""


def _fail(message: str) -> int:
    print(f"infernetes operator render: error: {message}", file=sys.stderr)
    return 2


def _render(args: argparse.Namespace) -> int:
    from infernetes.operator.crd import dump_yaml

    try:
        documents = _read_documents(args.filename)
        facts = _cluster_facts(args.api_versions, args.spare_gpus)
        output: list[dict] = []
        for document in documents:
            output.extend(_render_resource(document, facts, args))
    except _RenderError as exc:
        return _fail(str(exc))
    sys.stdout.write(dump_yaml(output).split("\n", 1)[1])
    return 0


def _read_documents(filename: str) -> list[Any]:
    """The non-empty YAML documents of -f (a file, or - for stdin)."""
    import yaml

    try:
        text = sys.stdin.read() if filename == "-" else Path(filename).read_text(encoding="utf-8")
        return [doc for doc in yaml.safe_load_all(text) if doc]
    except OSError as exc:
        raise _RenderError(f"-f {filename}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise _RenderError(f"-f {filename}: not valid YAML: {exc}") from exc


def _cluster_facts(api_versions: list[str], spare_gpus: list[str]) -> ClusterFacts:
    """The cluster that --api-versions and --spare-gpus describe."""
    from infernetes.operator.facts import ClusterFacts

    entries = [item for value in api_versions for item in value.split(",")]
    try:
        return ClusterFacts.from_api_versions(entries, spare_gpus=_spare_gpus(spare_gpus))
    except ValueError as exc:
        raise _RenderError(str(exc)) from exc


def _spare_gpus(items: list[str]) -> dict[str, int] | None:
    """--spare-gpus RESOURCE=N, repeated; None when not given, as the operator's default."""
    if not items:
        return None
    spare = {}
    for item in items:
        resource, sep, count = item.partition("=")
        if not sep or not count.isdigit():
            raise _RenderError(
                f"--spare-gpus: expected RESOURCE=N such as nvidia.com/gpu=8, got {item!r}"
            )
        spare[resource] = int(count)
    return spare


def _render_resource(
    document: Any, facts: ClusterFacts, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """One InferenceService's manifests; what the operator would say about them goes to stderr."""
    from infernetes.operator.argv import EngineSpecError
    from infernetes.operator.render import plan

    metadata, spec = _checked(document, args.filename)
    name = metadata["name"]
    namespace = metadata.get("namespace") or args.namespace or "default"
    try:
        result = plan(spec, facts, name=name, namespace=namespace)
    except (EngineSpecError, KeyError, TypeError, ValueError) as exc:
        raise _RenderError(f"{name}: {exc}") from exc
    for warning in _warnings(result):
        print(f"warning: {name}: {warning}", file=sys.stderr)
    return result.manifests


def _checked(document: Any, filename: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The metadata and spec of an InferenceService with a name and a model (what the CRD
    requires of it)."""
    from infernetes.operator.names import API_VERSION, KIND

    if (
        not isinstance(document, dict)
        or document.get("kind") != KIND
        or document.get("apiVersion") != API_VERSION
    ):
        raise _RenderError(f"expected kind {KIND} with apiVersion {API_VERSION} in {filename}")
    metadata = document.get("metadata") or {}
    if not metadata.get("name"):
        raise _RenderError("metadata.name is required")
    spec = document.get("spec") or {}
    if not spec.get("model"):
        raise _RenderError(f"{metadata['name']}: spec.model is required")
    if unknown := _undeclared(spec):
        raise _RenderError(f"{metadata['name']}: {'; '.join(unknown)}")
    return metadata, spec


def _undeclared(spec: dict[str, Any]) -> list[str]:
    """spec's fields the CRD does not declare, as `kubectl apply` names them, with the
    nearest declared name where one is close."""
    import difflib

    from infernetes.operator.crd import spec_schema
    from infernetes.operator.openapi import undeclared_fields

    messages = []
    for path, declared in undeclared_fields(spec, spec_schema(), "spec"):
        close = difflib.get_close_matches(path.rsplit(".", 1)[-1], declared, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        messages.append(f"{path}: field not declared in schema{hint}")
    return messages


def _warnings(result: Plan) -> list[str]:
    """What the operator would tell in status and events: adjustments and ignored settings, a
    workload it cannot create here, an autoscaler it cannot make, settings the API refuses."""
    warnings = list(result.warnings)
    if result.blocked:
        warnings.append(": ".join(result.blocked))
    if result.autoscaling and result.autoscaling[0] == "False":
        _, reason, message = result.autoscaling
        warnings.append(f"{reason}: {message}")
    warnings.extend(f"{refused}; kubectl apply will reject it" for refused in result.refused)
    return warnings


def _add_run(commands: Any) -> None:
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
    run.add_argument(
        "--otlp-traces-endpoint",
        default=None,
        help="OTLP collector the servers send request traces to when "
        "spec.engine.otlpTracesEndpoint is unset.",
    )
    run.add_argument("--verbose", action="store_true", help="Debug logging.")
    run.set_defaults(func=_run)


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
        otlp_traces_endpoint=args.otlp_traces_endpoint,
        verbose=args.verbose,
    )
    return run_operator(options)
