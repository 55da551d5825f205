"""Does a live child still hold what the operator rendered? (pure; no I/O)

The operator writes a child only when this says it must, so a quiet cluster sees no writes and a
burst of child events causes no write storm. Two checks:

- the render changed: each applied child carries `DESIRED_HASH`, a hash of the manifest it was
  applied from; a different hash means a new render (also one that only removes fields, which a
  comparison of values alone could not see);
- someone else changed it: every value of the desired manifest must still be in the live object
  (the live one has more: server defaults, other managers' fields). Lists of named items are
  matched by name (server-side apply merges containers, env, ports, volumes by key), other lists
  as wholes; quantities compare by value ("1" == 1, "1000m" == "1"); a zero value (false, 0, "")
  the API server left out counts as present.

Fields another controller takes through the scale subresource (an HPA or KEDA setting a
Deployment's replicas) are left to it: `scaled_by_others` tells the reconciler to omit them.
"""

import hashlib
import json
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from infernetes.operator import names

DESIRED_HASH = f"{names.GROUP}/desired-hash"
ZERO_VALUES = (False, 0, "")
# Keys that identify the items of the lists the operator renders (server-side apply's list keys).
LIST_KEYS = ("name", "mountPath", "containerPort", "port")
SUFFIXES: dict[str, int | Decimal] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}


def quantity_value(value: Any) -> Decimal | None:
    """A Kubernetes quantity's value ("2Gi", "500m", "1e3", 4), or None if it is not one."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    text = str(value).strip()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix) and text[: -len(suffix)]:
            number, scale = text[: -len(suffix)], Decimal(SUFFIXES[suffix])
            break
    else:
        number, scale = text, Decimal(1)
    try:
        return Decimal(number) * scale
    except InvalidOperation:
        return None


def content_hash(manifest: Mapping[str, Any]) -> str:
    """A short hash of a manifest (without its own hash annotation)."""
    meta = dict(manifest.get("metadata") or {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != DESIRED_HASH}
    meta["annotations"] = annotations
    text = json.dumps({**manifest, "metadata": meta}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def with_hash(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest as applied: its hash recorded in an annotation."""
    meta = dict(manifest["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), DESIRED_HASH: content_hash(manifest)}
    return {**manifest, "metadata": meta}


def _same_scalar(desired: Any, live: Any) -> bool:
    if desired == live and type(desired) is type(live):
        return True
    if isinstance(desired, bool) or isinstance(live, bool):
        return False
    if str(desired) == str(live):
        return True
    a, b = quantity_value(desired), quantity_value(live)
    return a is not None and a == b


def _list_key(items: Sequence[Any]) -> str | None:
    """The key that names each item, if one does (unique: two HTTPRoute parentRefs may name
    Gateways of one name in two namespaces, and those lists compare as wholes)."""
    for key in LIST_KEYS:
        if items and all(isinstance(item, Mapping) and key in item for item in items):
            return key if len({str(item[key]) for item in items}) == len(items) else None
    return None


def differences(desired: Any, live: Any, path: str = "") -> list[str]:
    """Paths where `live` does not hold `desired`'s value (empty: nothing to write)."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return [] if not desired and live is None else [path or "."]
        found: list[str] = []
        for key, value in desired.items():
            found += differences(value, live.get(key), f"{path}.{key}")
        return found
    if isinstance(desired, list):
        if live is None:
            return [] if not desired else [path]
        if not isinstance(live, list):
            return [path]
        key = _list_key(desired)
        if key is not None and _list_key(live) == key:
            by_key = {item[key]: item for item in live}
            found = []
            for item in desired:
                found += differences(item, by_key.get(item[key]), f"{path}[{key}={item[key]}]")
            return found
        if len(desired) != len(live):
            return [path]
        found = []
        for index, (want, have) in enumerate(zip(desired, live, strict=True)):
            found += differences(want, have, f"{path}[{index}]")
        return found
    if live is None and desired in ZERO_VALUES:
        return []  # the API server omits zero values (omitempty): readOnly false reads back absent
    return [] if _same_scalar(desired, live) else [path]


def stale_fields(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> list[str]:
    """Why `live` must be re-applied: ["missing"], ["render changed"], or the drifted paths."""
    if live is None:
        return ["missing"]
    applied = ((live.get("metadata") or {}).get("annotations") or {}).get(DESIRED_HASH)
    if applied != content_hash(desired):
        return ["render changed"]
    return differences(desired, live)


def scaled_by_others(live: Mapping[str, Any] | None) -> bool:
    """True when another manager set spec.replicas through the scale subresource (HPA, KEDA,
    `kubectl scale deployment`): the operator then leaves replicas to it."""
    for entry in (live or {}).get("metadata", {}).get("managedFields") or ():
        if entry.get("manager") == names.FIELD_MANAGER or entry.get("subresource") != "scale":
            continue
        if "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {}):
            return True
    return False
