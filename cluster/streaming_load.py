"""Steady streamed load on a Service's endpoints, balanced by the client itself.

There is no kube-proxy on the local control plane, so this client does what kube-proxy or a
gateway would: it sends each request to one of the Service's ready endpoints (EndpointSlices
polled every ENDPOINT_POLL_S; a terminating pod's endpoint is not ready) and never retries. A
request that fails in any way is lost: an HTTP error, a broken connection, a stream without a
finish_reason of "length" or without its ``[DONE]``, or no ready endpoint to send it to.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

ENDPOINT_POLL_S = 0.5
PORT = 8000


@dataclass
class LoadReport:
    completed: int = 0
    lost: list[str] = field(default_factory=list)
    by_address: Counter[str] = field(default_factory=Counter)
    # (time.monotonic() when sent, seconds to its first token) of every completed stream
    first_tokens: list[tuple[float, float]] = field(default_factory=list)


def ready_addresses(client: Any, namespace: str, service: str) -> list[str]:
    """The Service's ready, non-terminating endpoint addresses (a kubernetes ApiClient)."""
    from kubernetes import client as k8s

    slices = k8s.DiscoveryV1Api(client).list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={service}"
    )
    return sorted(
        address
        for item in slices.items
        for endpoint in item.endpoints or ()
        if endpoint.conditions and endpoint.conditions.ready and not endpoint.conditions.terminating
        for address in endpoint.addresses
    )


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
        self.addresses: list[str] = []
        self._view_asked = time.monotonic()  # when the API server was asked for `addresses`
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self.addresses = ready_addresses(self.api_client, self.namespace, self.service)
        self._view_asked = time.monotonic()
        assert self.addresses, "no ready endpoint to start the load on"
        self._thread.start()

    def completed(self) -> int:
        return self.report.completed

    def stop(self, timeout: float = 180) -> LoadReport:
        self._stopping.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "requests still in flight after the load stopped"
        return self.report

    async def _run(self) -> None:
        # An idle connection is dropped here before the server closes it (uvicorn after 5 s,
        # VLLM_HTTP_TIMEOUT_KEEP_ALIVE), as a proxy's idle timeout must be shorter than its
        # upstream's: otherwise a request sent as the server closes is reset.
        limits = httpx.Limits(
            max_connections=None, max_keepalive_connections=None, keepalive_expiry=2
        )
        timeout = httpx.Timeout(120, connect=10)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
            poller = asyncio.create_task(self._poll_endpoints())
            await asyncio.gather(*(self._client(http, i) for i in range(self.concurrency)))
            poller.cancel()

    async def _poll_endpoints(self) -> None:
        while True:
            await asyncio.sleep(ENDPOINT_POLL_S)
            asked = time.monotonic()
            try:
                found = await asyncio.to_thread(
                    ready_addresses, self.api_client, self.namespace, self.service
                )
            except Exception:  # a failed poll keeps the last view, as a proxy does
                continue
            self.addresses, self._view_asked = found, asked

    async def _client(self, http: httpx.AsyncClient, seed: int) -> None:
        rng = random.Random(seed)
        while not self._stopping.is_set():
            if seed >= self.active:
                await asyncio.sleep(0.2)
                continue
            if not self.addresses:
                self.report.lost.append(f"{time.strftime('%X')} no ready endpoint")
                await asyncio.sleep(0.5)
                continue
            address = rng.choice(self.addresses)
            view_age = time.monotonic() - self._view_asked
            prompt = [rng.randrange(3, 250) for _ in range(8)]
            sent = time.monotonic()
            problem = await self._one_stream(http, address, prompt, sent)
            if problem:
                self.report.lost.append(
                    f"{time.strftime('%X')} {address} (endpoints as of {view_age:.1f} s before "
                    f"sending): {problem}"
                )
            else:
                self.report.completed += 1
                self.report.by_address[address] += 1

    async def _one_stream(
        self, http: httpx.AsyncClient, address: str, prompt: list[int], sent: float
    ) -> str:
        """'' when the stream ended as it must (its first token's time recorded), else what went
        wrong."""
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        finish, done, first_token = None, False, 0.0
        try:
            url = f"http://{address}:{PORT}/v1/completions"
            async with http.stream("POST", url, json=body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    return f"HTTP {response.status_code}: {text[:200]}"
                async for line in response.aiter_lines():
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
            return f"{type(exc).__name__}: {exc}"
        if finish != "length" or not done:
            return f"stream ended with finish_reason={finish!r}, [DONE] {'seen' if done else 'missing'}"
        self.report.first_tokens.append((sent, first_token))
        return ""
