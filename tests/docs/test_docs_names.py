"""Every metric and benchmark the docs name exists.

Metrics: a `vllm:` series the docs name (`vllm:num_requests_waiting`, a counter's sample
`vllm:prefix_cache_hits_total`, a family `vllm:mm_cache_*`) is one the runtime declares, and an
`infernetes_operator_` series one operator/metrics.py declares. A name is found by reading the
source for the string that declares it (an f-string's fields stand for any word), never by
importing it, as test_docs_paths looks names up.

Benchmarks: every name in the first column of docs/architecture.md's table of benchmarks
(`python -m bench engine_throughput`, `spec_decode`, ...) is a module of bench/.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Named in the docs as vLLM's series that this server does not export (docs/disaggregation.md).
NOT_EXPORTED = {"vllm:nixl_num_kv_expired_reqs"}

# What prometheus_client appends to a family's name in its samples.
SAMPLE_SUFFIXES = ("", "_total", "_created", "_bucket", "_sum", "_count")

METRIC = re.compile(r"(?<![\w:])(vllm:[a-z_]+\*?|infernetes_operator_[a-z_]+\*?)")
DECLARED = re.compile(r"""f?["']((?:vllm:|infernetes_operator_)[^"'\s]*)["']""")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def name_pattern(declaring: str) -> re.Pattern[str]:
    """The names a declaring string makes: an f-string's `{field}` stands for any word."""
    parts = re.split(r"(\{[^}]*\})", declaring)
    return re.compile("".join(r"\w+" if p.startswith("{") else re.escape(p) for p in parts))


@cache
def declared(kind: str) -> tuple[tuple[str, re.Pattern[str]], ...]:
    """(declaring string, its names' pattern) for each `vllm:` series the runtime declares, or
    each `infernetes_operator_` series of operator/metrics.py."""
    if kind == "vllm:":
        sources = sorted((ROOT / "runtime").rglob("*.py"))
    else:
        sources = [ROOT / "operator" / "metrics.py"]
    found = {text for path in sources for text in DECLARED.findall(path.read_text("utf-8"))}
    return tuple((text, name_pattern(text)) for text in sorted(found) if text.startswith(kind))


def is_declared(name: str) -> bool:
    kind = "vllm:" if name.startswith("vllm:") else "infernetes_operator_"
    if name.endswith("*"):
        return any(text.startswith(name[:-1]) for text, _ in declared(kind))
    return any(
        pattern.fullmatch(name.removesuffix(suffix))
        for _, pattern in declared(kind)
        for suffix in SAMPLE_SUFFIXES
        if name.endswith(suffix)
    )


def metric_names(text: str) -> set[str]:
    return set(METRIC.findall(text))


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_only_exported_metrics(doc: Path) -> None:
    names = metric_names(doc.read_text(encoding="utf-8")) - NOT_EXPORTED
    assert sorted(name for name in names if not is_declared(name)) == []


def test_what_the_docs_call_not_exported_is_not_declared() -> None:
    assert [name for name in NOT_EXPORTED if is_declared(name)] == []


def test_metric_names_are_matched_as_prometheus_writes_them() -> None:
    assert is_declared("vllm:num_requests_waiting")
    assert is_declared("vllm:prefix_cache_hits_total")  # a counter's sample
    assert is_declared("vllm:time_to_first_token_seconds_bucket")
    assert is_declared("vllm:kv_offload_store_bytes_total")  # declared by an f-string
    assert is_declared("vllm:mm_cache_*")
    assert is_declared("infernetes_operator_reconciles_total")
    assert not is_declared("vllm:no_such_metric")
    assert not is_declared("vllm:num_requests_wait")
    assert not is_declared("infernetes_operator_no_such_total")
    assert metric_names("`vllm:a_total` and (`vllm:(b|c)`, `x_vllm:d`)") == {"vllm:a_total"}


def benchmark_table_names() -> list[str]:
    """The backticked names in the first column of architecture.md's table of benchmarks."""
    names = []
    for line in (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("| `python -m bench "):
            first = line.split("|")[1]
            for span in re.findall(r"`([^`]+)`", first):
                names.append(span.removeprefix("python -m bench ").split(" ")[0])
    return names


def test_the_benchmark_table_names_modules_of_bench() -> None:
    names = benchmark_table_names()
    assert len(names) > 10
    modules = {p.stem for p in (ROOT / "bench").glob("*.py") if not p.stem.startswith("_")}
    assert sorted(set(names) - modules) == []
