"""The table of every ``serve`` argument (``ARGS``), assembled from one module per config group.

Importing this module costs only the standard library; the operator and ``--help`` rely on that.
"""

from __future__ import annotations

from infernetes.schema.declare import GROUPS, Arg
from infernetes.schema.groups import (
    cache,
    decoding,
    deprecated,
    device,
    frontend,
    load,
    lora,
    model,
    multimodal,
    observability,
    parallel,
    prompt_adapter,
    scheduler,
    speculative,
    vllm,
)

_MODULES = (
    frontend,
    model,
    load,
    decoding,
    parallel,
    cache,
    multimodal,
    lora,
    prompt_adapter,
    device,
    speculative,
    observability,
    scheduler,
    vllm,
    deprecated,
)

ARGS: tuple[Arg, ...] = tuple(arg for module in _MODULES for arg in module.ARGS)

# Arguments that are stored in a ServeConfig (deprecated ones and shorthands only feed their
# replacements).
CURRENT_ARGS: tuple[Arg, ...] = tuple(arg for arg in ARGS if arg.stored)

BY_DEST: dict[str, Arg] = {arg.dest: arg for arg in ARGS}
BY_NAME: dict[str, Arg] = {arg.name: arg for arg in ARGS}


def _check_unique() -> None:
    seen: set[str] = set()
    for arg in ARGS:
        for spelling in (arg.flag, *arg.aliases):
            if spelling in seen:
                raise RuntimeError(f"argument spelling {spelling} is declared twice")
            seen.add(spelling)
    if len(BY_DEST) != len(ARGS):
        raise RuntimeError("two arguments share a dest")


_check_unique()


def get_arg(name: str) -> Arg:
    """The argument for a flag name, dest or alias (``--max-model-len``, ``max_model_len``, ``-tp``)."""
    if name in BY_DEST:
        return BY_DEST[name]
    key = name.lstrip("-").replace("_", "-")
    if key in BY_NAME:
        return BY_NAME[key]
    for arg in ARGS:
        if name in arg.aliases:
            return arg
    raise KeyError(name)


__all__ = ["ARGS", "BY_DEST", "BY_NAME", "CURRENT_ARGS", "GROUPS", "Arg", "get_arg"]
