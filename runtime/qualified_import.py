"""User code named on the command line (``--middleware``, ``--logits-processors``,
``--tool-parser-plugin``): one way to import ``module.attribute`` (or ``module:attribute``) or a
Python file, with errors that name the flag."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

# Files already run, by resolved path: ``config`` and ``serve`` check the same settings, and a
# plugin's registrations must happen once.
_FILES_RUN: dict[Path, ModuleType] = {}


def _refuse_vllm(flag: str, what: str, error: ImportError) -> None:
    """Raises the clear refusal when ``error`` is user code importing vLLM."""
    if (error.name or "").split(".")[0] == "vllm":
        raise ValueError(
            f"{flag} {what!r}: its module imports {error.name!r}, and vLLM is not part "
            "of this server; write it against this server's own interface instead"
        ) from error


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
        _refuse_vllm(flag, qualified, error)
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


def import_file(flag: str, path: str) -> ModuleType:
    """Runs the Python file ``path`` as a module named after it (once), as vLLM loads a plugin
    file; ValueError saying what is wrong otherwise."""
    file = Path(path).expanduser().resolve()
    if file in _FILES_RUN:
        return _FILES_RUN[file]
    if not file.is_file():
        raise ValueError(f"{flag} {path!r}: no such file")
    spec = importlib.util.spec_from_file_location(file.stem, file)
    if spec is None or spec.loader is None:
        raise ValueError(f"{flag} {path!r}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as error:
        _refuse_vllm(flag, path, error)
        raise ValueError(f"{flag} {path!r}: cannot import {error.name!r}: {error}") from error
    except Exception as error:
        raise ValueError(f"{flag} {path!r}: running it raised {error!r}") from error
    sys.modules.setdefault(file.stem, module)
    _FILES_RUN[file] = module
    return module
