"""Inference servers' metrics over OTLP (as an OpenTelemetry Collector's prometheus receiver forwards a vLLM
scrape): cumulative histograms, sums and gauges become the serving rows the text body gives; delta
temporality and malformed histogram points are refused and counted."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from polars.testing import assert_frame_equal

from ingest import otlp, serving_metrics

BODY = Path(__file__).resolve().parents[2].parent / "shared" / "realdata" / "serving" / "vllm-v0_metrics_Llama-3.1-8B-FP8_kubeai-mock.prom"
TS = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
TS_NS = int(TS.timestamp()) * 10**9
CUMULATIVE, DELTA = 2, 1


def kv(k: str, v: str) -> KeyValue:
    return KeyValue(key=k, value=AnyValue(string_value=v))


def request_from_text(text: bytes, temporality: int = CUMULATIVE) -> ExportMetricsServiceRequest:
    """The request a Collector would send for the body's mapped families (serving frames of the text parse
    turned back into OTLP points), with the pod as a resource attribute."""
    b = serving_metrics.parse(text, server="vllm", source="s", ts=TS)
    names = {v.name: k for k, v in serving_metrics.TABLES["vllm"][1].items()}
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.extend([kv("k8s.pod.name", "llama-0"), kv("k8s.namespace.name", "serve")])
    sm = rm.scope_metrics.add()
    for (metric, model), g in b.serving_bucket.group_by("metric", "model"):
        m = sm.metrics.add(name="vllm:" + names[metric])
        m.histogram.aggregation_temporality = temporality
        p = m.histogram.data_points.add(time_unix_nano=TS_NS, count=int(g["count"][0]), sum=g["sum"][0])
        p.attributes.append(kv("model_name", model))
        rows = g.with_columns(pl.col("le").replace("+Inf", "inf").cast(pl.Float64).alias("b")).sort("b")
        cum = rows["cumulative_count"].to_list()
        p.explicit_bounds.extend(rows["b"].to_list()[:-1])
        p.bucket_counts.extend(int(c - (cum[i - 1] if i else 0)) for i, c in enumerate(cum))
    for frame, kind in (("serving_counter", "sum"), ("serving_gauge", "gauge")):
        for r in getattr(b, frame).filter(pl.col("metric") != "kv_cache_capacity_tokens").iter_rows(named=True):
            m = sm.metrics.add(name="vllm:" + next(k for k, v in serving_metrics.TABLES["vllm"][1].items() if v.name == r["metric"]))
            data = getattr(m, kind)
            if kind == "sum":
                data.aggregation_temporality = temporality
                data.is_monotonic = True
            p = data.data_points.add(time_unix_nano=TS_NS, as_double=r["value"])
            p.attributes.append(kv("model_name", r["model"]))
            if r["labels"]:
                k, v = r["labels"].split("=", 1)
                p.attributes.append(kv({"finish_reason": "finished_reason"}.get(k, k), v.strip('"')))
    return req


@pytest.mark.skipif(not BODY.is_file(), reason=f"real serving body not found at {BODY}")
@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_otlp_serving_points_equal_the_text_body(encoding):
    from google.protobuf import json_format

    text = BODY.read_bytes()
    req = request_from_text(text)
    data = req.SerializeToString() if encoding == "protobuf" else json_format.MessageToJson(req).encode()
    got = otlp.parse(data, encoding=encoding, source="s")
    want = serving_metrics.parse(text, server="vllm", source="s", ts=TS, replica="llama-0")
    key = ["metric", "model", "labels", "le"]
    assert_frame_equal(got.serving_bucket.sort(key), want.serving_bucket.sort(key))
    assert_frame_equal(got.serving_counter.sort(key[:3]), want.serving_counter.sort(key[:3]))
    g = want.serving_gauge.filter(pl.col("metric") != "kv_cache_capacity_tokens")
    assert_frame_equal(got.serving_gauge.sort(key[:3]), g.sort(key[:3]))
    r = got.serving_replica.filter(pl.col("deployment") == "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8").row(0, named=True)
    assert (r["pod"], r["namespace"], r["server"]) == ("llama-0", "serve", "vllm")
    assert got.meta["rejected_points"] == 0 and got.metric_sample is None


def test_delta_temporality_and_malformed_histograms_are_refused():
    req = ExportMetricsServiceRequest()
    sm = req.resource_metrics.add().scope_metrics.add()
    m = sm.metrics.add(name="vllm:time_to_first_token_seconds")
    m.histogram.aggregation_temporality = DELTA
    m.histogram.data_points.add(time_unix_nano=TS_NS, count=1, bucket_counts=[1, 0], explicit_bounds=[0.1])
    bad = sm.metrics.add(name="vllm:e2e_request_latency_seconds")
    bad.histogram.aggregation_temporality = CUMULATIVE
    bad.histogram.data_points.add(time_unix_nano=TS_NS, count=1, bucket_counts=[1], explicit_bounds=[0.1, 1.0])
    got = otlp.parse(req.SerializeToString(), encoding="protobuf", source="s")
    assert got.meta["rejected_points"] == 2 and got.serving_bucket is None
    assert any("delta temporality" in k for k in got.meta["rejected_reasons"])
    assert any("1 counts for 2 bounds" in k for k in got.meta["rejected_reasons"])


@pytest.mark.skipif(not BODY.is_file(), reason=f"real serving body not found at {BODY}")
def test_otlp_serving_through_the_api(api):
    import httpx

    from fleetscope.services import auth

    token = auth.create_token(api.app.state.store.engine, "collector", ["ingest"])
    r = httpx.post(api.url + "/v1/metrics", content=request_from_text(BODY.read_bytes()).SerializeToString(),
                   headers={"Authorization": f"Bearer {token}", "Content-Type": "application/x-protobuf"}, timeout=60)
    assert r.status_code == 200, r.text
    stored = api.app.state.store.read("serving_bucket")
    assert stored.filter((pl.col("metric") == "ttft_seconds") & (pl.col("le") == "+Inf"))["cumulative_count"].to_list() == [9.0]
