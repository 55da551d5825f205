"""What the runtime will make of an InferenceService's spec.engine and spec.engineEnv, asked of
the support table (`infernetes.schema.support_check`) one field at a time, so each note names its
field: `spec.engine.swapSpace: argument --swap-space 8.0 has no effect here: ...`.

The CRD already refuses what the runtime refuses (operator/admission.py); `refused` is for
resources that never met it (`infernetes operator render`, an older CRD). `ignored` are settings
accepted without effect: the operator reports them in status and events.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from infernetes.operator.argv import engine_fields, env_value
from infernetes.operator.engine_schema import engine_env_vars

from infernetes.schema.convert import convert
from infernetes.schema.env import ENV_VARS
from infernetes.schema.errors import ConfigError
from infernetes.schema.support_check import SupportReport, check_support

# A configuration with no argument set: every argument reads as its default.
NOTHING_SET = SimpleNamespace()


@dataclass
class SupportNotes:
    refused: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def add(self, path: str, report: SupportReport) -> None:
        self.refused.extend(f"{path}: {error}" for error in report.errors)
        self.ignored.extend(f"{path}: {warning}" for warning in report.warnings)


def review_engine(spec: Mapping[str, Any]) -> SupportNotes:
    """Notes on every field set in spec.engine and spec.engineEnv, in the schema's table order."""
    notes = SupportNotes()
    engine = spec.get("engine") or {}
    for name, arg in engine_fields().items():
        if engine.get(name) is None:
            continue
        try:
            value = convert(arg, engine[name])
        except ConfigError:
            continue  # a bad value is the CRD's to refuse and the runtime's to report
        notes.add(
            f"spec.engine.{name}", check_support(SimpleNamespace(**{arg.dest: value}), environ={})
        )
    engine_env = spec.get("engineEnv") or {}
    for var in engine_env_vars(ENV_VARS):
        if engine_env.get(var.name) is not None:
            environ = {var.name: env_value(engine_env[var.name])}
            notes.add(f"spec.engineEnv.{var.name}", check_support(NOTHING_SET, environ=environ))
    return notes
