"""Moving the values of deprecated arguments onto their replacements."""

from __future__ import annotations

from typing import Any

from infernetes.schema.args import BY_DEST


def apply_deprecations(given: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Returns the values with every deprecated dest mapped away, and one notice per such dest.

    A value the user also gave under the new name wins over the one moved from the old name.
    """
    result = {dest: value for dest, value in given.items() if not _is_deprecated(dest)}
    notices = []
    for dest, value in given.items():
        if not _is_deprecated(dest):
            continue
        arg = BY_DEST[dest]
        target = arg.replaced_by
        notices.append(f"{arg.flag} is deprecated: {arg.deprecated}.")
        if target is None or value is None:
            continue
        if "=" in target:
            if value is True:
                new_dest, _, new_value = target.partition("=")
                result.setdefault(new_dest, new_value)
        elif "." in target:
            new_dest, _, key = target.partition(".")
            current = dict(result.get(new_dest) or {})
            current.setdefault(key, value)
            result[new_dest] = current
        else:
            result.setdefault(target, value)
    return result, notices


def _is_deprecated(dest: str) -> bool:
    arg = BY_DEST.get(dest)
    return arg is not None and arg.deprecated is not None
