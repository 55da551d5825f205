"""``ConfigError``: the one exception for bad argument values (re-exported by ``config``), and
the one check of a JSON argument's keys."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


class ConfigError(ValueError):
    """A bad argument value; ``dest`` names the argument (the main one for cross-field rules)."""

    def __init__(self, message: str, dest: str | None = None) -> None:
        super().__init__(message)
        self.dest = dest

    @property
    def flag(self) -> str | None:
        return f"--{self.dest.replace('_', '-')}" if self.dest else None


def check_json_keys(dest: str, given: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """Raises ConfigError naming the keys of the JSON argument ``dest`` that are not
    ``allowed``, and what is."""
    allowed = sorted(allowed)
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{dest} has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}", dest
        )
