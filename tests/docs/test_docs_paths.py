"""Every path, module, name and command the docs mention exists in the tree.

The docs (README.md, docs/**/*.md, READMEs under examples/ and helm/) name code in backticks:
file paths (`runtime/engine/scheduler.py`, or `render/autoscaling.py` under its package),
dotted names (`infernetes.runtime.engine.scheduler`, `drift.stale_fields`,
`Scheduler.update_from_output`, `infernetes.cli.main:main`), `make` targets, `python -m bench
NAME`, `python -m MODULE` and `infernetes SUBCOMMAND`. Code blocks are read for the commands.
A name is looked up by reading files, never by importing them (no torch here, and a stale name
must fail, not import something heavy): a module is its file, an attribute is a `def`, `class`,
assignment or import of that name in it.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The import namespace onto the top-level folders (setup.py's FOLDERS).
PACKAGES = {
    "infernetes.runtime": "runtime",
    "infernetes.operator": "operator",
    "infernetes.kernels": "kernels",
    "infernetes": "infernetes",
    "bench": "bench",
}

# Paths made at run time, not kept in the tree.
MADE_AT_RUN_TIME = (".cluster/", ".venv", "$OUT")

# File types a backticked name without a slash is checked for; `config.json`,
# `adapter_model.safetensors` and the like are the model's files, not the repo's.
BARE_FILE_SUFFIXES = (".py", ".sh", ".md", ".yaml", ".toml")

# `vllm.entrypoints...` is vLLM's module, not schema/groups/vllm.py.
OTHER_PROJECTS = {"vllm", "torch", "transformers", "triton", "kopf", "kubernetes", "numpy"}

# `status.warnings`, `spec.replicas`: an InferenceService's fields (camelCase, never an
# underscore), not operator/status.py's names.
RESOURCE_FIELDS = {"spec", "status", "metadata"}

SKIP_DIRS = {".git", ".venv", ".venv-lmeval", "node_modules", "__pycache__", ".cluster"}


def doc_files() -> list[Path]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in ("examples", "helm"):
        docs += sorted((ROOT / folder).rglob("README*.md"))
    return docs


@cache
def repo_files() -> tuple[str, ...]:
    found = []
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in parts):
            continue
        found.append("/".join(parts) + ("/" if path.is_dir() else ""))
    return tuple(found)


def top_level() -> set[str]:
    return {name.split("/")[0] for name in repo_files()}


def path_exists(path: str) -> bool:
    """A path from the root, or a path under some folder (`render/autoscaling.py`)."""
    path = path.rstrip("/")
    if (ROOT / path).exists():
        return True
    return any(f.rstrip("/").endswith("/" + path) for f in repo_files())


def module_file(dotted: str) -> Path | None:
    """The file of an importable module of ours, or None."""
    for prefix, folder in PACKAGES.items():
        if dotted == prefix or dotted.startswith(prefix + "."):
            rest = dotted[len(prefix) :].lstrip(".").replace(".", "/")
            base = ROOT / folder / rest
            if rest and base.with_suffix(".py").is_file():
                return base.with_suffix(".py")
            return base / "__init__.py" if (base / "__init__.py").is_file() else None
    return None


@cache
def source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def defines(path: Path, name: str) -> bool:
    """`path` defines, assigns, declares as a field or imports `name`."""
    name = re.escape(name)
    return bool(
        re.search(
            rf"^\s*(async\s+def|def|class)\s+{name}\b"
            rf"|^\s*(self\.)?{name}\s*(:|=[^=])"
            rf"|^\s*(from\s+\S+\s+)?import\s.*\b{name}\b"
            rf"|^\s*\(?\s*{name},"  # a name imported in parentheses, one a line
            rf"|^\s*case\s+\"{name}\"|[\"']{name}[\"']\s*:",  # a key of a table of names
            source(path),
            re.MULTILINE,
        )
    )


@cache
def python_files() -> tuple[Path, ...]:
    return tuple(
        ROOT / f
        for f in repo_files()
        if f.endswith(".py") and f.split("/")[0] in {*PACKAGES.values(), "e2e", "cluster"}
    )


def files_named(stem: str) -> list[Path]:
    """Modules whose file or package is called `stem` (`drift` -> operator/drift.py)."""
    return [
        p
        for p in python_files()
        if p.stem == stem or (p.name == "__init__.py" and p.parent.name == stem)
    ]


def classes_named(name: str) -> list[Path]:
    pattern = re.compile(rf"^class\s+{re.escape(name)}\b", re.MULTILINE)
    return [p for p in python_files() if pattern.search(source(p))]


def resolve_dotted(dotted: str) -> str | None:
    """None when `dotted` resolves, else why not. Names that are no module of ours pass."""
    dotted = dotted.replace(":", ".")
    parts = dotted.split(".")
    if parts[0] in {"infernetes", "bench"}:
        for cut in range(len(parts), 0, -1):
            found = module_file(".".join(parts[:cut]))
            if found is not None:
                break
        else:
            return f"no module {dotted}"
        rest = parts[cut:]
        if not rest:
            return None
        if len(rest) > 1 and classes_named(rest[0]):
            return None if defines(found, rest[0]) and class_has(rest[0], rest[1]) else dotted
        return None if defines(found, rest[0]) else f"{found.relative_to(ROOT)} has no {rest[0]}"
    if len(parts) < 2:
        return None
    head, attr = parts[0], parts[1]
    if head in OTHER_PROJECTS or (head in RESOURCE_FIELDS and "_" not in attr):
        return None
    if re.fullmatch(r"[a-z]+[A-Z][A-Za-z0-9]*", attr):
        return None  # `engine.maxLoras`: a resource's field (camelCase), not a Python name
    modules = files_named(head)
    if modules:
        if any(defines(m, attr) for m in modules):
            return None
        packages = [m.parent for m in modules if m.name == "__init__.py"]
        if any((p / f"{attr}.py").is_file() or (p / attr).is_dir() for p in packages):
            return None
        return f"no {attr} in {', '.join(str(m.relative_to(ROOT)) for m in modules)}"
    if head[:1].isupper() and classes_named(head):
        return None if class_has(head, attr) else f"class {head} has no {attr}"
    return None


def class_has(cls: str, attr: str) -> bool:
    return any(defines(p, attr) for p in classes_named(cls))


INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:\w+)?$")
PATHLIKE = re.compile(r"^[\w.\-/]+$")
MAKE = re.compile(r"(?:^|[\s;&|(])make\s+([a-z][\w-]*)")
BENCH = re.compile(r"python -m bench\s+([a-z]\w*)")
PYTHON_M = re.compile(r"python -m\s+([\w.]+)")
CALL = re.compile(r"^([\w.:]+)\(")
CLI = re.compile(r"(?:^|bin/)infernetes\s+([a-z][\w-]*)")


def spans(text: str) -> tuple[list[str], list[str]]:
    """(backticked spans outside code blocks, lines inside code blocks)."""
    blocks = FENCE.findall(text)
    prose = FENCE.sub("", text)
    lines = [line for block in blocks for line in block.splitlines()[1:-1]]
    return INLINE.findall(prose), lines


def check_path(span: str) -> str | None:
    span = span.rstrip(",.;")
    if span.startswith(("/", "~", "$", "http")) or not PATHLIKE.match(span):
        return None
    if span.startswith(MADE_AT_RUN_TIME):
        return None
    if "/" not in span:
        if span.endswith(BARE_FILE_SUFFIXES) and not path_exists(span):
            return f"no file {span}"
        return None
    named_file = re.search(r"\.\w+$", span) is not None
    if not (named_file or span.endswith("/") or span.split("/")[0] in top_level()):
        return None  # an API group, a model id: not a path
    if path_exists(span):
        return None
    module_attr = re.match(r"^(.*/\w+)\.(\w+)$", span)  # `models/utils.stage_layers`
    if module_attr and path_exists(module_attr[1] + ".py"):
        module = next(
            ROOT / f
            for f in repo_files()
            if f == module_attr[1] + ".py" or f.endswith("/" + module_attr[1] + ".py")
        )
        return (
            None
            if defines(module, module_attr[2])
            else f"{module_attr[1]}.py has no {module_attr[2]}"
        )
    return f"no path {span}"


@cache
def make_targets() -> frozenset[str]:
    makefile = source(ROOT / "Makefile")
    return frozenset(re.findall(r"^([\w-]+):", makefile, re.MULTILINE))


def bench_names() -> set[str]:
    return {
        p.stem if p.suffix == ".py" else p.name
        for p in (ROOT / "bench").iterdir()
        if not p.name.startswith("_") and (p.suffix == ".py" or (p / "__init__.py").is_file())
    }


def cli_subcommands() -> set[str]:
    return set(re.findall(r'^\s+"([a-z-]+)",$', source(ROOT / "infernetes/cli/main.py"), re.M))


def check_command(text: str) -> list[str]:
    problems = []
    for target in MAKE.findall(text):
        if target not in make_targets():
            problems.append(f"no make target {target}")
    for name in BENCH.findall(text):
        if name not in bench_names():
            problems.append(f"no benchmark {name}")
    for module in PYTHON_M.findall(text):
        if module.split(".")[0] in {"infernetes", "bench"} and module_file(module) is None:
            problems.append(f"no module {module}")
    for command in CLI.findall(text.strip()):
        if command not in cli_subcommands():
            problems.append(f"no subcommand infernetes {command}")
    return problems


def problems_in(text: str) -> list[str]:
    inline, code_lines = spans(text)
    found = []
    for span in inline:
        call = CALL.match(span)  # `drift.stale_fields(desired, live)`: the name called
        if " " in span.strip() and not call:
            found += check_command(span)
            continue
        name = call[1] if call else span
        for problem in (check_path(name), resolve_dotted_span(name)):
            if problem:
                found.append(f"`{span}`: {problem}")
    for line in code_lines:
        found += check_command(line)
    return found


def resolve_dotted_span(span: str) -> str | None:
    span = span.rstrip(",.;").removesuffix("()")
    if "/" in span or not DOTTED.match(span):
        return None
    if re.search(r"\.(py|md|yaml|yml|json|sh|toml|txt|env|safetensors|bin)$", span):
        return None
    return resolve_dotted(span)


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_what_exists(doc: Path) -> None:
    assert problems_in(source(doc)) == []


@pytest.mark.parametrize(
    "text",
    [
        "`runtime/engine/no_such_module.py`",
        "`infernetes.runtime.engine.no_such_module`",
        "`infernetes.runtime.engine.scheduler.NoSuchClass`",
        "`drift.no_such_function`",
        "`Scheduler.no_such_method`",
        "`make no-such-target`",
        "`python -m bench no_such_bench`",
        "```bash\nmake no-such-target\n```",
        "`infernetes no-such-command`",
        "```bash\n.venv/bin/infernetes no-such-command\n```",
        "`models/utils.no_such_function`",
    ],
)
def test_a_wrong_name_is_found(text: str) -> None:
    assert problems_in(text) != []


def test_right_names_pass() -> None:
    text = (
        "`runtime/engine/scheduler.py` `render/autoscaling.py` `infernetes.runtime.engine.scheduler`"
        " `infernetes.cli.main:main` `Scheduler.update_from_output` `drift.stale_fields`"
        " `make serve` `python -m bench soak` `infernetes serve` `config.json`"
    )
    assert problems_in(text) == []


# README's tables of what the server does, against the support table: a flag in the "works"
# table is honoured (or honoured for some values), one in "refused" or "planned" is refused (or
# the value named is), one in "no effect" has none.
README_TABLES = {
    "### What works": {"honoured", "partial"},
    "### What is refused": {"refused"},
    "### What has no effect": {"no_effect"},
    "### Planned": {"refused"},
}


def readme_flags() -> list[tuple[str, str, str | None]]:
    """(section heading, flag, value or None) for every `--flag [value]` in README's tables."""
    found = []
    heading = None
    for line in source(ROOT / "README.md").splitlines():
        if line.startswith("#"):
            heading = next((h for h in README_TABLES if line.startswith(h)), None)
        elif heading and line.startswith("|"):
            for span in INLINE.findall(line):
                if span.startswith("--"):
                    flag, _, value = span.partition(" ")
                    found.append((heading, flag, value or None))
    return found


def support_kind(flag: str, value: str | None) -> str:
    from infernetes.schema.args import get_arg
    from infernetes.schema.support import ARG_SUPPORT

    support = ARG_SUPPORT[get_arg(flag).dest]
    if support.kind == "partial" and value is not None and value not in support.values:
        return support.others
    return support.kind


def test_readme_tables_say_what_the_support_table_says() -> None:
    flags = readme_flags()
    assert {heading for heading, _, _ in flags} == set(README_TABLES)
    wrong = [
        f"{heading}: {flag} {value or ''} is {support_kind(flag, value)}"
        for heading, flag, value in flags
        if support_kind(flag, value) not in README_TABLES[heading]
    ]
    assert wrong == []


def test_a_flag_in_the_wrong_table_is_found() -> None:
    assert support_kind("--enable-eplb", None) not in README_TABLES["### What works"]
    assert support_kind("--preemption-mode", "swap") in README_TABLES["### What is refused"]
    assert support_kind("--preemption-mode", "recompute") not in README_TABLES["### Planned"]


def test_the_architecture_page_stays_a_page() -> None:
    """It names each seam and its owner; history belongs in git, timings in the benchmarks."""
    lines = (ROOT / "docs" / "architecture.md").read_text().count("\n")
    assert lines <= 400, f"docs/architecture.md has {lines} lines; say it shorter"
