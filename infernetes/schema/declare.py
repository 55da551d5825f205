"""The ``Arg`` declaration: one server argument, described as data.

Kept apart from ``args.py`` so the per-group tables can import it without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KINDS = ("str", "int", "float", "bool", "size", "json", "name_path", "token")

GROUPS = (
    "frontend",
    "ModelConfig",
    "LoadConfig",
    "DecodingConfig",
    "ParallelConfig",
    "CacheConfig",
    "MultiModalConfig",
    "LoRAConfig",
    "PromptAdapterConfig",
    "DeviceConfig",
    "SpeculativeConfig",
    "ObservabilityConfig",
    "SchedulerConfig",
    "VllmConfig",
)


@dataclass(frozen=True)
class Arg:
    """One ``serve`` argument.

    ``kind`` is the type of one value: ``str``, ``int``, ``float``, ``bool`` (``--x``/``--no-x``),
    ``size`` (an int that takes ``1k``/``1K``), ``json`` (an object given whole or by
    ``--x.key value``), ``name_path`` (``name=path`` or a JSON adapter spec) or ``token`` (a string,
    or alone for True). ``nargs="+"`` makes it a list of such values (given
    again, the flag replaces the list); ``nargs="*"`` a repeatable one (given again, it adds).

    A deprecated argument is accepted with a warning and never stored: its value moves to
    ``replaced_by`` (a dest, ``dest.key`` inside a JSON argument, or ``dest=value`` for a flag that
    stood for one value of another argument); without a replacement it is ignored. A current
    argument with ``replaced_by`` is a shorthand (``--spec-tokens`` for
    ``--speculative-config.num_speculative_tokens``): moved the same way, without a notice.
    """

    name: str
    kind: str = "str"
    default: Any = None
    group: str = "frontend"
    help: str = ""
    aliases: tuple[str, ...] = ()
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    nargs: str | None = None
    deprecated: str | None = None
    replaced_by: str | None = None
    operator_owned: bool = False
    secret: bool = False
    dest: str = field(default="")

    def __post_init__(self) -> None:
        if not self.dest:
            object.__setattr__(self, "dest", self.name.replace("-", "_"))
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: unknown kind {self.kind!r}")
        if self.group not in GROUPS:
            raise ValueError(f"{self.name}: unknown group {self.group!r}")

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    @property
    def stored(self) -> bool:
        """A field of ServeConfig: neither deprecated nor a shorthand for another argument."""
        return not self.deprecated and self.replaced_by is None

    @property
    def is_list(self) -> bool:
        return self.nargs in ("+", "*")
