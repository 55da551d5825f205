"""Request traces: a server with ``--otlp-traces-endpoint`` exports one ``llm_request`` span per
request, with vLLM's attributes, to a real OTLP/gRPC receiver (the collector's service, served
here by grpcio with OpenTelemetry's own protobuf definitions); the span continues the
``traceparent`` the client sent; a receiver that is gone costs no request."""

from __future__ import annotations

import queue
from concurrent import futures

import grpc
import pytest
import requests
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.server.ports import free_port

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span exported to it, as a collector's OTLP receiver would take them."""

    def __init__(self) -> None:
        self.spans: queue.Queue = queue.Queue()

    def Export(self, request, context):
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.put(span)
        return trace_service_pb2.ExportTraceServiceResponse()

    def next_span(self, timeout: float = 30.0):
        return self.spans.get(timeout=timeout)


@pytest.fixture(scope="module")
def receiver():
    port = free_port()
    servicer = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    servicer.endpoint = f"http://127.0.0.1:{port}"
    yield servicer
    server.stop(grace=None)


@pytest.fixture(scope="module")
def traced_server(tiny_llama_dir, server_process_factory, receiver):
    with server_process_factory(
        [
            str(tiny_llama_dir),
            "--served-model-name",
            "model",
            "--max-model-len",
            "128",
            "--otlp-traces-endpoint",
            receiver.endpoint,
            "--collect-detailed-traces",
            "all",
        ],
        # export each span at once rather than after the SDK's 5 s batch delay
        env={"OTEL_BSP_SCHEDULE_DELAY": "50"},
        log_name="traced-server.log",
    ) as server:
        yield server


def _attributes(span) -> dict:
    values = {}
    for item in span.attributes:
        value = item.value
        values[item.key] = getattr(value, value.WhichOneof("value"))
    return values


def test_a_request_is_one_span_continuing_the_callers_trace(traced_server, receiver):
    response = requests.post(
        f"{traced_server.url}/v1/completions",
        json={"model": "model", "prompt": "hello there", "max_tokens": 5, "temperature": 0.5},
        headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    span = receiver.next_span()
    assert span.name == "llm_request"
    assert span.kind == span.SPAN_KIND_SERVER
    assert span.trace_id.hex() == TRACE_ID
    assert span.parent_span_id.hex() == PARENT_ID
    attributes = _attributes(span)
    usage = response.json()["usage"]
    assert attributes["gen_ai.usage.prompt_tokens"] == usage["prompt_tokens"]
    assert attributes["gen_ai.usage.completion_tokens"] == usage["completion_tokens"] == 5
    assert attributes["gen_ai.request.max_tokens"] == 5
    assert attributes["gen_ai.request.temperature"] == pytest.approx(0.5)
    assert attributes["gen_ai.request.id"].startswith("cmpl-")
    latencies = {k: v for k, v in attributes.items() if k.startswith("gen_ai.latency.")}
    assert set(latencies) >= {
        "gen_ai.latency.time_in_queue",
        "gen_ai.latency.time_to_first_token",
        "gen_ai.latency.e2e",
        "gen_ai.latency.time_in_model_prefill",
        "gen_ai.latency.time_in_model_decode",
        "gen_ai.latency.time_in_model_inference",
        "gen_ai.latency.time_in_model_forward",
        "gen_ai.latency.time_in_model_execute",
    }
    e2e = latencies["gen_ai.latency.e2e"]
    assert 0 < latencies["gen_ai.latency.time_to_first_token"] <= e2e
    assert latencies["gen_ai.latency.time_in_model_forward"] > 0
    assert (
        latencies["gen_ai.latency.time_in_model_forward"]
        <= latencies["gen_ai.latency.time_in_model_execute"]
        <= e2e
    )
    assert (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9 == pytest.approx(
        e2e, abs=1e-3
    )


def test_without_a_traceparent_the_span_starts_a_trace(traced_server, receiver):
    response = requests.post(
        f"{traced_server.url}/v1/chat/completions",
        json={"model": "model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    span = receiver.next_span()
    assert span.parent_span_id == b""
    assert _attributes(span)["gen_ai.request.id"].startswith("chatcmpl-")


def test_a_receiver_that_is_gone_costs_no_request(tiny_llama_dir, server_process_factory):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with server_process_factory(
        [
            str(tiny_llama_dir),
            "--served-model-name",
            "model",
            "--max-model-len",
            "128",
            "--otlp-traces-endpoint",
            dead,
        ],
        env={"OTEL_BSP_SCHEDULE_DELAY": "50"},
        log_name="dead-receiver-server.log",
    ) as server:
        for _ in range(5):
            response = requests.post(
                f"{server.url}/v1/completions",
                json={"model": "model", "prompt": "hello", "max_tokens": 3},
                headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
                timeout=60,
            )
            assert response.status_code == 200, response.text
        # each answered while the exporter retried in the background (what it costs in time
        # the bench measures); the server is still up and ready
        assert server.process.poll() is None
        assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
