"""ingest.remote_write: Prometheus remote write 1.0 bodies (https://prometheus.io/docs/specs/remote_write_spec/),
built by Google's protobuf runtime (tests/ingest/rw_proto.py) from real dcgm-exporter scrapes, and hostile
bodies built byte by byte."""

from __future__ import annotations

import random
import struct
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from fleetscope.core.errors import ParseError
from ingest import dcgm, remote_write
from tests.ingest.rw_proto import STALE_NAN, WriteRequest, text_series, write_request

TELEMETRY = Path(__file__).resolve().parents[2].parent / "shared" / "realdata" / "telemetry"
H100 = TELEMETRY / "dcgm-exporter_metrics_8xH100_k8s-pod-labels_sampled_nvidia-aicr.prom"
L4 = TELEMETRY / "dcgm-exporter_metrics_1xL4_default-counters_full_cncf-kops.prom"
L40S = TELEMETRY / "dcgm-exporter_metrics_L40S_helm-default_full_cncf-upcloud.prom"
realdata = pytest.mark.skipif(not TELEMETRY.is_dir(), reason=f"real telemetry fixtures not found at {TELEMETRY} (shared/realdata absent)")

TS = datetime(2026, 3, 10, 12, 0, 0, 250_000, tzinfo=UTC)
TS_MS = int(TS.timestamp() * 1000)
TARGET = {"job": "dcgm-exporter", "instance": "10.0.3.7:9400"}
MiB = 2**20
UUID = "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43"
BASE = {"gpu": "0", "UUID": UUID, "pci_bus_id": "00000000:00:07.0", "device": "nvidia0", "modelName": "NVIDIA L40S", "Hostname": "gpu1-wl8sg"}


def series(name: str, value: float, ts_ms: int = TS_MS, **labels: str) -> tuple[dict, list]:
    return {"__name__": name, **BASE, **TARGET, **labels}, [(value, ts_ms)]


# --- hand-made wire bytes for hostile bodies ------------------------------------------------------------

def v(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def ld(num: int, payload: bytes) -> bytes:
    return v(num << 3 | 2) + v(len(payload)) + payload


def label(name: bytes, value: bytes) -> bytes:
    return ld(1, ld(1, name) + ld(2, value))


def sample(value: float, ts: int) -> bytes:
    return ld(2, b"\x09" + struct.pack("<d", value) + b"\x10" + v(ts))


def ts_bytes(*fields: bytes) -> bytes:
    return ld(1, b"".join(fields))


GOOD = ts_bytes(label(b"UUID", b"GPU-1"), label(b"__name__", b"DCGM_FI_DEV_GPU_TEMP"), sample(41.0, TS_MS))


# --- equal to the text parser ------------------------------------------------------------------------------

@realdata
@pytest.mark.parametrize("path", [H100, L4, L40S], ids=lambda p: p.name.split("_")[2])
def test_same_series_give_the_same_frames_as_the_text_parser(path: Path):
    body = path.read_bytes()
    text = dcgm.parse(body, source="scrape", ts=TS)
    rw = remote_write.parse(write_request(text_series(body.decode(), TS_MS, TARGET)), source="scrape")
    for frame in ("gpu_sample", "gpu", "gpu_workload", "health_event", "metric_sample"):
        a, b = getattr(text, frame), getattr(rw, frame)
        assert (a is None) == (b is None), frame
        if a is not None:
            assert_frame_equal(a, b)
    assert rw.values() == text.values()
    assert rw.meta["target_labels_dropped"] == ["instance", "job"]


@realdata
def test_real_values_and_units_from_an_l4_scrape():
    b = remote_write.parse(write_request(text_series(L4.read_text(), TS_MS, TARGET)))
    g = b.gpu_sample.row(0, named=True)
    assert g["gpu_uuid"] == "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c" and g["ts"] == TS
    assert g["power_w"] == pytest.approx(16.365)
    assert g["energy_j"] == pytest.approx(4742776 / 1000)  # mJ -> J
    assert g["fb_free_bytes"] == 22563 * MiB and g["fb_used_bytes"] == 0  # MiB -> bytes; a zero value is left out of the wire
    assert g["temp_c"] == 31 and g["sm_clock_mhz"] == 210
    assert b.gpu.row(0, named=True)["host"] == "i-030791dc5a37cd257"


@realdata
def test_pod_attribution_from_an_8xh100_scrape():
    b = remote_write.parse(write_request(text_series(H100.read_text(), TS_MS, TARGET)))
    assert b.gpu_sample.height == 8
    assert b.gpu_workload.to_dicts() == [
        {"ts": TS, "gpu_uuid": "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005", "namespace": "dynamo-workload",
         "pod": "vllm-agg-0-vllmdecodeworker-s65j5", "container": "main"}
    ]


# --- what senders add and drop ------------------------------------------------------------------------------

def test_samples_over_time_are_rows_per_timestamp():
    req = write_request([({"__name__": "DCGM_FI_DEV_POWER_USAGE", **BASE}, [(100.5, TS_MS), (101.5, TS_MS + 15_000)]),
                         ({"__name__": "DCGM_FI_DEV_GPU_TEMP", **BASE}, [(50.0, TS_MS), (51.0, TS_MS + 15_000)])])
    b = remote_write.parse(req)
    assert b.gpu_sample.select("ts", "power_w", "temp_c").rows() == [(TS, 100.5, 50), (datetime(2026, 3, 10, 12, 0, 15, 250_000, tzinfo=UTC), 101.5, 51)]


def test_staleness_markers_and_non_finite_values_are_dropped_and_counted():
    req = write_request([series("DCGM_FI_DEV_GPU_TEMP", 40.0), series("DCGM_FI_DEV_POWER_USAGE", STALE_NAN),
                         series("DCGM_FI_DEV_SM_CLOCK", float("inf")), series("DCGM_FI_DEV_MEM_CLOCK", float("nan")),
                         series("DCGM_FI_DEV_FB_USED", float(0x7FFFFFF0))])  # DCGM_INT32_BLANK
    b = remote_write.parse(req)
    row = b.gpu_sample.row(0, named=True)
    assert row["temp_c"] == 40 and row["power_w"] is None and row["sm_clock_mhz"] is None and row["fb_used_bytes"] is None
    assert b.meta["stale_markers_dropped"] == 1
    assert b.meta["non_finite_dropped"] == 2
    assert b.meta["dcgm_blank_dropped"] == 1


def test_a_series_of_only_staleness_markers_writes_nothing():
    b = remote_write.parse(write_request([series("DCGM_FI_DEV_GPU_TEMP", STALE_NAN)]))
    assert b.gpu_sample.height == 0 and b.values() == 0 and b.meta["stale_markers_dropped"] == 1


def test_exported_labels_are_the_exporters_and_target_labels_do_not_count():
    # honor_labels: false under Kubernetes SD: the exporter's own pod is the target's `pod`, the workload's
    # pod comes back as `exported_pod`.
    workload = {"exported_namespace": "ml", "exported_pod": "trainer-0", "exported_container": "main",
                "namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x7k2p", "container": "nvidia-dcgm-exporter"}
    b = remote_write.parse(write_request([series("DCGM_FI_DEV_GPU_TEMP", 40.0, **workload),
                                          series("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 0.0, cluster="eu-1")]))
    assert b.gpu_workload.select("namespace", "pod", "container").rows() == [("ml", "trainer-0", "main")]
    # a relabelled-in label stays, as a non-standard label does in the text format; job/instance do not
    assert b.metric_sample["series"].to_list() == [f'DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{cluster="eu-1",gpu_uuid="{UUID}"}}']


def test_other_metrics_are_skipped_and_counted_and_metadata_read_past():
    req = write_request([({"__name__": "up", **TARGET}, [(1.0, TS_MS)]), series("DCGM_FI_DEV_GPU_TEMP", 40.0)],
                        metadata=[("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).")])
    b = remote_write.parse(req)
    assert b.meta["skipped_names"] == {"up": 1} and b.meta["skipped_series"] == 1
    assert b.meta["metadata_entries"] == 1 and b.gpu_sample.height == 1


def test_a_metadata_only_request_and_an_empty_body_are_empty_batches():
    assert remote_write.parse(write_request([], metadata=[("x", "y")])).values() == 0
    assert remote_write.parse(b"").values() == 0


def test_dcgm_series_without_uuid_names_the_time_series():
    req = write_request([series("DCGM_FI_DEV_GPU_TEMP", 40.0), ({"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "1"}, [(40.0, TS_MS)])])
    with pytest.raises(ParseError, match=r"no UUID label.*timeseries 2"):
        remote_write.parse(req)


# --- unusual but valid encodings take the exact path and mean the same ---------------------------------

def test_unusual_field_order_and_encodings_read_the_same():
    plain = remote_write.parse(GOOD)
    # samples before labels, an overlong tag and length, an unknown field and an exemplar in between
    odd = ld(1, sample(41.0, TS_MS) + label(b"__name__", b"DCGM_FI_DEV_GPU_TEMP") + b"\xa8\x01\x07"
             + ld(3, ld(1, ld(1, b"a") + ld(2, b"b"))) + b"\x8a\x80\x00" + v(len(ld(1, b"UUID") + ld(2, b"GPU-1"))) + ld(1, b"UUID") + ld(2, b"GPU-1"))
    assert_frame_equal(remote_write.parse(odd).gpu_sample, plain.gpu_sample)
    # value 0 left out of the Sample (proto3), and a timestamp before the value
    zero = ts_bytes(label(b"UUID", b"GPU-1"), label(b"__name__", b"DCGM_FI_DEV_GPU_TEMP"), ld(2, b"\x10" + v(TS_MS)))
    assert remote_write.parse(zero).gpu_sample["temp_c"].to_list() == [0]
    swapped = ts_bytes(label(b"UUID", b"GPU-1"), label(b"__name__", b"DCGM_FI_DEV_GPU_TEMP"),
                       ld(2, b"\x10" + v(TS_MS) + b"\x09" + struct.pack("<d", 41.0)))
    assert_frame_equal(remote_write.parse(swapped).gpu_sample, plain.gpu_sample)


def test_columnar_and_exact_paths_mixed_keep_request_order():
    # the second series takes the exact path (samples first); duplicates keep the first in the request
    first = ts_bytes(label(b"UUID", b"GPU-1"), label(b"__name__", b"DCGM_FI_DEV_GPU_TEMP"), sample(41.0, TS_MS))
    second = ld(1, sample(99.0, TS_MS) + label(b"UUID", b"GPU-1") + label(b"__name__", b"DCGM_FI_DEV_GPU_TEMP"))
    assert remote_write.parse(first + second).gpu_sample["temp_c"].to_list() == [41]
    assert remote_write.parse(second + first).gpu_sample["temp_c"].to_list() == [99]


def test_the_protobuf_runtime_reads_what_the_tests_encode():
    req = WriteRequest()
    req.ParseFromString(GOOD)
    assert req.timeseries[0].samples[0].value == 41.0


# --- malformed and hostile --------------------------------------------------------------------------------

def test_every_truncation_is_refused_or_a_shorter_valid_request():
    body = write_request([series("DCGM_FI_DEV_GPU_TEMP", 40.0), series("DCGM_FI_DEV_POWER_USAGE", 70.5)])
    boundaries = set()
    req = WriteRequest()
    req.ParseFromString(body)
    pos = 0
    for ts in req.timeseries:
        pos += len(ld(1, ts.SerializeToString()))
        boundaries.add(pos)
    for cut in range(1, len(body)):
        if cut in boundaries:
            assert remote_write.parse(body[:cut]).gpu_sample.height == 1
        else:
            with pytest.raises(ParseError, match=r"at byte \d+"):
                remote_write.parse(body[:cut])


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"\x0a" + b"\xff" * 11, "varint longer than 10 bytes at byte 1"),
        (b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", r"claims 18446744073709551615 bytes|claims \d+ bytes"),  # a -1 length
        (b"\x0a\x7f" + GOOD[2:], r"claims 127 bytes"),
        (ld(1, b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"), r"Label claims \d+ bytes but only 0 remain"),
        (ts_bytes(label(b"UUID", b"GPU-\xff"), label(b"__name__", b"DCGM_FI_DEV_GPU_TEMP"), sample(1.0, TS_MS)), r"label value is not UTF-8 at byte 16"),
        (ts_bytes(label(b"UU ID", b"x"), label(b"__name__", b"DCGM_FI_DEV_GPU_TEMP"), sample(1.0, TS_MS)), "invalid label name 'UU ID'"),
        (ts_bytes(label(b"", b"x"), label(b"__name__", b"DCGM_FI_DEV_GPU_TEMP"), sample(1.0, TS_MS)), "invalid label name ''"),
        (ts_bytes(label(b"UUID", b"a"), label(b"UUID", b"b"), label(b"__name__", b"X"), sample(1.0, TS_MS)), "label 'UUID' given twice"),
        (ts_bytes(label(b"__name__", b"X"), label(b"__name__", b"Y"), sample(1.0, TS_MS)), "label '__name__' given twice"),
        (ts_bytes(label(b"UUID", b"GPU-1"), sample(1.0, TS_MS)), "no '__name__' label"),
        (ld(1, b""), "no '__name__' label"),
        (ts_bytes(label(b"__name__", b"DCGM FI"), sample(1.0, TS_MS)), "invalid metric name 'DCGM FI'"),
        (ts_bytes(label(b"__name__", b"X"), b"\x11" + b"\x00" * 8), r"field 2 has wire type 1, expected 2"),
        (ts_bytes(label(b"__name__", b"X"), ld(2, b"\x08\x01")), "Sample.value has wire type 0"),
        (ts_bytes(label(b"__name__", b"X"), ld(2, b"\x09" + b"\x00" * 8 + b"\x15\x00\x00\x00\x00")), "Sample.timestamp has wire type 5"),
        (ts_bytes(label(b"__name__", b"X"), ld(2, b"\x09" + b"\x00" * 8 + b"\x10" + b"\xff" * 9 + b"\x7f")), "timestamp overflows int64"),
        (b"\x0b\x0c", "end-group tag of field 1 closes group|field 1 has wire type 3"),
        (b"\x0c", "end-group tag of field 1 without its start"),
        (b"\x0f", "invalid wire type 7"),
        (b"\x00", "invalid field number 0"),
        (b"\x1b" * 200 + b"\x1c" * 200, r"groups nested deeper than 100"),
        (b"\x1a\x02\x0a\x05", r"claims 5 bytes"),  # malformed metadata
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_malformed_bodies_are_refused_naming_what_and_where(body: bytes, match: str):
    with pytest.raises(ParseError, match=match):
        remote_write.parse(body)


@pytest.mark.parametrize("ts_ms", [-1, -(2**63), 253_402_300_800_000])
def test_timestamps_outside_years_1970_to_9999_are_refused(ts_ms: int):
    with pytest.raises(ParseError, match=r"outside 1970\.\.9999 \(timeseries 1\)"):
        remote_write.parse(write_request([series("DCGM_FI_DEV_GPU_TEMP", 40.0, ts_ms)]))


def test_a_large_request_reads_every_value():
    rows = [({"__name__": name, **BASE, "UUID": f"GPU-{g}", **TARGET}, [(float(g), TS_MS)])
            for g in range(500) for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED")]
    b = remote_write.parse(write_request(rows))
    assert b.gpu_sample.height == 500 and b.values() == 1500
    g = b.gpu_sample.filter(pl.col("gpu_uuid") == "GPU-321").row(0, named=True)
    assert g["temp_c"] == 321 and g["power_w"] == 321.0 and g["fb_used_bytes"] == 321 * MiB


def _exact_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_write._Reader, "_columnar", lambda self, start, stop: np.ones(len(start), dtype=bool))


@pytest.mark.parametrize("seed", range(6))
def test_columnar_and_exact_paths_give_the_same_batch(seed: int, monkeypatch: pytest.MonkeyPatch):
    """Varied requests (zero values left out of the wire, stale markers, several samples, workload and
    relabelled labels, escapes, long lengths, non-DCGM series) read the same by both paths."""
    rng = random.Random(seed)
    names = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS",
             "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_PROF_SM_ACTIVE", "up", "node_load1"]
    rows = []
    for g in range(rng.randint(1, 40)):
        labels = {**BASE, "UUID": f"GPU-{seed}-{g}", **TARGET}
        if rng.random() < 0.3:
            labels.update(exported_pod=f"job-{g}", pod="dcgm-exporter-abc", namespace="ml")
        if rng.random() < 0.2:
            labels["cluster"] = 'eu "1"\\\n' + "x" * rng.randint(0, 300)
        for name in rng.sample(names, rng.randint(1, len(names))):
            samples = [(rng.choice([0.0, 1.0, 79.0, 312.5, STALE_NAN, float("nan"), 2.0**47]), TS_MS + 1000 * k) for k in range(rng.randint(1, 3))]
            rows.append(({"__name__": name, **labels}, samples))
    rng.shuffle(rows)
    body = write_request(rows)
    columnar = remote_write.parse(body)
    _exact_only(monkeypatch)
    exact = remote_write.parse(body)
    for frame in ("gpu_sample", "gpu", "gpu_workload", "health_event", "metric_sample"):
        a, b = getattr(columnar, frame), getattr(exact, frame)
        assert (a is None) == (b is None), frame
        if a is not None:
            assert_frame_equal(a, b)
    assert columnar.meta == exact.meta


SERVING = Path(__file__).resolve().parents[2].parent / "shared" / "realdata" / "serving"


@pytest.mark.skipif(not SERVING.is_dir(), reason=f"real serving fixtures not found at {SERVING}")
@pytest.mark.parametrize("name", ["vllm-v0_metrics_Llama-3.1-8B-FP8_kubeai-mock.prom", "sglang_metrics_Llama-3.1-8B_overload_docs-example.prom",
                                  "huggingface-tgi_metrics_datadog-fixture.prom"])
def test_inference_server_series_give_the_serving_frames_of_their_text(name: str):
    from ingest import serving_metrics

    text = (SERVING / name).read_text()
    server = {"vllm": "vllm", "sglang": "sglang", "huggingface": "tgi"}[name.split("-")[0].split("_")[0]]
    body = write_request(text_series(text, TS_MS, TARGET) + [series("DCGM_FI_DEV_GPU_TEMP", 41.0)])
    rw = remote_write.parse(body, source="prom")
    want = serving_metrics.parse(text.encode(), server=server, source="prom", ts=TS)
    for frame in ("serving_bucket", "serving_counter", "serving_gauge"):
        a, b = getattr(rw, frame), getattr(want, frame)
        key = list(a.columns[:8]) if frame == "serving_bucket" else list(a.columns[:7])
        assert_frame_equal(a.sort(key), b.sort(key), check_row_order=False), frame
    assert rw.gpu_sample["temp_c"].to_list() == [41.0]  # the dcgm series beside them still map as before
    assert rw.meta["serving_samples"] > 0 and rw.meta["serving"]["server"] == server
