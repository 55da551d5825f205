"""ServedApis: which optional APIs the render may use, as CRDs come and go."""

import asyncio
from typing import Any

from infernetes.operator.discovery import ServedApis

SERVICE_MONITOR = "monitoring.coreos.com/v1/ServiceMonitor"


def crd(deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "servicemonitors.monitoring.coreos.com"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-25T15:10:56Z"
    return {
        "metadata": metadata,
        "spec": {
            "group": "monitoring.coreos.com",
            "names": {"kind": "ServiceMonitor"},
            "versions": [{"name": "v1"}],
        },
    }


def served_apis(discovered: list[frozenset[str]], changes: list[frozenset[str]]) -> ServedApis:
    async def call(_function: Any, _api: Any) -> frozenset[str]:
        return discovered[0]

    apis = ServedApis(api=None, call=call, on_change=lambda: changes.append(apis.apis))
    return apis


def test_a_crd_recreated_before_discovery_caught_up_is_served_again() -> None:
    # The CI flake: deleted and installed again within the second before re-discovery, the
    # discovered set never changed, so nothing told the reconciler the API was back.
    async def scenario() -> list[frozenset[str]]:
        discovered = [frozenset({SERVICE_MONITOR})]
        changes: list[frozenset[str]] = []
        apis = served_apis(discovered, changes)
        await apis.start()
        apis.crd_event("MODIFIED", crd(deleting=True))
        apis.crd_event("DELETED", crd(deleting=True))
        apis.crd_event("ADDED", crd())
        await apis.stop()
        return changes

    assert asyncio.run(scenario()) == [frozenset(), frozenset({SERVICE_MONITOR})]


def test_a_crd_being_deleted_stops_counting_once() -> None:
    async def scenario() -> list[frozenset[str]]:
        changes: list[frozenset[str]] = []
        apis = served_apis([frozenset({SERVICE_MONITOR})], changes)
        await apis.start()
        apis.crd_event("MODIFIED", crd(deleting=True))
        apis.crd_event("MODIFIED", crd(deleting=True))
        apis.crd_event("DELETED", crd(deleting=True))
        await apis.stop()
        return changes

    assert asyncio.run(scenario()) == [frozenset()]


def test_rediscovery_notices_an_api_that_appeared() -> None:
    async def scenario() -> list[frozenset[str]]:
        discovered = [frozenset()]
        changes: list[frozenset[str]] = []
        apis = served_apis(discovered, changes)
        await apis.start()
        discovered[0] = frozenset({SERVICE_MONITOR})
        await apis.rediscover()
        await apis.stop()
        return changes

    assert asyncio.run(scenario()) == [frozenset({SERVICE_MONITOR})]
