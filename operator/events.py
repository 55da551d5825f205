"""The event recorder: posts Kubernetes events about an InferenceService, each reason and message
once in EVENT_WINDOW_SECONDS (what to tell is the status writer's choice, status_writer.py)."""

import logging
import time
from collections.abc import Mapping
from typing import Any

from infernetes.operator import metrics, names
from infernetes.operator.kube import Call, KubeError, now, request

log = logging.getLogger("infernetes.operator")

# The same event (reason and message) about the same resource is told once in this window.
EVENT_WINDOW_SECONDS = 600.0


class EventRecorder:
    def __init__(self, api: Any, call: Call) -> None:
        self.api = api
        self.call = call
        self.told: dict[tuple, float] = {}

    async def event(
        self, resource: Mapping[str, Any], kind: str, reason: str, message: str
    ) -> None:
        """Post an event, once per reason and message in EVENT_WINDOW_SECONDS."""
        meta = resource["metadata"]
        told_key = (meta["namespace"], meta["name"], reason, message)
        stamp = time.monotonic()
        if stamp - self.told.get(told_key, -EVENT_WINDOW_SECONDS) < EVENT_WINDOW_SECONDS:
            return
        self.told = {k: t for k, t in self.told.items() if stamp - t < EVENT_WINDOW_SECONDS}
        self.told[told_key] = stamp
        timestamp = now()
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": names.API_VERSION,
                "kind": names.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": names.FIELD_MANAGER},
            "firstTimestamp": timestamp,
            "lastTimestamp": timestamp,
            "count": 1,
        }
        try:
            await self.call(
                request,
                self.api,
                "POST",
                f"/api/v1/namespaces/{meta['namespace']}/events",
                body=body,
            )
        except KubeError as exc:
            log.warning("could not post event %s: %s", reason, exc)
            return
        metrics.API_WRITES.labels("Event", "create").inc()
