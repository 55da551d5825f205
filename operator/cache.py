"""What the operator knows of the cluster, kept from watch events and from its own writes.

Watch events and the responses to the operator's writes reach it by two paths; each copy keeps
the newest version (by resourceVersion), so a reconcile never decides on a copy older than what it
wrote itself (no second create of a child it has just created, no event told twice).
"""

from collections.abc import Hashable, Iterator, Mapping
from typing import Any

from infernetes.operator import names

Key = tuple[str, str]  # namespace, InferenceService name
ChildId = tuple[str, str, str]  # apiVersion, kind, name


def plain(value: Any) -> Any:
    """A deep copy made of dicts and lists (kopf hands out read-only views)."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def _version(obj: Mapping[str, Any]) -> int:
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "0")
    return int(text) if text.isdigit() else 0


def child_id(manifest: Mapping[str, Any]) -> ChildId:
    return manifest["apiVersion"], manifest["kind"], manifest["metadata"]["name"]


def owner_key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), (meta.get("labels") or {}).get(names.LABEL_INSTANCE, "")


class Newest:
    """Objects by key, each the newest version seen."""

    def __init__(self) -> None:
        self._items: dict[Hashable, dict[str, Any]] = {}

    def observe(self, key: Hashable, obj: dict[str, Any]) -> None:
        old = self._items.get(key)
        if old is None or _version(obj) >= _version(old):
            self._items[key] = obj

    def remove(self, key: Hashable, obj: Mapping[str, Any] | None = None) -> None:
        old = self._items.get(key)
        if old is not None and (obj is None or _version(obj) >= _version(old)):
            del self._items[key]

    def get(self, key: Hashable) -> dict[str, Any] | None:
        return self._items.get(key)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)


class Children:
    """Each InferenceService's children (Deployment, Service, monitors) and pods."""

    def __init__(self) -> None:
        self._objects: dict[Key, Newest] = {}
        self._deleted: dict[Key, set[ChildId]] = {}
        self._pods: dict[Key, dict[str, dict[str, Any]]] = {}

    def observe(self, obj: dict[str, Any], deleted: bool = False) -> Key:
        key = owner_key(obj)
        store = self._objects.setdefault(key, Newest())
        if deleted:
            store.remove(child_id(obj), obj)
            self._deleted.setdefault(key, set()).add(child_id(obj))
        else:
            store.observe(child_id(obj), obj)
            self._deleted.get(key, set()).discard(child_id(obj))
        return key

    def drop(self, obj: Mapping[str, Any]) -> None:
        """Forget a child that went with its kind (its CRD deleted): not a deletion to repair."""
        store = self._objects.get(owner_key(obj))
        if store is not None:
            store.remove(child_id(obj))

    def deleted(self, key: Key) -> set[ChildId]:
        """Children seen deleted (by someone else, or by the operator) and not seen since."""
        return self._deleted.get(key, set())

    def of(self, key: Key) -> dict[ChildId, dict[str, Any]]:
        store = self._objects.get(key)
        return {cid: store.get(cid) for cid in store} if store else {}  # type: ignore[misc]

    def observe_pod(self, pod: Mapping[str, Any], deleted: bool = False) -> Key:
        key = owner_key(pod)
        meta, status = pod["metadata"], pod.get("status") or {}
        pods = self._pods.setdefault(key, {})
        if deleted:
            pods.pop(meta["name"], None)
        else:
            pods[meta["name"]] = {
                "metadata": {
                    "name": meta["name"],
                    "deletionTimestamp": meta.get("deletionTimestamp"),
                },
                "status": {
                    "conditions": plain(status.get("conditions")),
                    "containerStatuses": plain(status.get("containerStatuses")),
                },
            }
        return key

    def pods(self, key: Key) -> list[dict[str, Any]]:
        return list(self._pods.get(key, {}).values())

    def forget(self, key: Key) -> None:
        self._objects.pop(key, None)
        self._deleted.pop(key, None)
        self._pods.pop(key, None)
