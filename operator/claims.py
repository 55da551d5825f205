"""Claims several replicas cannot share: a PersistentVolumeClaim that only one node (or one pod)
can attach leaves the replicas on other nodes Pending. Admission cannot see a claim's access
modes, so the reconciler asks for them, at most once in CLAIM_CHECK_SECONDS per claim; the notes
become the ClaimsShared condition (status.py).
"""

import asyncio
from collections.abc import Mapping
from typing import Any

from infernetes.operator.cache import Key
from infernetes.operator.kube import Call, KubeError, request
from infernetes.operator.render.workload import model_source

# Access modes that let one node (or one pod) mount a claim; a claim's are asked again after this.
SINGLE_NODE_ACCESS = frozenset({"ReadWriteOnce", "ReadWriteOncePod"})
CLAIM_CHECK_SECONDS = 60.0


class ClaimCheck:
    def __init__(self, api: Any, call: Call) -> None:
        self.api = api
        self.call = call
        self.checked: dict[tuple[str, str], tuple[float, list[str] | None]] = {}

    async def unshared(self, key: Key, spec: Mapping[str, Any]) -> list[str]:
        """The claims of a resource with several replicas that only one node can attach
        (ReadWriteOnce, ReadWriteOncePod), a note for each."""
        replicas = spec.get("replicas", 1)
        if replicas <= 1:
            return []
        namespace, _ = key
        claims = [("spec.model", model_source(spec).claim)]
        claims.append(
            ("spec.modelCache.claimName", (spec.get("modelCache") or {}).get("claimName"))
        )
        notes = []
        for field, claim in claims:
            modes = await self._access_modes(namespace, claim) if claim else None
            if modes and set(modes) <= SINGLE_NODE_ACCESS:
                notes.append(
                    f"{field}: PersistentVolumeClaim {claim} is {', '.join(modes)}: the {replicas} "
                    "replicas can only mount it on one node; use a ReadWriteMany or ReadOnlyMany "
                    "claim, or one replica"
                )
        return notes

    async def _access_modes(self, namespace: str, claim: str) -> list[str] | None:
        """A claim's access modes, asked again after CLAIM_CHECK_SECONDS (None: no such claim)."""
        now = asyncio.get_running_loop().time()
        checked = self.checked.get((namespace, claim))
        if checked is not None and now - checked[0] < CLAIM_CHECK_SECONDS:
            return checked[1]
        path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}"
        try:
            found = await self.call(request, self.api, "GET", path)
            modes = list((found.get("spec") or {}).get("accessModes") or [])
        except KubeError as exc:
            if exc.status != 404:
                raise
            modes = None
        self.checked[(namespace, claim)] = (now, modes)
        return modes
