"""The support table applied: which settings of a configuration and an environment the runtime
refuses (errors) and which it accepts without effect (warnings). ``serve``, ``config`` and the
engine's own settings resolution all ask here, before anything heavy loads."""

from __future__ import annotations

import difflib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infernetes.schema.args import CURRENT_ARGS, Arg
from infernetes.schema.env import ENV_VARS, read_env
from infernetes.schema.support import ARG_SUPPORT, ENV_SUPPORT, KEY_SUPPORT, Support


@dataclass
class SupportReport:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _unset(value: Any) -> bool:
    """None, False or an empty string or collection: "not given" whichever the default is. (Not
    by ``==``: 0 == False would make a refused 0 pass for an unset default.)"""
    return (
        value is None
        or value is False
        or (isinstance(value, str | dict | list | tuple) and not value)
    )


def _is_default(value: Any, default: Any) -> bool:
    return value == default or (_unset(value) and _unset(default))


def _shown(value: Any) -> str:
    if isinstance(value, dict | list | tuple):
        return json.dumps(value)
    return str(value)


def _values(support: Support) -> str:
    return ", ".join(_shown(v) for v in support.values)


def _judge(support: Support, what: str, value: Any, report: SupportReport) -> None:
    """Files ``what`` (e.g. "argument --tensor-parallel-size 2"), set to ``value``, by its entry."""
    if support.kind == "refused":
        report.errors.append(f"{what} is not supported: {support.reason}")
    elif support.kind == "no_effect":
        report.warnings.append(f"{what} has no effect here: {support.reason}")
    elif support.kind == "partial" and value not in support.values:
        if support.others == "no_effect":
            report.warnings.append(f"{what} has no effect here: {support.reason}")
        else:
            report.errors.append(
                f"{what} is not supported: {support.reason}; supported: {_values(support)}"
            )


def _flag_text(arg: Arg, value: Any) -> str:
    names = "/".join((arg.flag, *arg.aliases))
    return f"argument {names}" if value is True else f"argument {names} {_shown(value)}"


def check_support(config: Any, environ: Mapping[str, str] | None = None) -> SupportReport:
    """What the runtime would refuse or ignore of ``config`` (a ServeConfig or any object with the
    dests as attributes) and of the ``VLLM_*`` variables set in ``environ``."""
    report = SupportReport()
    for arg in CURRENT_ARGS:
        value = getattr(config, arg.dest, arg.default)
        if not _is_default(value, arg.default):
            _judge(ARG_SUPPORT[arg.dest], _flag_text(arg, value), value, report)
    for path, support in KEY_SUPPORT.items():
        dest, key = path.split(".", 1)
        given = getattr(config, dest, None) or {}
        if key in given and not _is_default(given[key], None):
            what = f"argument --{dest.replace('_', '-')}.{key} {_shown(given[key])}"
            _judge(support, what, given[key], report)
    environ = os.environ if environ is None else environ
    for var in ENV_VARS:
        raw = environ.get(var.name)
        if not raw or not var.name.startswith("VLLM_"):
            continue
        try:
            value = read_env(var.name, environ)
        except ValueError:
            continue  # malformed values are reported where they are read
        if not _is_default(value, var.default):
            _judge(ENV_SUPPORT[var.name], f"{var.name}={raw}", value, report)
    report.warnings.extend(_unknown_env_warnings(environ))
    return report


def _unknown_env_warnings(environ: Mapping[str, str]) -> list[str]:
    """vLLM's warning for a ``VLLM_*`` name it does not know (a misspelt one does nothing)."""
    known = {var.name for var in ENV_VARS}
    warnings = []
    for name in sorted(environ):
        if name.startswith("VLLM_") and name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            warnings.append(f"Unknown vLLM environment variable detected: {name}{hint}")
    return warnings


def report_support(config: Any, prog: str, environ: Mapping[str, str] | None = None) -> None:
    """The command line's side: each warning printed once to stderr; refused settings printed as
    argparse errors and the process exits 2."""
    report = check_support(config, environ)
    for warning in report.warnings:
        print(f"{prog}: warning: {warning}", file=sys.stderr)
    if report.errors:
        for error in report.errors:
            print(f"{prog}: error: {error}", file=sys.stderr)
        raise SystemExit(2)


def refuse_unsupported(config: Any, environ: Mapping[str, str] | None = None) -> list[str]:
    """Raises ValueError listing every refused setting; returns the no-effect warnings."""
    report = check_support(config, environ)
    if report.errors:
        raise ValueError("; ".join(report.errors))
    return report.warnings
