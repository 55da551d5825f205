"""User code named on the command line (``--middleware``, ``--logits-processors``): one way to
import ``module.attribute`` (or ``module:attribute``), with errors that name the flag."""

from __future__ import annotations

import importlib
from typing import Any


def import_qualified(flag: str, qualified: str) -> Any:
    """The attribute ``qualified`` names; ValueError saying what is wrong otherwise."""
    module_name, sep, attr = qualified.partition(":")
    if not sep:
        module_name, _, attr = qualified.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{flag} {qualified!r}: expected 'module.attribute' or 'module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        if (error.name or "").split(".")[0] == "vllm":
            raise ValueError(
                f"{flag} {qualified!r}: its module imports {error.name!r}, and vLLM is not part "
                "of this server; write it against this server's own interface instead"
            ) from error
        raise ValueError(
            f"{flag} {qualified!r}: cannot import module {module_name!r}: {error}"
        ) from error
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ValueError(f"{flag} {qualified!r}: module has no attribute {attr!r}")
    return target


def qualified_name(target: Any) -> str:
    """The ``module:attribute`` name ``import_qualified`` finds ``target`` by."""
    return f"{target.__module__}:{target.__qualname__}"
