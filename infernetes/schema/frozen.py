"""Immutable containers for configuration values (JSON objects and lists)."""

from __future__ import annotations

from typing import Any, NoReturn


class FrozenDict(dict):
    """A dict that refuses changes; still a dict, so ``json.dumps`` and ``==`` just work."""

    def _immutable(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("configuration values are immutable; use ServeConfig.replace()")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _immutable
    __ior__ = _immutable

    def __reduce__(self) -> tuple:
        return (FrozenDict, (dict(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted((k, _hashable(v)) for k, v in self.items())))


class FrozenList(list):
    """A list that refuses changes; equal to the plain list with the same items."""

    def _immutable(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("configuration values are immutable; use ServeConfig.replace()")

    __setitem__ = __delitem__ = append = extend = insert = pop = remove = clear = _immutable
    sort = reverse = __iadd__ = __imul__ = _immutable

    def __reduce__(self) -> tuple:
        return (FrozenList, (list(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(_hashable(self))


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    return value


def freeze(value: Any) -> Any:
    """Dicts and lists become their read-only versions, all the way down."""
    if isinstance(value, dict):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return FrozenList(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The plain JSON-shaped copy of a frozen value (dicts and lists)."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value
