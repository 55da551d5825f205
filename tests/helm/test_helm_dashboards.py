"""The Grafana dashboards in helm/infernetes/dashboards/: each panel's query names only series the
runtime or the operator exports, and the chart ships every dashboard as a sidecar ConfigMap.

(e2e/test_prometheus_scrape.py runs every query against a real Prometheus scraping a runtime.)
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry

HERE = Path(__file__).parent
CHART = HERE.parents[1] / "helm" / "infernetes"
DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))

# PromQL words that are not metric names: aggregations and their modifiers, set and comparison
# operators, functions (those the dashboards may call), and Grafana's variables.
KEYWORDS = {
    "sum", "min", "max", "avg", "count", "topk", "bottomk", "quantile", "stddev", "stdvar",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset",
}  # fmt: skip
IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", ())  # a collapsed row holds its panels


def expressions(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for panel in panels(board) for t in panel.get("targets", ()) if "expr" in t]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    Strings, label matchers (`{...}`), grouping lists (`by (...)`), ranges (`[...]`) and
    numbers are removed first; what is left is names, keywords and functions (a name followed by
    `(`).
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", text)
    names = set()
    for match in IDENTIFIER.finditer(text):
        word = match.group()
        before = text[match.start() - 1] if match.start() else " "
        if before.isdigit() or before == ".":  # part of a number such as 0.99 or 1e3
            continue
        if word in KEYWORDS or re.match(r"\s*\(", text[match.end() :]):
            continue
        names.add(word)
    return names


def exported(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry's /metrics can carry, from each family's type (labelled
    families have no samples until their first child, so samples alone would miss them)."""
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("", "_sum", "_count"),
    }
    return {
        family.name + suffix
        for family in registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def runtime_series() -> set[str]:
    from infernetes.runtime.server.metrics import PrometheusStatLogger

    logger = PrometheusStatLogger("m", 4096, registry=CollectorRegistry(), max_loras=1)
    return exported(logger.registry)


def operator_series() -> set[str]:
    from infernetes.operator import metrics  # noqa: F401  (registers the operator's metrics)

    return exported(REGISTRY)


def test_metric_names_are_parsed_from_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, service) (rate(vllm:ttft_bucket{model_name=~"a|b",'
        ' service="x"}[$__rate_interval]))) / on (pod) group_left max(up) or vector(0)'
    )
    assert metric_names(expr) == {"vllm:ttft_bucket", "up"}
    assert metric_names('count(a{x="sum(b)"} offset 5m) and bool c > 1e3') == {"a", "c"}


def test_runtime_series_derive_from_the_registry() -> None:
    names = runtime_series()
    assert {"vllm:prompt_tokens_total", "vllm:e2e_request_latency_seconds_bucket"} <= names
    assert "vllm:num_requests_running" in names and "vllm:prompt_tokens" not in names


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_panel_names_only_exported_series(path: Path) -> None:
    board = json.loads(path.read_text())
    known = runtime_series() | operator_series()
    used = {name for expr in expressions(board) for name in metric_names(expr)}
    assert used, f"{path.name}: no queries"
    assert used <= known, f"{path.name}: not exported: {sorted(used - known)}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_panel_has_a_query_and_unique_ids(path: Path) -> None:
    board = json.loads(path.read_text())
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids))
    for panel in panels(board):
        if panel["type"] != "row":
            assert panel.get("targets"), f"{path.name}: {panel['title']} has no query"
    variables = {v["name"] for v in board["templating"]["list"]}
    assert "datasource" in variables
    for expr in expressions(board):
        assert set(re.findall(r"\$(\w+)", expr)) <= variables | {"__rate_interval"}, expr


def test_serving_dashboard_filters_by_namespace_service_and_model() -> None:
    board = json.loads((CHART / "dashboards" / "serving.json").read_text())
    assert {"namespace", "service", "model"} <= {v["name"] for v in board["templating"]["list"]}
    for expr in expressions(board):
        assert 'namespace=~"$namespace"' in expr and 'service=~"$service"' in expr, expr


def configmaps(helm_bin: Path, *values: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(helm_bin), "template", "infernetes", str(CHART), *values],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc and doc["kind"] == "ConfigMap"]


def test_chart_ships_each_dashboard_as_a_sidecar_configmap(helm_bin: Path) -> None:
    assert configmaps(helm_bin) == []  # off by default
    maps = configmaps(
        helm_bin, "--set", "dashboards.enabled=true", "--set", "dashboards.folder=LLM serving"
    )
    assert len(maps) == len(DASHBOARDS)
    for configmap in maps:
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["metadata"]["annotations"] == {"grafana_folder": "LLM serving"}
        ((key, text),) = configmap["data"].items()
        shipped = CHART / "dashboards" / key.removeprefix("infernetes-")
        assert json.loads(text) == json.loads(shipped.read_text())
