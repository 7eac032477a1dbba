"""The OTLP protobuf wire path (ingest.otlp.parse) against the message path (from_request over upb's
decode): the same Batch for every request, the same refusal for every malformed body."""

from __future__ import annotations

import math
import random
import struct

import polars as pl
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from polars.testing import assert_frame_equal

from fleetscope.core.errors import ParseError
from ingest import otlp

TS = 1_772_366_400_000_000_000
FRAMES = ("gpu_sample", "gpu", "health_event", "gpu_workload", "collective", "metric_sample")


def kv(key: str, value) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def dcgm_labels(i: int, **extra) -> list[KeyValue]:
    """dcgm-exporter's labels as the Collector's prometheus receiver forwards them."""
    labels = {"gpu": str(i % 8), "UUID": f"GPU-{i:08x}-69c4-b61d-e0bc-{i:012x}", "pci_bus_id": f"00000000:{0x18 + i % 8:02X}:00.0",
              "device": f"nvidia{i % 8}", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": f"node-{i // 8:03d}", **extra}
    return [kv(k, v) for k, v in labels.items() if v is not None]


def add_metric(sm, name: str, points: list[tuple], kind: str = "gauge", start_ns: int = 0):
    """points: (time ns, value or None, attribute KeyValues); ints go out as as_int."""
    m = sm.metrics.add()
    m.name = name
    data = getattr(m, kind)
    data.SetInParent()
    if kind == "sum":
        data.aggregation_temporality = 2
        data.is_monotonic = True
    for ts, value, attrs in points:
        dp = data.data_points.add()
        if ts:
            dp.time_unix_nano = ts
        if start_ns:
            dp.start_time_unix_nano = start_ns
        if isinstance(value, int):
            dp.as_int = value
        elif value is not None:
            dp.as_double = value
        dp.attributes.extend(attrs)
    return m


def scrape(gpus: int = 16, fields=("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS"),
           ts: int = TS, value=lambda i, f: float((i * 7 + f * 13) % 97), resource=None, **kw) -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    for k, v in (resource or {"service.name": "dcgm-exporter"}).items():
        rm.resource.attributes.append(kv(k, v))
    sm = rm.scope_metrics.add()
    for f, name in enumerate(fields):
        add_metric(sm, name, [(ts, value(i, f), dcgm_labels(i)) for i in range(gpus)], **kw)
    return req


def assert_same(a, b) -> None:
    assert a.meta == b.meta
    for name in FRAMES:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert_frame_equal(x, y, check_exact=True)


def both(body: bytes):
    """(wire path, message path) outcomes: a Batch or the ParseError."""
    out = []
    for run in (lambda: otlp.parse(body, encoding="protobuf"),
                lambda: otlp.from_request(otlp.decode(body, encoding="protobuf"))):
        try:
            out.append(run())
        except ParseError as exc:
            out.append(exc)
    return out


def check(req_or_body) -> object:
    body = req_or_body if isinstance(req_or_body, bytes) else req_or_body.SerializeToString()
    wire, message = both(body)
    if isinstance(message, ParseError):
        assert isinstance(wire, ParseError), f"wire path took a body upb refuses: {message}"
        return wire
    assert not isinstance(wire, ParseError), f"wire path refused a body upb reads: {wire}"
    assert_same(wire, message)
    return wire


@pytest.fixture(autouse=True)
def small_metrics_on_the_wire(monkeypatch):
    """The requests here are small; the wire path must read them as it reads a fleet's."""
    monkeypatch.setattr(otlp, "_WIRE_MIN_BYTES", 0)


@pytest.fixture
def wire_only(monkeypatch):
    """Fail if a metric leaves the wire path."""
    def refuse(metric, data, source):
        raise AssertionError("a GPU metric went to the message path")
    monkeypatch.setattr(otlp, "_real_metric", refuse)


def test_scrape_is_read_on_the_wire_with_real_values(wire_only):
    batch = check(scrape())
    gs = batch.gpu_sample
    assert gs.height == 16 and batch.meta["accepted_points"] == 64 and batch.meta["rejected_points"] == 0
    row = gs.filter(pl.col("gpu_uuid") == "GPU-00000003-69c4-b61d-e0bc-000000000003").row(0, named=True)
    assert row["temp_c"] == 21.0 and row["power_w"] == 34.0 and row["fb_used_bytes"] == 47 * 2**20
    assert row["ts"].timestamp() == TS / 1e9
    assert batch.gpu.row(3) == ("GPU-00000003-69c4-b61d-e0bc-000000000003", "node-000", "NVIDIA H100 80GB HBM3", "00000000:1B:00.0")
    # DCGM_FI_DEV_XID_ERRORS (field 3) is (i*7 + 39) % 97: every GPU's value is an XID health event
    xid = batch.health_event.filter(pl.col("kind") == "xid").sort("gpu_uuid")
    assert xid["code"].to_list() == [(i * 7 + 39) % 97 for i in range(16)]


def test_ints_start_times_and_sums_stay_on_the_wire(wire_only):
    check(scrape(value=lambda i, f: (i * 1000 + f) if i % 3 else float(i), kind="sum", start_ns=TS - 10**9))
    check(scrape(value=lambda i, f: -(2**40) - i, start_ns=TS - 10**9))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, None, 0.0, -0.0, 1e308, 5e-324])
def test_odd_values(value):
    req = scrape(gpus=4)
    dp = req.resource_metrics[0].scope_metrics[0].metrics[1].gauge.data_points[2]
    dp.ClearField("as_double")
    if value is not None:
        dp.as_double = value
    check(req)


def test_values_an_integer_column_cannot_hold_are_rejected_not_a_crash():
    big = {0: 2.0**53, 3: 1e300, 5: -(2.0**63) / 2**20}  # FB_USED in MiB: 2**53 MiB is past int64 bytes
    req = scrape(gpus=8, fields=("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_POWER_USAGE"),
                 value=lambda i, f: big.get(i, 7.0) if f < 2 else 1e300)
    batch = check(req)
    assert batch.meta["rejected_reasons"] == {"value out of range for fb_used_bytes (DCGM_FI_DEV_FB_USED)": 2,
                                              "value out of range for xid_last (DCGM_FI_DEV_XID_ERRORS)": 1}
    assert batch.gpu_sample.sort("gpu_uuid")["fb_used_bytes"].to_list() == [None, 7 * 2**20, 7 * 2**20, None, 7 * 2**20, -(2**63), 7 * 2**20, 7 * 2**20]
    assert batch.gpu_sample["power_w"].to_list() == [1e300] * 8  # a float column takes it


def test_rejections_count_in_the_order_they_come():
    req = scrape(gpus=6)
    pts = req.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points
    pts[1].as_double = math.nan
    pts[2].ClearField("time_unix_nano")
    del pts[3].attributes[1]  # UUID gone
    pts[4].as_double = math.inf
    batch = check(req)
    assert list(batch.meta["rejected_reasons"]) == ["non-finite value (DCGM_FI_DEV_GPU_TEMP)", "data point without a timestamp (DCGM_FI_DEV_GPU_TEMP)",
                                                    "GPU metric without a GPU id attribute (DCGM_FI_DEV_GPU_TEMP)"]
    assert batch.meta["rejected_points"] == 4


def test_repeated_points_last_wins_and_gpus_differ_by_metric():
    req = scrape(gpus=5)
    sm = req.resource_metrics[0].scope_metrics[0]
    add_metric(sm, "DCGM_FI_DEV_GPU_TEMP", [(TS, 99.0, dcgm_labels(2)), (TS + 10**9, 50.0, dcgm_labels(9)), (TS, 98.0, dcgm_labels(2))])
    add_metric(sm, "dcgm_fi_dev_gpu_util", [(TS, 40, dcgm_labels(1))])  # lower case: the SDK's spelling
    batch = check(req)
    t = batch.gpu_sample.filter(pl.col("gpu_uuid") == "GPU-00000002-69c4-b61d-e0bc-000000000002")
    assert t["temp_c"].to_list() == [98.0]
    assert batch.gpu_sample.height == 6


def test_label_sets_that_leave_the_plain_form():
    for extra in ({"pod": "trainer-0", "namespace": "ml", "container": "main"},
                  {"pod": "dcgm-exporter-abc", "namespace": "gpu-operator"},
                  {"uuid": "GPU-lower"},  # two id attributes: where the id is read depends on the point before
                  {"UUID": "GPU-dup"},  # the same key twice
                  {"UUID": ""},
                  {"gpu": 3},  # an int attribute
                  {"healthy": True},
                  {"k8s.pod.name": "p", "k8s.namespace.name": "n"}):
        req = ExportMetricsServiceRequest()
        sm = req.resource_metrics.add().scope_metrics.add()
        for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"):
            add_metric(sm, name, [(TS, float(i), dcgm_labels(i, **(extra if i % 2 else {}))) for i in range(6)])
        check(req)
    req = ExportMetricsServiceRequest()
    sm = req.resource_metrics.add().scope_metrics.add()
    add_metric(sm, "DCGM_FI_DEV_GPU_TEMP", [(TS, 1.0, [kv("UUID", "GPU-x"), KeyValue(key="empty")]), (TS, 2.0, [kv("UUID", "GPU-y"), kv("arr", "a")])])
    sm.metrics[0].gauge.data_points[1].attributes[1].value.array_value.values.add(string_value="a")
    check(req)


def test_hw_semconv_inspector_and_series_metrics():
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.extend([kv("host.name", "node-7"), kv("slurm.job.id", "4242"), kv("gpu", "res-gpu")])
    sm = rm.scope_metrics.add()
    gpu = [kv("hw.id", "GPU-a"), kv("hw.type", "gpu"), kv("hw.model", "H200")]
    add_metric(sm, "hw.gpu.utilization", [(TS, 0.5, gpu)])
    add_metric(sm, "hw.gpu.memory.utilization", [(TS, 0.25, gpu)])
    add_metric(sm, "hw.power", [(TS, 400.0, gpu), (TS, 90.0, [kv("hw.id", "psu-1"), kv("hw.type", "power_supply")])])
    add_metric(sm, "hw.temperature", [(TS, 60.0, gpu)])
    add_metric(sm, "hw.energy", [(TS, 10, gpu)], kind="sum")
    coll = [kv(k, v) for k, v in {"node": "n1", "gpu": "GPU0", "comm_id": "0xabc", "nranks": "8", "coll_msg_size_bytes": "1048576",
                                   "collective": "AllReduce", "coll_sn": "17", "algo_proto": "RING_LL"}.items()]
    add_metric(sm, "nccl_bus_bandwidth_gbs", [(TS, 180.5, coll), (TS, 12.0, [kv("message_size", "4-5GB")])])
    add_metric(sm, "nccl_collective_exec_time_microseconds", [(TS, 250, coll)])
    add_metric(sm, "app.requests", [(TS, 3, [kv("route", "/a")]), (TS, 4, [kv("gpu", "x")])], kind="sum")
    add_metric(sm, "DCGM_FI_DEV_GPU_TEMP", [(TS, 55.0, dcgm_labels(0))])
    sm.metrics.add(name="empty")
    h = sm.metrics.add(name="latency")
    h.histogram.data_points.add(count=3)
    h.histogram.data_points.add(count=1)
    sm.metrics.add(name="quantiles").summary.data_points.add(count=2)
    g = sm.metrics.add(name="DCGM_FI_DEV_SM_CLOCK")
    g.gauge.SetInParent()  # a gauge without points
    sm2 = rm.scope_metrics.add()
    add_metric(sm2, "DCGM_FI_DEV_GPU_TEMP", [(TS + 10**9, 56.0, dcgm_labels(0))])
    rm2 = req.resource_metrics.add()
    rm2.resource.attributes.append(kv("k8s.node.name", "node-9"))
    add_metric(rm2.scope_metrics.add(), "DCGM_FI_DEV_GPU_TEMP", [(TS, 57.0, [kv("UUID", "GPU-nohost")])])
    batch = check(req)
    assert batch.collective.height == 1 and batch.collective["duration_s"].to_list() == [250e-6]
    assert batch.gpu.filter(pl.col("gpu_uuid") == "GPU-nohost")["host"].to_list() == ["node-9"]
    assert batch.meta["rejected_reasons"]["histogram metrics are not stored (latency)"] == 2


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _field(num: int, wt: int, payload: bytes) -> bytes:
    return _varint(num << 3 | wt) + (_varint(len(payload)) if wt == 2 else b"") + payload


def _point(parts: list[bytes]) -> bytes:
    return _field(1, 2, b"".join(parts))


def _request_of(points: list[bytes], name: bytes = b"DCGM_FI_DEV_GPU_TEMP", data_field: int = 5) -> bytes:
    metric = _field(1, 2, name) + _field(data_field, 2, b"".join(points))
    return _field(1, 2, _field(2, 2, _field(2, 2, metric)))


def test_field_orders_other_than_the_serializers():
    attrs = b"".join(_field(7, 2, kvm.SerializeToString()) for kvm in dcgm_labels(1))
    t = _field(3, 1, struct.pack("<Q", TS))
    v = _field(4, 1, struct.pack("<d", 42.0))
    i = _field(6, 1, struct.pack("<q", 7))
    st = _field(2, 1, struct.pack("<Q", TS - 1))
    flags = _field(8, 0, b"\x01")
    for parts in ([attrs, t, v], [t, attrs, v], [v, t, attrs], [t, v, i, attrs], [t, v, attrs, flags], [t, t, v, attrs],
                  [t, v, attrs, _field(3, 1, struct.pack("<Q", TS + 5))], [st, t, v, attrs], [t, st, v, attrs], [t, v], [v, attrs], [t, attrs],
                  [t, v, attrs, _field(99, 2, b"unknown")], [t, v, _field(5, 2, b"")]):
        body = _request_of([_point(parts), _point([t, v, attrs])])
        check(body)
        check(_request_of([_point(parts)], data_field=7))


def test_metric_with_two_data_fields_is_read_as_upb_reads_it():
    t = _field(3, 1, struct.pack("<Q", TS))
    v = _field(4, 1, struct.pack("<d", 42.0))
    attrs = b"".join(_field(7, 2, kvm.SerializeToString()) for kvm in dcgm_labels(1))
    good = _point([t, v, attrs])
    bad = _field(1, 2, b"\x1a\x05ab")  # a point that claims more bytes than it has
    metric = _field(1, 2, b"DCGM_FI_DEV_GPU_TEMP") + _field(7, 2, bad) + _field(5, 2, good)
    wire = check(_field(1, 2, _field(2, 2, _field(2, 2, metric))))
    assert isinstance(wire, ParseError)
    metric = _field(1, 2, b"DCGM_FI_DEV_GPU_TEMP") + _field(5, 2, good) + _field(5, 2, good)
    check(_field(1, 2, _field(2, 2, _field(2, 2, metric))))


def test_mutated_bodies_agree_with_upb():
    """Byte flips, truncations and insertions of a small scrape: both paths read the same Batch or both
    refuse."""
    rng = random.Random(20261129)
    base = scrape(gpus=12, fields=("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "hw.power", "app.x"), start_ns=TS - 5).SerializeToString()
    refused = 0
    for _ in range(400):
        body = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            op = rng.random()
            at = rng.randrange(len(body))
            if op < 0.6:
                body[at] = rng.randrange(256)
            elif op < 0.8:
                del body[at:at + rng.randint(1, 4)]
            else:
                body[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
        refused += isinstance(check(bytes(body)), ParseError)
    assert 50 < refused < 400  # both kinds of outcome were exercised


@pytest.mark.parametrize(("body", "says"), [
    (b"\x0a", "truncated varint at byte 1"),
    (b"\x0a\x80", "truncated varint at byte 1"),
    (b"\x0a\x05\x12\x03", "field 1 claims 5 bytes but only 2 remain in its message at byte 0"),
    (b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\x7f", "claims"),
    (b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "varint longer than 10 bytes at byte 1"),
    (b"\x0f", "invalid wire type 7 for field 1 at byte 0"),
    (b"\x0c", "end-group tag of field 1 without its start at byte 0"),
    (b"\x0b\x10\x01", "group 1 has no end-group tag"),
    (b"\x00", "invalid field number 0 at byte 0"),
    (b"\x09\x01\x02", "field 1 is a truncated 64-bit value at byte 0"),
    (_request_of([_point([_field(3, 1, b"\x01\x02")])]), "field 3 is a truncated 64-bit value at byte 32 (in request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0])"),
    (_request_of([]).replace(b"DCGM", b"\xffCGM"), "invalid UTF-8 in a string at byte 8 (in request.resource_metrics[0].scope_metrics[0].metrics[0].name)"),
])
def test_malformed_bodies_name_what_and_where(body, says):
    with pytest.raises(ParseError, match="not an OTLP protobuf ExportMetricsServiceRequest") as exc:
        otlp.parse(body, encoding="protobuf")
    assert says in str(exc.value)
    with pytest.raises(ParseError) as exc2:
        otlp.decode(body, encoding="protobuf")
    assert says in str(exc2.value)


def test_deep_nesting_and_random_bytes_are_refused_quickly():
    deep = b""
    for _ in range(300):  # AnyValue.kvlist_value -> KeyValueList.values -> KeyValue.value -> ...
        deep = _field(6, 2, _field(1, 2, _field(2, 2, deep)))
    attr = _field(7, 2, _field(1, 2, b"k") + _field(2, 2, deep))
    body = _request_of([_point([_field(3, 1, struct.pack("<Q", TS)), _field(4, 1, struct.pack("<d", 1.0)), attr])])
    with pytest.raises(ParseError, match="nested"):
        otlp.parse(body, encoding="protobuf")
    rng = random.Random(7)
    for _ in range(200):
        check(bytes(rng.randrange(256) for _ in range(rng.randint(1, 200))))
    check(b"")  # an empty request is a valid one


def test_label_sets_of_one_length_with_different_shapes():
    """Sets of one byte length are decoded as fixed columns of a template; sets of another shape, and
    every odd value, must come out as upb reads them."""
    def labels(i: int) -> list[KeyValue]:
        shape = i % 6
        if shape == 0:
            return dcgm_labels(i)
        if shape == 1:
            return dcgm_labels(i, Hostname=f"nöd-{i // 8:03d}")  # two bytes for ö: same byte length as node-000
        if shape == 2:
            return [kv("uuid" if i % 4 else "UUID", f"GPU-{i:04d}"), kv("x", "\x00" * (i % 3) + "ab"[: 2 - i % 3])]
        if shape == 3:
            return [kv("UUID", f"GPU-{i:04d}"), kv("UUID", f"GPU-{i + 1:04d}")]  # the same key twice
        if shape == 4:
            return [kv("UUID", ""), kv("hw.id", f"GPU-{i:04d}")]
        return [kv("hw.type", "gpu"), kv("hw.id", f"GPU-{i:04d}")]

    req = ExportMetricsServiceRequest()
    sm = req.resource_metrics.add().scope_metrics.add()
    for name in ("DCGM_FI_DEV_GPU_TEMP", "hw.power", "DCGM_FI_DEV_POWER_USAGE"):
        add_metric(sm, name, [(TS, float(i), labels(i)) for i in range(96)])
    check(req)
    only_plain = ExportMetricsServiceRequest()
    sm = only_plain.resource_metrics.add().scope_metrics.add()
    add_metric(sm, "DCGM_FI_DEV_GPU_TEMP", [(TS, float(i), labels(i)) for i in range(96) if i % 6 in (0, 1)])
    body = only_plain.SerializeToString()
    check(body)
    bad = body.replace("nöd-001".encode(), b"n\xc3\x28d-001")  # an invalid UTF-8 sequence inside a templated value
    assert bad != body
    assert isinstance(check(bad), ParseError)
    bad_key = body.replace(b"Hostname", b"Hostn\xffme")  # and inside a key
    assert isinstance(check(bad_key), ParseError)


def test_many_small_metrics_take_the_message_path_and_agree(monkeypatch):
    monkeypatch.setattr(otlp, "_WIRE_MIN_BYTES", 4096)
    req = ExportMetricsServiceRequest()
    sm = req.resource_metrics.add().scope_metrics.add()
    for i in range(300):
        for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"):
            add_metric(sm, name, [(TS, float(i), dcgm_labels(i))])
    add_metric(sm, "DCGM_FI_DEV_GPU_TEMP", [(TS + 10**9, float(i), dcgm_labels(i)) for i in range(64)])  # over 4 KiB: wire
    batch = check(req)
    assert batch.gpu_sample.height == 364 and batch.meta["accepted_points"] == 664
