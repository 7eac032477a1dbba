"""OpenTelemetry spans around store writes, with the SDK's in-memory exporter."""

import datetime as dt

import polars as pl
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fleetscope.store import db
from fleetscope.core import frames as F
from fleetscope.core.errors import ValidationError
from fleetscope.observability import setup_tracing
from fleetscope.store import Store


@pytest.fixture(scope="module")
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def test_store_write_and_read_are_traced(spans, tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    db.upgrade(url)
    store = Store.open(url)
    spans.clear()
    store.write(F.Batch(source="unit", gpu_sample=pl.DataFrame({"ts": [dt.datetime(2026, 1, 1, tzinfo=dt.UTC)], "gpu_uuid": ["g"], "power_w": [1.0]})))
    store.read("gpu_sample")
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert by_name["store.write"].attributes["fleetscope.source"] == "unit"
    assert by_name["store.write"].attributes["fleetscope.rows"] == 1
    assert by_name["store.write"].attributes["db.system"] == "sqlite"
    assert by_name["store.read"].attributes["fleetscope.frame"] == "gpu_sample"


def test_a_rejected_write_records_the_error_on_its_span(spans, tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    db.upgrade(url)
    spans.clear()
    with pytest.raises(ValidationError):
        Store.open(url).write(F.Batch(gpu_sample=pl.DataFrame({"ts": ["bad"], "gpu_uuid": ["g"]})))
    (span,) = [s for s in spans.get_finished_spans() if s.name == "store.write"]
    assert span.status.status_code == trace.StatusCode.ERROR


def test_unknown_exporter_is_refused():
    with pytest.raises(ValueError, match="expected none, console or otlp"):
        setup_tracing("zipkin")
