"""``ConfigError``: the one exception for bad argument values (re-exported by ``config``)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad argument value; ``dest`` names the argument (the main one for cross-field rules)."""

    def __init__(self, message: str, dest: str | None = None) -> None:
        super().__init__(message)
        self.dest = dest

    @property
    def flag(self) -> str | None:
        return f"--{self.dest.replace('_', '-')}" if self.dest else None
