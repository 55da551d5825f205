"""Steady streamed load on a Service's endpoints, balanced by the client itself.

There is no kube-proxy on the local control plane, so this client does what kube-proxy or a
gateway would: it sends each request to one of the Service's ready endpoints and never retries.
Its view of them is kept by a watch on the Service's EndpointSlices (EndpointView), as
kube-proxy's informer keeps its own: an address leaves the view as soon as its slice marks it
terminating or not ready. A request that fails in any way is lost: an HTTP error, a broken
connection, a stream without a finish_reason of "length" or without its ``[DONE]``, or no ready
endpoint to send it to.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
from infernetes.runtime.server.sse_reader import asse_lines

PORT = 8000
# How long a stream may go without a byte before it counts as lost. A request queued behind
# others on a draining engine waits its turn: on the shared machine at a load average near 30,
# engines finished about one request a second and queued ones waited over 120 s for a byte
# (e2e/test_serving_changes.py's going pods may drain for up to 170 s).
READ_TIMEOUT = 300
# The API server ends each watch after this long (the view then lists and watches again), which
# also bounds how long EndpointView.stop() waits.
WATCH_SECONDS = 5


@dataclass
class Lost:
    """A request that did not complete, and when its endpoint left the client's view."""

    clock: str  # wall-clock time it ended, HH:MM:SS
    address: str | None  # None: there was no ready endpoint to send it to
    sent: float  # time.monotonic() when it was sent
    problem: str
    left_view: float | None = None  # time.monotonic() its address left the view, if it did

    def __str__(self) -> str:
        if self.address is None:
            return f"{self.clock} {self.problem}"
        if self.left_view is None:
            where = "in the client's view until the end"
        else:
            where = f"left the client's view {self.left_view - self.sent:+.1f} s after it was sent"
        return f"{self.clock} {self.address} ({where}): {self.problem}"


@dataclass
class LoadReport:
    completed: int = 0
    lost: list[Lost] = field(default_factory=list)
    by_address: Counter[str] = field(default_factory=Counter)
    # (time.monotonic() when sent, seconds to its first token) of every completed stream
    first_tokens: list[tuple[float, float]] = field(default_factory=list)


def serving_addresses(slices: Iterable[dict[str, Any]]) -> list[str]:
    """The ready, non-terminating addresses of EndpointSlices (as the API serves them)."""
    return sorted(
        {
            address
            for item in slices
            for endpoint in item.get("endpoints") or ()
            if (conditions := endpoint.get("conditions") or {}).get("ready")
            and not conditions.get("terminating")
            for address in endpoint.get("addresses") or ()
        }
    )


def _list_slices(client: Any, namespace: str, service: str) -> dict[str, Any]:
    """The Service's EndpointSlice list, as the API server's JSON."""
    from kubernetes import client as k8s

    response = k8s.DiscoveryV1Api(client).list_namespaced_endpoint_slice(
        namespace,
        label_selector=f"kubernetes.io/service-name={service}",
        _preload_content=False,
    )
    return json.loads(response.data)


def ready_addresses(client: Any, namespace: str, service: str) -> list[str]:
    """The Service's ready, non-terminating endpoint addresses (a kubernetes ApiClient)."""
    return serving_addresses(_list_slices(client, namespace, service)["items"])


class EndpointView:
    """A Service's ready endpoint addresses, kept current in a thread by a list, then a watch
    from that list's resourceVersion (listing again whenever the watch ends or fails), as an
    informer does. ``left[address]``: the times (time.monotonic()) an address left the view (a
    pod's IP may come back with a later pod)."""

    def __init__(self, client: Any, namespace: str, service: str) -> None:
        self.client, self.namespace, self.service = client, namespace, service
        self.addresses: list[str] = []
        self.left: dict[str, list[float]] = {}
        self._slices: dict[str, dict[str, Any]] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        version = self._list()
        self._thread = threading.Thread(target=self._run, args=(version,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread:
            self._thread.join(WATCH_SECONDS + 30)

    def _update(self) -> None:
        now, before = time.monotonic(), set(self.addresses)
        self.addresses = serving_addresses(self._slices.values())
        for address in before - set(self.addresses):
            self.left.setdefault(address, []).append(now)

    def _list(self) -> str:
        listed = _list_slices(self.client, self.namespace, self.service)
        self._slices = {item["metadata"]["name"]: item for item in listed["items"]}
        self._update()
        return listed["metadata"]["resourceVersion"]

    def _run(self, version: str | None) -> None:
        from kubernetes import client as k8s
        from kubernetes import watch

        api = k8s.DiscoveryV1Api(self.client)
        while not self._stopping.is_set():
            try:
                version = version or self._list()
                events = watch.Watch().stream(
                    api.list_namespaced_endpoint_slice,
                    self.namespace,
                    label_selector=f"kubernetes.io/service-name={self.service}",
                    resource_version=version,
                    timeout_seconds=WATCH_SECONDS,
                    _request_timeout=WATCH_SECONDS + 30,
                )
                # An ERROR event (410 Gone: the version is too old) raises: list again.
                for event in events:
                    item = event["raw_object"]
                    version = item["metadata"]["resourceVersion"]
                    name = item["metadata"]["name"]
                    if event["type"] == "DELETED":
                        self._slices.pop(name, None)
                    elif event["type"] != "BOOKMARK":
                        self._slices[name] = item
                    self._update()
                    if self._stopping.is_set():
                        break
            except Exception:  # a failed watch keeps the last view and lists again, as a proxy does
                version = None
                self._stopping.wait(0.2)


class StreamingLoad:
    """``concurrency`` clients, each sending one streamed completion after another, in a thread
    of its own, from ``start()`` until ``stop()`` (which returns the report). Setting ``active``
    (at most ``concurrency``) ramps the load: only that many clients send."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        service: str,
        model: str,
        *,
        concurrency: int,
        max_tokens: int,
    ) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.service = service
        self.model = model
        self.concurrency = concurrency
        self.max_tokens = max_tokens
        self.active = concurrency
        self.report = LoadReport()
        self.view = EndpointView(api_client, namespace, service)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self.view.start()
        assert self.view.addresses, "no ready endpoint to start the load on"
        self._thread.start()

    def completed(self) -> int:
        return self.report.completed

    def stop(self, timeout: float = READ_TIMEOUT + 60) -> LoadReport:
        self._stopping.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "requests still in flight after the load stopped"
        self.view.stop()
        for lost in self.report.lost:
            departures = self.view.left.get(lost.address or "", [])
            lost.left_view = next((when for when in departures if when >= lost.sent), None)
        return self.report

    async def _run(self) -> None:
        # A connection per request, as each client of a Service opens its own through
        # kube-proxy. Reusing idle ones races the server's keep-alive (uvicorn closes after 5 s,
        # VLLM_HTTP_TIMEOUT_KEEP_ALIVE): a proxy drops them sooner, but this client's idle clock
        # starts when its event loop gets to a response's end, seconds late on a starved
        # machine, and a request sent on a connection the server had just closed was reset.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        timeout = httpx.Timeout(READ_TIMEOUT, connect=10)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
            await asyncio.gather(*(self._client(http, i) for i in range(self.concurrency)))

    async def _client(self, http: httpx.AsyncClient, seed: int) -> None:
        rng = random.Random(seed)
        while not self._stopping.is_set():
            if seed >= self.active:
                await asyncio.sleep(0.2)
                continue
            addresses = self.view.addresses
            if not addresses:
                lost = Lost(time.strftime("%X"), None, time.monotonic(), "no ready endpoint")
                self.report.lost.append(lost)
                await asyncio.sleep(0.5)
                continue
            address = rng.choice(addresses)
            prompt = [rng.randrange(3, 250) for _ in range(8)]
            sent = time.monotonic()
            problem = await self._one_stream(http, address, prompt, sent)
            if problem:
                self.report.lost.append(Lost(time.strftime("%X"), address, sent, problem))
            else:
                self.report.completed += 1
                self.report.by_address[address] += 1

    async def _one_stream(
        self, http: httpx.AsyncClient, address: str, prompt: list[int], sent: float
    ) -> str:
        """'' when the stream ended as it must (its first token's time recorded), else what went
        wrong."""
        body = completion_body(self.model, prompt, self.max_tokens)
        problem, first_token = await stream_completion(http, address, body, sent)
        if not problem:
            self.report.first_tokens.append((sent, first_token))
        return problem


def completion_body(model: str, prompt: list[int] | str, max_tokens: int) -> dict[str, Any]:
    """A streamed completion of exactly `max_tokens` tokens."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }


async def stream_completion(
    http: httpx.AsyncClient, address: str, body: dict[str, Any], sent: float
) -> tuple[str, float]:
    """Streams a completion from `address` (`ip` or `ip:port`): ('', seconds from `sent` to its
    first token) when the stream ended as it must, else (what went wrong, 0)."""
    finish, done, first_token = None, False, 0.0
    try:
        host = address if ":" in address else f"{address}:{PORT}"
        async with http.stream("POST", f"http://{host}/v1/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return f"HTTP {response.status_code}: {text[:200]}", 0.0
            async for line in asse_lines(response.aiter_text()):
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    done = True
                    continue
                for choice in json.loads(data).get("choices") or ():
                    finish = choice.get("finish_reason") or finish
                    if not first_token:
                        first_token = time.monotonic() - sent
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return f"{type(exc).__name__}: {exc}", 0.0
    if finish != "length" or not done:
        return (
            f"stream ended with finish_reason={finish!r}, [DONE] {'seen' if done else 'missing'}",
            0.0,
        )
    return "", first_token
