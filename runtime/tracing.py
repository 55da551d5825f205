"""Request traces (``--otlp-traces-endpoint``): one OpenTelemetry span per request, as vLLM exports
them (span ``llm_request``, kind SERVER, vLLM's ``gen_ai.*`` attribute names), a child of the
W3C ``traceparent`` the client sent, so a trace runs from the gateway through the engine.

The span is built when the request's end reaches the front end (its statistics arrive with the
step's, through the stat-logger seam) and handed to the SDK's batch processor: its own thread
exports, a bounded queue drops when the collector is slow or gone, so tracing never waits on the
network in a request's path. The exporter is OTLP over gRPC, or over HTTP when
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`` (the SDK reads the other ``OTEL_*`` variables
itself: headers, timeouts, the batch processor's sizes).
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infernetes.runtime.engine.stats import FinishedRequestStats, IterationStats
from infernetes.runtime.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

SPAN_NAME = "llm_request"
TRACE_HEADERS = ("traceparent", "tracestate")
PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
PROTOCOLS = ("grpc", "http/protobuf")

# The trace context of the HTTP request being handled (set by the server's middleware): the
# engine reads it where the request enters, in the same task.
trace_headers: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "infernetes_trace_headers", default=None
)


class Attr:
    """vLLM's span attribute names (``vllm/tracing``), OpenTelemetry's GenAI conventions where
    they exist."""

    REQUEST_ID = "gen_ai.request.id"
    REQUEST_N = "gen_ai.request.n"
    REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
    REQUEST_TOP_P = "gen_ai.request.top_p"
    REQUEST_TEMPERATURE = "gen_ai.request.temperature"
    RESPONSE_MODEL = "gen_ai.response.model"
    USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
    USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
    LATENCY_IN_QUEUE = "gen_ai.latency.time_in_queue"
    LATENCY_TTFT = "gen_ai.latency.time_to_first_token"
    LATENCY_E2E = "gen_ai.latency.e2e"
    LATENCY_PREFILL = "gen_ai.latency.time_in_model_prefill"
    LATENCY_DECODE = "gen_ai.latency.time_in_model_decode"
    LATENCY_INFERENCE = "gen_ai.latency.time_in_model_inference"
    LATENCY_FORWARD = "gen_ai.latency.time_in_model_forward"
    LATENCY_EXECUTE = "gen_ai.latency.time_in_model_execute"


def headers_of(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The W3C trace-context headers among ``headers`` (names in lower case), or None."""
    found = {name: headers[name] for name in TRACE_HEADERS if name in headers}
    return found or None


@dataclass
class _Pending:
    context: Any  # the parent's OpenTelemetry context, or None
    params: SamplingParams
    children_left: int  # n > 1: the engine runs (and finishes) one request per choice


class RequestTracer:
    """Starts nothing itself: ``begin`` notes a request's parent context and parameters as it
    enters, ``record`` (a stat logger) exports the spans of the requests that ended."""

    def __init__(
        self, endpoint: str, model_name: str, detailed: Sequence[str] = (), exporter: Any = None
    ) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        resource = Resource.create(
            {"vllm.instrumenting_module_name": __name__, "vllm.process_id": str(os.getpid())}
        )
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(exporter or _exporter(endpoint)))
        self.tracer = self.provider.get_tracer(__name__)
        self.propagator = TraceContextTextMapPropagator()
        self.model_name = model_name
        self.forward = bool({"model", "all"} & set(detailed))
        self.execute = bool({"worker", "all"} & set(detailed))
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()

    def begin(self, request_id: str, params: SamplingParams | None) -> None:
        headers = trace_headers.get()
        context = self.propagator.extract(carrier=headers) if headers else None
        params = params or SamplingParams()
        with self._lock:
            self._pending[request_id] = _Pending(context, params, max(params.n, 1))

    def record(self, scheduler_stats: Any, iteration_stats: IterationStats) -> None:
        for finished in iteration_stats.finished_requests:
            pending = self._take(finished.request_id)
            if pending is not None:
                self._export(finished, pending)

    def shutdown(self) -> None:
        self.provider.shutdown()

    def _take(self, request_id: str) -> _Pending | None:
        # a choice of an n > 1 request runs as "{index}_{request id}"
        with self._lock:
            key = request_id
            if key not in self._pending and "_" in request_id:
                key = request_id.split("_", 1)[1]
            pending = self._pending.get(key)
            if pending is not None:
                pending.children_left -= 1
                if pending.children_left <= 0:
                    del self._pending[key]
            return pending

    def _export(self, finished: FinishedRequestStats, pending: _Pending) -> None:
        from opentelemetry.trace import SpanKind

        end_ns = time.time_ns()
        start_ns = end_ns - int(finished.e2e_latency * 1e9)
        span = self.tracer.start_span(
            SPAN_NAME,
            context=pending.context,
            kind=SpanKind.SERVER,
            start_time=start_ns,
            attributes=self._attributes(finished, pending.params),
        )
        span.end(end_time=end_ns)

    def _attributes(self, finished: FinishedRequestStats, params: SamplingParams) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            Attr.REQUEST_ID: finished.request_id,
            Attr.RESPONSE_MODEL: self.model_name,
            Attr.USAGE_PROMPT_TOKENS: finished.num_prompt_tokens,
            Attr.USAGE_COMPLETION_TOKENS: finished.num_generation_tokens,
            Attr.LATENCY_IN_QUEUE: finished.queued_time,
            Attr.LATENCY_TTFT: finished.time_to_first_token,
            Attr.LATENCY_E2E: finished.e2e_latency,
            Attr.LATENCY_PREFILL: finished.prefill_time,
            Attr.LATENCY_DECODE: finished.decode_time,
            Attr.LATENCY_INFERENCE: finished.inference_time,
            Attr.REQUEST_N: params.n,
            Attr.REQUEST_TEMPERATURE: params.temperature,
            Attr.REQUEST_TOP_P: params.top_p,
        }
        if finished.max_tokens_param is not None:
            attributes[Attr.REQUEST_MAX_TOKENS] = finished.max_tokens_param
        if self.forward:
            attributes[Attr.LATENCY_FORWARD] = finished.model_forward_time
        if self.execute:
            attributes[Attr.LATENCY_EXECUTE] = finished.model_execute_time
        return attributes


def _exporter(endpoint: str) -> Any:
    protocol = os.environ.get(PROTOCOL_ENV, "grpc")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint, insecure=True)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        return HttpExporter(endpoint=endpoint)
    raise ValueError(f"{PROTOCOL_ENV} must be one of {', '.join(PROTOCOLS)}; got {protocol!r}")


def request_tracer(config: Any, model_name: str) -> RequestTracer | None:
    """The tracer ``--otlp-traces-endpoint`` asks for, or None."""
    endpoint = getattr(config, "otlp_traces_endpoint", None)
    if not endpoint:
        return None
    logger.info("exporting request traces to %s", endpoint)
    return RequestTracer(
        endpoint, model_name, getattr(config, "collect_detailed_traces", None) or ()
    )
