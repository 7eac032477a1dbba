"""Fleetscope watching itself: Prometheus counters for /metrics and OpenTelemetry tracing.

Tracing is off by default (a no-op tracer costs nothing on the hot path); ``FLEETSCOPE_OTEL_EXPORTER``
turns on a console or OTLP/HTTP exporter. Spans wrap ingest, store writes and Celery tasks.
"""

from __future__ import annotations

import threading

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

ROWS_WRITTEN = Counter("fleetscope_rows_written", "Rows written to the store, by frame", ["frame"], registry=REGISTRY)
VALUES_WRITTEN = Counter("fleetscope_values_written", "Telemetry values written to the store", registry=REGISTRY)
BATCHES_REJECTED = Counter("fleetscope_batches_rejected", "Batches rejected whole, by reason", ["reason"], registry=REGISTRY)
REQUEST_SECONDS = Histogram(
    "fleetscope_http_request_duration_seconds",
    "API request latency",
    ["method", "route", "status"],
    registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
INGEST_GROUP_PUSHES = Histogram(
    "fleetscope_ingest_group_pushes", "Pushes written together in one group commit", registry=REGISTRY,
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
INGEST_REFUSED_OVERLOAD = Counter("fleetscope_ingest_refused_overload", "Pushes refused with 503 because too many were waiting", registry=REGISTRY)
TASKS = Counter("fleetscope_tasks", "Celery task outcomes, by task and state", ["task", "state"], registry=REGISTRY)

_configured = False
_lock = threading.Lock()


def setup_tracing(exporter: str, endpoint: str = "", service_name: str = "fleetscope") -> None:
    """Install a tracer provider once per process. ``exporter`` is none, console or otlp."""
    global _configured
    with _lock:
        if _configured or exporter == "none":
            return
        from opentelemetry.sdk.resources import Resource  # lazy: OpenTelemetry SDK, only when used
        from opentelemetry.sdk.trace import TracerProvider  # lazy: OpenTelemetry SDK, only when used
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter  # lazy: OpenTelemetry SDK, only when used

        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        if exporter == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif exporter == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # lazy: OpenTelemetry SDK, only when used

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        else:
            raise ValueError(f"unknown tracing exporter {exporter!r}: expected none, console or otlp")
        trace.set_tracer_provider(provider)
        _configured = True


def tracer() -> trace.Tracer:
    return trace.get_tracer("fleetscope")
