"""A small reader for the Containerfile: its stages and their instructions (continuations joined,
comments dropped), enough for the tests to check what the images promise."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO_ROOT / "Containerfile"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [value for key, value in self.instructions if key == keyword]

    def last(self, keyword: str) -> str | None:
        values = self.all(keyword)
        return values[-1] if values else None


def instructions(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def stages(path: Path = CONTAINERFILE) -> dict[str, Stage]:
    result: dict[str, Stage] = {}
    current: Stage | None = None
    for keyword, value in instructions(path.read_text(encoding="utf-8")):
        if keyword == "FROM":
            base, _, name = value.partition(" AS ")
            current = Stage(name=name.strip(), base=base.strip())
            result[current.name] = current
        elif current is not None:
            current.instructions.append((keyword, value))
    return result


def exec_form(value: str) -> list[str]:
    """The JSON array of an exec-form ENTRYPOINT/CMD (raises ValueError for the shell form)."""
    parsed = json.loads(value)
    if not isinstance(parsed, list) or not all(isinstance(item, str) for item in parsed):
        raise ValueError(f"not an exec-form array: {value}")
    return parsed
