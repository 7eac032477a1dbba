"""OTLP/HTTP /v1/metrics with the real OpenTelemetry SDK exporter as the client, and hostile bodies."""

import gzip
import json

import httpx
import polars as pl
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from fleetscope.services import auth

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
        (b"not gzip at all, whatever the header says", "application/x-protobuf", "gzip", 400),
    ],
    ids=["protobuf-garbage", "truncated-json", "wrong-shape", "not-utf8", "content-type", "gzip-bomb", "truncated-gzip", "not-gzip"],
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
    """ingest.otlp_export.gpu_observations (the agent's side) and from_request (the server's) are inverse for every
    gpu_sample column: the semconv names in SI units, the rest as DCGM fields in DCGM's units."""
    import datetime as dt

    import polars as pl

    from fleetscope.core.frames import GPU_FIELDS, GPU_SAMPLE, Batch
    from ingest import nvml, otlp, otlp_export

    ts = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
    row = {"ts": ts, "gpu_uuid": "GPU-all"}
    for i, c in enumerate(GPU_FIELDS):
        row[c.name] = (i + 1) * (2**20 if c.name.endswith("_bytes") else 1) if c.dtype == pl.Int64 else 0.25 + i
    batch = Batch(gpu_sample=pl.DataFrame([row], schema=GPU_SAMPLE.schema),
                  gpu=pl.DataFrame([{"gpu_uuid": "GPU-all", "host": "node-9", "model_name": "NVIDIA H200", "pci_bus_id": "00000000:18:00.0"}]))
    obs = otlp_export.gpu_observations(batch)
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
    back = otlp.from_request(_sdk_request(otlp_export.gpu_observations(nv), {"host.name": "h"}))
    assert back.gpu_sample.select("power_w", "xid_last").rows() == [(250.0, 79)]
    assert back.health_event.select("gpu_uuid", "host", "kind", "code", "message").rows() == [("GPU-a", "h", "xid", 79, "XID 79")]


# NCCL Inspector's OTLP export (NVIDIA/nccl plugins/profiler/inspector/inspector_otel.cc): per-operation
# attributes of verbose mode, as inspectorOtelAddCommonAttr + inspectorOtelAddCompletedColl/P2p write them.
def _inspector_coll_attrs(gpu: str, sn: int, **over: str) -> dict:
    return {"version": "v5.2", "node": "nvl72004-T01", "gpu": gpu, "comm_name": "DP Group 0", "comm_id": "0x7f8c496ae9f661",
            "n_nodes": "1", "nranks": "4", "coll_msg_size_bytes": "4294967296", "collective": "AllReduce", "coll_sn": str(sn),
            "algo_proto": "Ring_LL", **over}


def test_nccl_inspector_verbose_otlp_becomes_collective_rows(api):
    """Verbose NCCL Inspector points sent with the real SDK exporter: the three metrics of one operation meet
    on one collective row per GPU; P2P rows keep their peer; malformed operation points are rejected with
    their reason and write nothing."""
    from ingest.otlp_mapping import _inspector_op  # the stand-in rank, to name the expected rows

    exporter = OTLPMetricExporter(endpoint=api.url + "/v1/metrics", headers=headers(api), timeout=20)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(resource=Resource.create({"service.name": "nccl-inspector", "slurm.job.id": "4242"}), metric_readers=[reader])
    meter = provider.get_meter("nccl-inspector")
    ops = [(_inspector_coll_attrs("GPU0", 17), 678.263, 9498.47, 452.175), (_inspector_coll_attrs("GPU1", 17), 640.5, 10058.0, 427.0)]
    p2p = {"version": "v5.2", "node": "nvl72004-T01", "gpu": "GPU0", "comm_name": "DP Group 0", "comm_id": "0x7f8c496ae9f661",
           "n_nodes": "1", "nranks": "4", "p2p_msg_size_bytes": "536870912", "p2p_operation": "Send", "p2p_sn": "3", "p2p_peer": "1"}
    bad = [_inspector_coll_attrs("GPU2", 18, coll_sn="x17"), {k: v for k, v in _inspector_coll_attrs("GPU3", 18).items() if k != "comm_id"}]
    meter.create_observable_gauge("nccl_bus_bandwidth_gbs", unit="GB/s", callbacks=[
        lambda _o: [Observation(bw, a) for a, bw, _, _ in ops] + [Observation(1.0, a) for a in bad]])
    meter.create_observable_gauge("nccl_collective_exec_time_microseconds", unit="us", callbacks=[lambda _o: [Observation(us, a) for a, _, us, _ in ops]])
    meter.create_observable_gauge("nccl_collective_algobw_gbs", unit="GB/s", callbacks=[lambda _o: [Observation(alg, a) for a, _, _, alg in ops]])
    meter.create_observable_gauge("nccl_p2p_bus_bandwidth_gbs", unit="GB/s", callbacks=[lambda _o: [Observation(464.9, p2p)]])
    meter.create_observable_gauge("nccl_p2p_exec_time_microseconds", unit="us", callbacks=[lambda _o: [Observation(1154.87, p2p)]])
    meter.create_observable_gauge("nccl_collectives_dropped_total", unit="1", callbacks=[lambda _o: [Observation(3, {"version": "v5.1", "node": "nvl72004-T01", "gpu": "GPU0"})]])
    assert provider.force_flush(timeout_millis=30_000)
    provider.shutdown()

    store = api.app.state.store
    rows = store.read("collective").sort("op", "rank")
    rank0, rank1 = (_inspector_op("coll", _inspector_coll_attrs(g, 17), "4242")[0][1] for g in ("GPU0", "GPU1"))
    assert rank0 < 0 and rank1 < 0 and rank0 != rank1
    coll = rows.filter(pl.col("op") == "AllReduce").sort("busbw_gbps", descending=True)
    assert coll.select("job_id", "rank", "comm_id", "seq", "peer", "bytes", "nranks", "algo", "proto", "host", "start").rows() == [
        ("4242", rank0, "0x7f8c496ae9f661", 17, -1, 4294967296, 4, "Ring", "LL", "nvl72004-T01", None),
        ("4242", rank1, "0x7f8c496ae9f661", 17, -1, 4294967296, 4, "Ring", "LL", "nvl72004-T01", None)]
    assert coll["busbw_gbps"].to_list() == [678.263, 640.5]
    assert coll["duration_s"].to_list() == pytest.approx([9498.47e-6, 10058e-6])
    assert coll["algbw_gbps"].to_list() == [452.175, 427.0]
    send = rows.filter(pl.col("op") == "Send").row(0, named=True)
    assert (send["comm_id"], send["seq"], send["peer"], send["bytes"], send["busbw_gbps"], send["algbw_gbps"]) == (
        "0x7f8c496ae9f661#p2p", 3, 1, 536870912, 464.9, None)
    assert send["duration_s"] == pytest.approx(1154.87e-6)
    # the device counter is an aggregate: a series; the malformed operation points went nowhere
    series = store.read("metric_sample")
    # (force_flush and shutdown each export the observable gauges once: two instants)
    assert series["value"].to_list() == [3.0, 3.0] and series["series"].n_unique() == 1
    assert series["series"][0].startswith('nccl_collectives_dropped_total{gpu="GPU0",node="nvl72004-T01",')
    assert 'slurm.job.id="4242"' in series["series"][0]
    assert rows.height == 3


def test_nccl_inspector_aggregated_json_as_the_plugin_writes_it(api, realdata):
    """The plugin's default export, byte for byte in the shape inspectorOtelAppendBody writes (OTLP/JSON, one
    gauge per metric, string attributes, asDouble), with the values of the README's v5.1 example: bucket
    aggregates, so metric_sample series; an operation point with a broken sequence number is rejected."""
    prom = (realdata / "telemetry/nccl-inspector_prometheus-textfile-examples_v5.1_from-README.prom").read_text()
    value = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in prom.splitlines()}

    def attrs(d: dict) -> list:
        return [{"key": k, "value": {"stringValue": v}} for k, v in d.items()]

    bucket = {"gpu": "GPU0", "comm_name": "DP Group 0", "version": "v5.1", "node": "nvl72004-T01", "n_nodes": "1", "nranks": "4",
              "message_size": "4-5GB", "collective": "AllReduce", "algo_proto": "Ring_ll"}
    t = "1772366400000000000"
    doc = {"resourceMetrics": [{"resource": {"attributes": attrs({"service.name": "nccl-inspector"})}, "scopeMetrics": [{
        "scope": {"name": "nccl-inspector"}, "metrics": [
            {"name": "nccl_bus_bandwidth_gbs", "description": "NCCL bus bandwidth for collective operations", "unit": "GB/s",
             "gauge": {"dataPoints": [{"attributes": attrs(bucket), "timeUnixNano": t, "asDouble": value["nccl_bus_bandwidth_gbs"]},
                                      {"attributes": attrs(_inspector_coll_attrs("GPU0", 1, coll_sn="-1")), "timeUnixNano": t, "asDouble": 1.0}]}},
            {"name": "nccl_collective_exec_time_microseconds", "description": "NCCL collective execution time", "unit": "us",
             "gauge": {"dataPoints": [{"attributes": attrs(bucket), "timeUnixNano": t, "asDouble": value["nccl_collective_exec_time_microseconds"]}]}},
        ]}]}]}
    r = httpx.post(api.url + "/v1/metrics", content=json.dumps(doc), headers={**headers(api), "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    ps = r.json()["partialSuccess"]
    assert int(ps["rejectedDataPoints"]) == 1 and "valid coll_sn" in ps["errorMessage"]
    store = api.app.state.store
    assert store.counts()["collective"] == 0
    got = dict(zip(store.read("metric_sample")["series"].str.split("{").list.first(), store.read("metric_sample")["value"]))
    assert got == {"nccl_bus_bandwidth_gbs": 678.263, "nccl_collective_exec_time_microseconds": 9498.47}


@pytest.mark.parametrize(("attrs", "value", "reason"), [
    (_inspector_coll_attrs("GPU0", 1, coll_sn="x17"), 1.0, "no valid coll_sn ('x17')"),
    (_inspector_coll_attrs("GPU0", 1, coll_sn="99999999999999999999"), 1.0, "no valid coll_sn"),
    (_inspector_coll_attrs("GPU0", 1, coll_msg_size_bytes="4e9"), 1.0, "no valid coll_msg_size_bytes"),
    (_inspector_coll_attrs("GPU0", 1, nranks="0"), 1.0, "no valid nranks"),
    (_inspector_coll_attrs("GPU0", 1, comm_id="unknown"), 1.0, "no communicator id"),
    (_inspector_coll_attrs("GPU0", 1, collective=""), 1.0, "no operation name"),
    (_inspector_coll_attrs("GPU0", 1), -5.0, "negative value"),
], ids=["sn-text", "sn-overflow", "size-float", "nranks-zero", "comm-unknown", "no-op", "negative"])
def test_malformed_inspector_operation_points_are_rejected_with_the_reason(attrs, value, reason):
    from ingest import otlp

    batch = otlp.from_request(_sdk_request({"nccl_bus_bandwidth_gbs": [(value, attrs)]}, {"service.name": "nccl-inspector"}))
    assert batch.collective is None and batch.metric_sample is None
    assert batch.meta["rejected_points"] == 1 and reason in next(iter(batch.meta["rejected_reasons"]))


def test_malformed_protobuf_is_a_400_that_says_where(api):
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    req = ExportMetricsServiceRequest()
    m = req.resource_metrics.add().scope_metrics.add().metrics.add(name="DCGM_FI_DEV_GPU_TEMP")
    m.gauge.data_points.add(time_unix_nano=1772366400000000000, as_double=60.0).attributes.add(key="UUID").value.string_value = "GPU-a"
    body = req.SerializeToString()
    for cut, says in ((body[:-3], f"claims {len(body) - 2} bytes but only {len(body) - 5} remain"), (body[:1], "truncated varint at byte 1")):
        r = httpx.post(api.url + "/v1/metrics", content=gzip.compress(cut), headers={**headers(api), "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
        assert r.status_code == 400
        st = status_pb2.Status.FromString(r.content)
        assert st.code == 3 and says in st.message, st.message
    assert sum(api.app.state.store.counts().values()) == 0


@pytest.mark.parametrize(
    ("content", "ctype", "encoding"),
    [
        (None, "application/json", None),
        (b"\xff\xff\xff\xff garbage", "application/x-protobuf", None),
        (gzip.compress(b"\x00" * (3 * 2**20)), "application/x-protobuf", "gzip"),
        (b"not gzip at all, whatever the header says", "application/x-protobuf", "gzip"),
    ],
    ids=["example", "protobuf-garbage", "gzip-bomb", "not-gzip"],
)
def test_the_agents_lane_answers_otlp_as_the_route_does(api, realdata, monkeypatch, content, ctype, encoding):
    """A plain OTLP push is answered by the lane (``api.fastlane``), one with a query by the FastAPI route;
    both give the same status and body, and the example's points are stored once."""
    from fleetscope.api import fastlane

    taken = []
    lane = fastlane._otlp

    async def spy(*args):
        taken.append(await lane(*args))
        return taken[-1]

    monkeypatch.setattr(fastlane, "_otlp", spy)
    body = content if content is not None else (realdata / EXAMPLE).read_bytes()
    h = {**headers(api), "Content-Type": ctype}
    if encoding:
        h["Content-Encoding"] = encoding
    by_lane = httpx.post(api.url + "/v1/metrics", content=body, headers=h)
    by_route = httpx.post(api.url + "/v1/metrics?via=route", content=body, headers=h)
    assert taken == [True, False]
    assert (by_lane.status_code, by_lane.content) == (by_route.status_code, by_route.content)
    if content is None:
        assert by_lane.status_code == 200
        # the re-sent body (same content hash) wrote nothing new
        assert api.app.state.store.counts()["metric_sample"] > 0
        n = api.app.state.store.counts()["metric_sample"]
        httpx.post(api.url + "/v1/metrics", content=body, headers=h)
        assert api.app.state.store.counts()["metric_sample"] == n
    else:
        assert by_lane.status_code in (400, 413)
        assert sum(api.app.state.store.counts().values()) == 0


def test_a_templated_agent_push_is_read_on_the_event_loop(api, monkeypatch):
    """An agent's request whose template the service knows is read without a worker thread and stored as
    the thread's way stores it; a first sight, or a body past the inline bounds, takes the thread."""
    import importlib.util
    from pathlib import Path

    from fleetscope.api import routes_otlp
    from ingest import otlp_template

    spec = importlib.util.spec_from_file_location("_bench_otlp", Path(__file__).resolve().parents[2] / "benchmarks" / "ingest_otlp.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    threaded = []
    real = routes_otlp.run_in_threadpool

    async def counting(fn, *args):
        threaded.append(fn.__name__)
        return await real(fn, *args)

    monkeypatch.setattr(routes_otlp, "run_in_threadpool", counting)
    otlp_template.clear()
    h = {**headers(api), "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
    import time

    t_ns = (int(time.time()) - 3600) * 10**9  # an hour ago: inside the future-skew horizon
    answers = []
    for r in range(3):
        body = gzip.compress(bench.build_request(8, t_ns + r * 10**10, first=8))
        answers.append(httpx.post(api.url + "/v1/metrics", content=body, headers=h))
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert answers[0].content == answers[1].content == answers[2].content
    assert threaded == ["_decode"]  # only the first sight
    samples = api.app.state.store.read("gpu_sample")
    assert samples.height == 24 and samples["ts"].n_unique() == 3
    assert samples.sort("ts", "gpu_uuid")["temp_c"].to_list()[:8] == samples.sort("ts", "gpu_uuid")["temp_c"].to_list()[8:16]
    monkeypatch.setattr(routes_otlp, "INLINE_MAX_BYTES", 10)
    assert httpx.post(api.url + "/v1/metrics", content=gzip.compress(bench.build_request(8, t_ns + 30 * 10**9, first=8)),
                      headers=h).status_code == 200
    assert threaded == ["_decode", "_decode"]
    assert api.app.state.store.read("gpu_sample").height == 32


def test_a_templated_push_dated_past_the_horizon_is_refused_whole(api):
    """A body a template reads carries its scrape's one time on the walk, which the door's future-skew check
    reads instead of each metric's times: a late body must still be refused, naming a GPU, with nothing
    stored; and a body at the horizon's near side goes in."""
    import importlib.util
    import time
    from pathlib import Path

    from ingest import otlp_template

    spec = importlib.util.spec_from_file_location("_bench_otlp", Path(__file__).resolve().parents[2] / "benchmarks" / "ingest_otlp.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    otlp_template.clear()
    h = {**headers(api), "Content-Type": "application/x-protobuf"}
    now_ns = int(time.time()) * 10**9
    assert httpx.post(api.url + "/v1/metrics", content=bench.build_request(8, now_ns - 3600 * 10**9, first=8), headers=h).status_code == 200
    stored = api.app.state.store.counts()
    late = bench.build_request(8, now_ns + 3 * 3600 * 10**9, first=8)  # the default horizon is 15 minutes
    assert otlp_template.lookup(late) is not None  # the template's way, whose walk carries the one time
    r = httpx.post(api.url + "/v1/metrics", content=late, headers=h)
    assert r.status_code == 400 and b"gpu_sample of 'GPU-" in r.content and b"FLEETSCOPE_MAX_FUTURE_SKEW_S" in r.content, r.content
    assert api.app.state.store.counts() == stored
    ok = bench.build_request(8, now_ns + 60 * 10**9, first=8)
    assert httpx.post(api.url + "/v1/metrics", content=ok, headers=h).status_code == 200
    assert api.app.state.store.counts()["gpu_sample"] == stored["gpu_sample"] + 8


def test_an_otlp_body_sent_again_is_known_by_its_bytes_as_they_came_whichever_way_it_was_read(api):
    """The content hash of an OTLP request is taken over its body as it arrived (gzip and all): a first sight
    read in the worker thread and the same bytes again, now read from the template on the event loop, are one
    input, and the second writes nothing; the same readings sent uncompressed are another input whose rows
    are all stored already."""
    import importlib.util
    import time
    from pathlib import Path

    from ingest import otlp_template
    from fleetscope.store import content_hash

    spec = importlib.util.spec_from_file_location("_bench_otlp", Path(__file__).resolve().parents[2] / "benchmarks" / "ingest_otlp.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    otlp_template.clear()
    h = {**headers(api), "Content-Type": "application/x-protobuf"}
    raw = bench.build_request(8, (int(time.time()) - 600) * 10**9, first=64)
    gz = gzip.compress(raw)
    engine = api.app.state.store.engine

    def logged() -> list[str]:
        from sqlalchemy import text

        with engine.connect() as conn:
            return [r[0] for r in conn.execute(text("SELECT content_sha256 FROM ingest_log WHERE source = 'otlp:/v1/metrics' ORDER BY ingest_id"))]

    before, stored = logged(), api.app.state.store.counts()["gpu_sample"]
    first = httpx.post(api.url + "/v1/metrics", content=gz, headers={**h, "Content-Encoding": "gzip"})
    assert otlp_template.lookup(raw) is not None  # the thread's read left a template: the next read is the loop's
    again = httpx.post(api.url + "/v1/metrics", content=gz, headers={**h, "Content-Encoding": "gzip"})
    plain = httpx.post(api.url + "/v1/metrics", content=raw, headers=h)
    assert [first.status_code, again.status_code, plain.status_code] == [200, 200, 200]
    new = logged()[len(before):]
    assert new == [content_hash(gz, b"protobuf"), content_hash(raw, b"protobuf")]
    assert api.app.state.store.counts()["gpu_sample"] == stored + 8  # the 8 GPUs once, for all three requests
