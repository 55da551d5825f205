"""Which optional APIs the cluster serves: asked at start-up, 1 and 4 s after a CRD of an
optional group changes, and every minute; a CRD being deleted stops counting at once.

The render takes them as ClusterFacts.apis; a change queues a pass of every resource (the
reconciler's `on_change`), never a reason to roll pods.
"""

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from infernetes.operator.facts import (
    DRA_GV,
    GATEWAY_GV,
    INFERENCE_POOL_GV,
    KEDA_GV,
    LWS_GV,
    MODEL_REWRITE_GV,
    MONITORING_GV,
)
from infernetes.operator.kube import Call, KubeError, request

log = logging.getLogger("infernetes.operator")

# DRA is built into the API server (1.34+), not a CRD: only the periodic discovery sees it come.
OPTIONAL_GROUP_VERSIONS = (
    MONITORING_GV,
    KEDA_GV,
    LWS_GV,
    INFERENCE_POOL_GV,
    MODEL_REWRITE_GV,
    GATEWAY_GV,
    DRA_GV,
)
OPTIONAL_GROUPS = frozenset(gv.split("/")[0] for gv in OPTIONAL_GROUP_VERSIONS)
REDISCOVER_SECONDS = 60.0
REDISCOVER_AFTER_CRD_SECONDS = (1.0, 4.0)


def discover_apis(api: Any) -> frozenset[str]:
    """ "group/version/Kind" for every kind of the optional group/versions the server serves."""
    groups = request(api, "GET", "/apis") or {}
    served = {
        version["groupVersion"]
        for group in groups.get("groups", [])
        for version in group.get("versions", [])
    }
    apis: set[str] = set()
    for group_version in OPTIONAL_GROUP_VERSIONS:
        if group_version not in served:
            continue
        try:
            resources = request(api, "GET", f"/apis/{group_version}") or {}
        except KubeError:
            continue
        apis.update(
            f"{group_version}/{resource['kind']}"
            for resource in resources.get("resources", [])
            if "/" not in resource["name"]
        )
    return frozenset(apis)


class ServedApis:
    """The optional APIs served now; `on_change` is called when they change."""

    def __init__(self, api: Any, call: Call, on_change: Callable[[], None]) -> None:
        self.api = api
        self.call = call
        self.on_change = on_change
        self.discovered: frozenset[str] = frozenset()
        self.withdrawn: set[str] = set()
        self._periodic: asyncio.Task | None = None
        self._after_crd: asyncio.Task | None = None

    @property
    def apis(self) -> frozenset[str]:
        """Optional APIs served ("group/version/Kind"), less those whose CRD is being deleted."""
        return self.discovered - self.withdrawn

    async def start(self) -> None:
        self.discovered = await self.call(discover_apis, self.api)
        log.info("optional APIs served: %s", ", ".join(sorted(self.apis)) or "none")
        self._periodic = asyncio.create_task(self._rediscover_periodically())

    async def stop(self) -> None:
        tasks = [task for task in (self._periodic, self._after_crd) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def rediscover(self) -> None:
        try:
            discovered = await self.call(discover_apis, self.api)
        except KubeError as exc:
            log.warning("discovery failed: %s", exc)
            return
        if discovered != self.discovered:
            self.discovered = discovered
            self._changed()

    def crd_event(self, event: str | None, body: dict[str, Any]) -> None:
        """A CRD of an optional group changed: one being deleted stops counting at once (the API
        server refuses new objects of it while it is served still); discover again once the
        burst of events is over, and once more a little later."""
        spec = body.get("spec") or {}
        kinds = {
            f"{spec.get('group')}/{version.get('name')}/{(spec.get('names') or {}).get('kind')}"
            for version in spec.get("versions") or ()
        }
        served_before = self.apis
        if body["metadata"].get("deletionTimestamp"):
            self.withdrawn |= kinds
        elif event != "DELETED":
            # Recreated before discovery caught up with its deletion: still `discovered`, so
            # serving it again changes nothing discovery would notice.
            self.withdrawn -= kinds
        if self.apis != served_before:
            self._changed()
        if self._after_crd is not None:
            self._after_crd.cancel()

        async def later() -> None:
            for delay in REDISCOVER_AFTER_CRD_SECONDS:
                await asyncio.sleep(delay)
                await self.rediscover()

        self._after_crd = asyncio.create_task(later())

    @staticmethod
    def optional(obj: Mapping[str, Any]) -> bool:
        """An object of one of the optional group/versions."""
        return obj["apiVersion"] in OPTIONAL_GROUP_VERSIONS

    def unserved(self, obj: Mapping[str, Any]) -> bool:
        """An object of an optional kind whose API is not served (any more)."""
        return self.optional(obj) and f"{obj['apiVersion']}/{obj['kind']}" not in self.apis

    async def gone(self, manifest: Mapping[str, Any]) -> bool:
        """After a failed write: has the kind's optional API gone (its CRD deleted or being so)?"""
        if not self.optional(manifest):
            return False
        if self.unserved(manifest):
            return True
        await self.rediscover()
        return self.unserved(manifest)

    def _changed(self) -> None:
        log.info("optional APIs served: %s", ", ".join(sorted(self.apis)) or "none")
        self.on_change()

    async def _rediscover_periodically(self) -> None:
        while True:
            await asyncio.sleep(REDISCOVER_SECONDS)
            await self.rediscover()
