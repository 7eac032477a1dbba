"""OTLP/HTTP /v1/metrics with the real OpenTelemetry SDK exporter as the client, and hostile bodies."""

import gzip
import json

import httpx
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from fleetscope import auth

EXAMPLE = "telemetry/otlp-json_ExportMetricsServiceRequest_example_opentelemetry-proto.json"


def headers(api, scope="ingest"):
    return {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "otlp", [scope])}


def test_sdk_exporter_delivers_dcgm_and_hw_metrics(api):
    exporter = OTLPMetricExporter(endpoint=api.url + "/v1/metrics", headers=headers(api), compression=Compression.Gzip, timeout=20)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(resource=Resource.create({"service.name": "dcgm-via-collector", "host.name": "node-7"}), metric_readers=[reader])
    meter = provider.get_meter("test")
    gpu = {"UUID": "GPU-aaaa", "gpu": "0", "Hostname": "node-1", "modelName": "NVIDIA H100 80GB HBM3"}
    meter.create_observable_gauge("DCGM_FI_DEV_GPU_TEMP", callbacks=[lambda _o: [Observation(61, gpu)]])
    meter.create_observable_gauge("DCGM_FI_DEV_FB_USED", callbacks=[lambda _o: [Observation(1024, gpu)]])
    meter.create_observable_gauge("DCGM_FI_DEV_GPU_UTIL", callbacks=[lambda _o: [Observation(87, gpu)]])
    meter.create_observable_gauge("hw.power", unit="W", callbacks=[lambda _o: [Observation(412.5, {"hw.id": "GPU-bbbb", "hw.type": "gpu"}), Observation(95.0, {"hw.id": "psu-1", "hw.type": "power_supply"})]])
    meter.create_counter("nccl.inspector.bus_bandwidth", unit="GBy/s").add(180.5, {"collective": "AllReduce"})
    assert provider.force_flush(timeout_millis=30_000)
    provider.shutdown()

    store = api.app.state.store
    rows = store.read("gpu_sample", columns=["gpu_uuid", "temp_c", "fb_used_bytes", "util_ratio", "power_w"])
    # force_flush and shutdown each export the observable gauges once: two instants per GPU.
    a = rows.filter(rows["gpu_uuid"] == "GPU-aaaa").select("temp_c", "fb_used_bytes", "util_ratio").unique().rows()
    assert a == [(61.0, 1024 * 2**20, 0.87)]
    assert set(rows.filter(rows["gpu_uuid"] == "GPU-bbbb")["power_w"]) == {412.5}
    assert not any(s.startswith("dcgm_fi") for s in store.read("metric_sample")["series"])
    assert store.read("gpu").filter(store.read("gpu")["gpu_uuid"] == "GPU-aaaa")["host"].to_list() == ["node-1"]
    series = store.read("metric_sample")["series"].to_list()
    # the power supply is not a GPU: it stays a series, as does the NCCL metric
    assert any(s.startswith("hw.power{") and 'hw.id="psu-1"' in s for s in series)
    assert any(s.startswith("nccl.inspector.bus_bandwidth{") and 'collective="AllReduce"' in s and 'host.name="node-7"' in s for s in series)


def test_official_example_json_gets_partial_success(api, realdata):
    body = (realdata / EXAMPLE).read_bytes()
    r = httpx.post(api.url + "/v1/metrics", content=body, headers={**headers(api), "Content-Type": "application/json"})
    assert r.status_code == 200
    ps = r.json()["partialSuccess"]
    assert int(ps["rejectedDataPoints"]) == 2 and "histogram" in ps["errorMessage"]
    got = api.app.state.store.read("metric_sample").sort("value")
    assert got["value"].to_list() == [5.0, 10.0]  # my.counter asDouble 5, my.gauge asDouble 10


def test_protobuf_body_and_non_finite_points(api):
    doc = {"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "DCGM_FI_DEV_POWER_USAGE", "gauge": {"dataPoints": [
        {"asDouble": 300.0, "timeUnixNano": "1772366400000000000", "attributes": [{"key": "UUID", "value": {"stringValue": "GPU-c"}}]},
        {"asDouble": "NaN", "timeUnixNano": "1772366401000000000", "attributes": [{"key": "UUID", "value": {"stringValue": "GPU-c"}}]},
        {"asDouble": 310.0, "timeUnixNano": "1772366402000000000"},
    ]}}]}]}]}
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest, ExportMetricsServiceResponse

    req = json_format.Parse(json.dumps(doc), ExportMetricsServiceRequest())
    r = httpx.post(api.url + "/v1/metrics", content=req.SerializeToString(), headers={**headers(api), "Content-Type": "application/x-protobuf"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-protobuf"
    resp = ExportMetricsServiceResponse.FromString(r.content)
    assert resp.partial_success.rejected_data_points == 2
    assert "non-finite" in resp.partial_success.error_message and "without a GPU id" in resp.partial_success.error_message
    assert api.app.state.store.read("gpu_sample", columns=["power_w"])["power_w"].to_list() == [300.0]


@pytest.mark.parametrize(
    ("content", "ctype", "encoding", "status"),
    [
        (b"\xff\xff\xff\xff garbage", "application/x-protobuf", None, 400),
        (b'{"resourceMetrics": [', "application/json", None, 400),
        (b'{"resourceMetrics": "nope"}', "application/json", None, 400),
        (b"\xff\xfe", "application/json", None, 400),
        (b"{}", "text/plain", None, 415),
        (gzip.compress(b"\x00" * (3 * 2**20)), "application/x-protobuf", "gzip", 413),
        (gzip.compress(b'{"resourceMetrics": []}')[:15], "application/json", "gzip", 400),
    ],
    ids=["protobuf-garbage", "truncated-json", "wrong-shape", "not-utf8", "content-type", "gzip-bomb", "truncated-gzip"],
)
def test_bad_bodies_are_refused_and_change_nothing(api, content, ctype, encoding, status):
    h = {**headers(api), "Content-Type": ctype}
    if encoding:
        h["Content-Encoding"] = encoding
    r = httpx.post(api.url + "/v1/metrics", content=content, headers=h)
    assert r.status_code == status, r.text
    if status == 400 and ctype == "application/x-protobuf":
        assert status_pb2.Status.FromString(r.content).code == 3  # INVALID_ARGUMENT
    assert sum(api.app.state.store.counts().values()) == 0


def test_needs_the_ingest_scope(api, realdata):
    body = (realdata / EXAMPLE).read_bytes()
    assert httpx.post(api.url + "/v1/metrics", content=body, headers={"Content-Type": "application/json"}).status_code == 401
    assert httpx.post(api.url + "/v1/metrics", content=body, headers={**headers(api, "read"), "Content-Type": "application/json"}).status_code == 403
    assert api.app.state.store.counts()["metric_sample"] == 0


def _sdk_request(observations: dict, resource: dict):
    """What the OpenTelemetry SDK would export for these observations: real instruments, a real reader and
    the OTLP exporter's own protobuf encoder."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(resource=Resource.create(resource), metric_readers=[reader])
    meter = provider.get_meter("test")
    for name, obs in observations.items():
        meter.create_observable_gauge(name, callbacks=[lambda _o, obs=obs: [Observation(v, a) for v, a in obs]])
    req = encode_metrics(reader.get_metrics_data())
    provider.shutdown()
    return req


def test_every_gpu_column_the_agent_sends_reads_back_to_the_same_value():
    """ingest.otlp.gpu_observations (the agent's side) and from_request (the server's) are inverse for every
    gpu_sample column: the semconv names in SI units, the rest as DCGM fields in DCGM's units."""
    import datetime as dt

    import polars as pl

    from fleetscope.frames import GPU_FIELDS, GPU_SAMPLE, Batch
    from ingest import nvml, otlp

    ts = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
    row = {"ts": ts, "gpu_uuid": "GPU-all"}
    for i, c in enumerate(GPU_FIELDS):
        row[c.name] = (i + 1) * (2**20 if c.name.endswith("_bytes") else 1) if c.dtype == pl.Int64 else 0.25 + i
    batch = Batch(gpu_sample=pl.DataFrame([row], schema=GPU_SAMPLE.schema),
                  gpu=pl.DataFrame([{"gpu_uuid": "GPU-all", "host": "node-9", "model_name": "NVIDIA H200", "pci_bus_id": "00000000:18:00.0"}]))
    obs = otlp.gpu_observations(batch)
    assert {"hw.gpu.utilization", "hw.gpu.memory.usage", "hw.power", "hw.energy", "hw.temperature", "DCGM_FI_DEV_FB_FREE"} <= set(obs)
    assert obs["DCGM_FI_DEV_FB_FREE"][0][0] == row["fb_free_bytes"] / 2**20  # MiB on the wire, as DCGM reports it
    back = otlp.from_request(_sdk_request(obs, {"host.name": "collector"}))
    assert back.meta["rejected_points"] == 0
    got = back.gpu_sample.row(0, named=True)
    for c in GPU_FIELDS:
        assert got[c.name] == pytest.approx(row[c.name], rel=1e-12), c.name
    assert back.gpu.row(0, named=True) == {"gpu_uuid": "GPU-all", "host": "node-9", "model_name": "NVIDIA H200", "pci_bus_id": "00000000:18:00.0"}

    # NVML reports XIDs as events, not as a field: the agent sends them as DCGM's last-XID field and the
    # server turns that into the same health event.
    nv = nvml.to_batch([{"uuid": "GPU-a", "power_mw": 250_000}], ts=ts, host="h", xids=[{"uuid": "GPU-a", "xid": 79}])
    back = otlp.from_request(_sdk_request(otlp.gpu_observations(nv), {"host.name": "h"}))
    assert back.gpu_sample.select("power_w", "xid_last").rows() == [(250.0, 79)]
    assert back.health_event.select("gpu_uuid", "host", "kind", "code", "message").rows() == [("GPU-a", "h", "xid", 79, "XID 79")]
